"""Git as the only durable state: commit status files, and nothing else, after a pass.

Commits are made through a temporary index (read HEAD's tree, add the status paths, write a tree,
commit it, move the branch with a compare-and-swap), so whatever the user has staged or left
modified elsewhere in the checkout is never swept into a reconciler commit. The commit includes
every status file that differs from HEAD, not only those written by this pass: a pass killed after
writing and before committing loses nothing.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import git

from .errors import TemporaryError

STATUS_DIR = "status"


@dataclass
class Author:
    name: str
    email: str


def open_repo(path: Path) -> git.Repo | None:
    try:
        return git.Repo(path, search_parent_directories=False)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return None


def head(repo: git.Repo | None) -> str | None:
    if repo is None:
        return None
    try:
        return repo.head.commit.hexsha
    except ValueError:  # no commits yet
        return None


def dirty_status_paths(repo: git.Repo) -> list[str]:
    """status/*.yaml paths that differ from HEAD (modified, new or deleted)."""
    out = repo.git.status("--porcelain", "--untracked-files=all", "--", STATUS_DIR)
    paths = []
    for line in out.splitlines():
        path = line[3:].strip().strip('"')
        if " -> " in path:
            path = path.split(" -> ", 1)[1]
        if path.startswith(STATUS_DIR + "/") and path.endswith(".yaml"):
            paths.append(path)
    return sorted(set(paths))


def commit_status(repo: git.Repo, message: str, author: Author) -> str | None:
    """Commit the status files that differ from HEAD; return the new commit, or None if nothing."""
    paths = dirty_status_paths(repo)
    if not paths:
        return None
    parent = head(repo)
    fd, index_path = tempfile.mkstemp(prefix="reconciler-index-", dir=repo.git_dir)
    os.close(fd)
    os.unlink(index_path)
    env = {
        "GIT_INDEX_FILE": index_path,
        "GIT_AUTHOR_NAME": author.name, "GIT_AUTHOR_EMAIL": author.email,
        "GIT_COMMITTER_NAME": author.name, "GIT_COMMITTER_EMAIL": author.email,
    }
    g = repo.git
    try:
        if parent:
            g.read_tree(parent, env=env)
        g.update_index("--add", "--remove", "--", *paths, env=env)
        tree = g.write_tree(env=env)
        if parent and tree == repo.commit(parent).tree.hexsha:
            return None
        args = [tree, "-m", message] + (["-p", parent] if parent else [])
        new = g.commit_tree(*args, env=env).strip()
        ref = repo.head.ref.path if not repo.head.is_detached else "HEAD"
        try:
            g.update_ref(ref, new, parent or "0" * 40)
        except git.GitCommandError as e:
            raise TemporaryError(f"the branch moved while committing status; will retry: {e.stderr.strip()}") from None
    finally:
        try:
            os.unlink(index_path)
        except OSError:
            pass
    # The real index now lags HEAD for these paths; align just them, leaving the user's staging alone.
    g.reset("-q", "HEAD", "--", *paths)
    return new


def transitions_message(lines: list[str]) -> str:
    head_line = f"status: {len(lines)} change(s)" if lines else "status: refresh"
    body = "\n".join(f"- {line}" for line in lines[:200])
    if len(lines) > 200:
        body += f"\n- ... and {len(lines) - 200} more"
    return head_line + ("\n\n" + body if body else "") + "\n"

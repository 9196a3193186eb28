"""Which checkout a repository is, and what HEAD is: read from the files git keeps
(gitrepository-layout(5)), so that a pass starts no process and imports no git library for them.

A pass needs three facts of the repository: its working tree, its git directory and HEAD's commit
(and, to commit status, the branch HEAD is on). Every git operation runs the git command
(``repo.py``); where the files say something this reader does not know (another ref storage, a
ref that is neither a commit id nor a symbolic ref), git itself is asked.
"""

from __future__ import annotations

import os
import subprocess

from reconciler.core import procenv


class Checkout:
    """A working tree and its git directory, found by reading ``.git`` (the two facts, and HEAD,
    are all a pass needs of the repository; every git operation runs the git command). The status
    functions below take this or a ``git.Repo``: both have ``working_tree_dir`` and ``git_dir``."""

    __slots__ = ("working_tree_dir", "git_dir")

    def __init__(self, working_tree_dir: str, git_dir: str) -> None:
        self.working_tree_dir, self.git_dir = working_tree_dir, git_dir

    def __repr__(self) -> str:
        return f"Checkout({self.working_tree_dir!r})"


def open_repo(path: str | os.PathLike) -> Checkout | None:
    """The checkout whose top is ``path`` (None when ``path`` is not the top of one): ``.git`` is
    its git directory, or a file naming one (``gitdir: ...``, a linked worktree or a submodule)."""
    top = os.path.abspath(path)
    dotgit = os.path.join(top, ".git")
    if os.path.isfile(dotgit):
        try:
            with open(dotgit, encoding="utf-8") as fh:
                line = fh.read(4096).strip()
        except (OSError, UnicodeDecodeError):
            return None
        if not line.startswith("gitdir:"):
            return None
        dotgit = os.path.normpath(os.path.join(top, line[len("gitdir:"):].strip()))
    return Checkout(top, dotgit) if _is_git_dir(dotgit) else None


def _is_git_dir(d: str) -> bool:
    """What git itself requires of a git directory (setup.c, is_git_directory): HEAD, and objects
    and refs, here or in the common directory a linked worktree's ``commondir`` names."""
    if not os.path.isfile(os.path.join(d, "HEAD")):
        return False
    common = _common_dir(d)
    return os.path.isdir(os.path.join(common, "objects")) and os.path.isdir(os.path.join(common, "refs"))


def _common_dir(git_dir: str) -> str:
    """Where the shared refs live: a linked worktree's ``commondir`` file names it (gitrepository-layout(5))."""
    try:
        with open(os.path.join(git_dir, "commondir"), encoding="utf-8") as fh:
            return os.path.normpath(os.path.join(git_dir, fh.read(4096).strip()))
    except (OSError, UnicodeDecodeError):
        return git_dir


_HEX = frozenset("0123456789abcdef")


def _read_ref(repo, name: str) -> str | None:
    """A ref's content from its file, or from packed-refs (gitrepository-layout(5)); None when absent.
    HEAD and the other per-worktree refs live in the git directory, the rest in the common one."""
    git_dir = str(repo.git_dir)
    base = git_dir if name == "HEAD" or name.startswith(("refs/bisect/", "refs/worktree/")) else _common_dir(git_dir)
    try:
        with open(os.path.join(base, name), encoding="utf-8") as fh:
            return fh.read(4096).strip()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        pass
    try:
        with open(os.path.join(_common_dir(git_dir), "packed-refs"), encoding="utf-8") as fh:
            for line in fh:
                sha, _, ref = line.rstrip("\n").partition(" ")
                if ref == name:
                    return sha
    except FileNotFoundError:
        pass
    return None


def _resolve(repo) -> tuple[str | None, str]:
    """(HEAD's commit or None, the ref HEAD names or "HEAD" when detached), following symbolic
    refs; git's own answer (``rev-parse``) where the files say something this reader does not
    know (another ref storage, say)."""
    name, ref = "HEAD", "HEAD"
    for _ in range(6):  # git follows at most 5 levels of symbolic refs (refs.c, SYMREF_MAXDEPTH)
        content = _read_ref(repo, name)
        if content is None:
            return None, ref  # an unborn branch: no commits yet
        if content.startswith("ref:"):
            name = ref = content[4:].strip()
            continue
        if len(content) in (40, 64) and set(content) <= _HEX:
            return content, ref
        break
    return _git_head(repo)


def _git_head(repo) -> tuple[str | None, str]:
    def git(*args: str) -> str:
        try:
            p = subprocess.run(["git", "-C", str(repo.working_tree_dir), *args], capture_output=True, text=True,
                               timeout=60, env=procenv.for_git(), stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return ""
        return p.stdout.strip() if p.returncode == 0 else ""

    return git("rev-parse", "-q", "--verify", "HEAD^{commit}") or None, git("symbolic-ref", "-q", "HEAD") or "HEAD"


def head(repo) -> str | None:
    """HEAD's commit (None: no repository, or no commit yet), read from the ref files: no process."""
    if repo is None:
        return None
    try:
        return _resolve(repo)[0]
    except (OSError, UnicodeDecodeError, ValueError):
        return _git_head(repo)[0]


def head_ref(repo) -> str:
    """The branch HEAD is on (``refs/heads/...``), or "HEAD" when it is detached."""
    try:
        return _resolve(repo)[1]
    except (OSError, UnicodeDecodeError, ValueError):
        return _git_head(repo)[1]

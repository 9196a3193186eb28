"""Signed status commits where the checkout's git signs its commits.

A status commit is written by ``git fast-import`` (repo.py), and fast-import writes its commits
unsigned whatever ``commit.gpgSign`` says (git-fast-import(1) makes no signature). Where the operator set
``commit.gpgSign`` (a branch protected by "require signed commits" refuses the push of an unsigned
one), the commit fast-import made is written again by ``git commit-tree -S`` with the same tree,
parent, author and message, so the key, the format (``gpg.format``: openpgp, ssh, x509) and the
program are git's own choice, as for any ``git commit``.

Whether to sign is a ``git config`` process. It runs again only when a file the setting can come
from changed (the repository's, the user's and the system's config files, by inode, size and
mtime) or when git's own config variables in the environment did, so a daemon's status commits
start no extra process in the common case. A setting reached through ``include.path`` is read
again when one of those files changes, or when the process restarts.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

_seen: dict[str, tuple[tuple, bool]] = {}  # checkout → (what the setting was read from, signs)


def _sources(git_dir: str) -> tuple:
    """Everything the setting is read from, as a comparable value: the config files' stat data and
    the environment variables git reads its configuration from (git-config(1), FILES and
    ENVIRONMENT)."""
    home = os.environ.get("HOME", "")
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    files = [os.path.join(git_dir, "config"), os.path.join(git_dir, "config.worktree"),
             os.environ.get("GIT_CONFIG_GLOBAL") or os.path.join(home, ".gitconfig"),
             os.path.join(xdg, "git", "config"), os.environ.get("GIT_CONFIG_SYSTEM") or "/etc/gitconfig"]
    common = os.path.join(git_dir, "commondir")  # a linked worktree's config is its main repository's
    if os.path.isfile(common):
        try:
            files.append(os.path.join(git_dir, Path(common).read_text().strip(), "config"))
        except OSError:
            pass
    stats = []
    for f in files:
        try:
            st = os.stat(f)
            stats.append((f, st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            stats.append((f, None))
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("GIT_CONFIG")))
    return tuple(stats), env


def signs(root: Path, git_dir: str, env: dict[str, str]) -> bool:
    """Whether ``git commit`` in the checkout at ``root`` would sign (``commit.gpgSign``)."""
    key = _sources(git_dir)
    kept = _seen.get(git_dir)
    if kept is not None and kept[0] == key:
        return kept[1]
    p = subprocess.run(["git", "-C", str(root), "config", "--type=bool", "--get", "commit.gpgsign"],
                       capture_output=True, text=True, env=env, timeout=30, stdin=subprocess.DEVNULL)
    answer = p.returncode == 0 and p.stdout.strip() == "true"
    _seen[git_dir] = (key, answer)
    return answer


def sign(root: Path, unsigned: str, parent: str | None, message: bytes, env: dict[str, str]) -> str:
    """The commit ``unsigned`` written again, signed: same tree, parent and message; the author and
    committer from ``env`` (GIT_AUTHOR_* and GIT_COMMITTER_*, set to the reconciler's identity)."""
    args = ["git", "-C", str(root), "commit-tree", "-S", f"{unsigned}^{{tree}}"] + (["-p", parent] if parent else [])
    try:
        p = subprocess.run(args, input=message, capture_output=True, env=env, timeout=120)
    except subprocess.TimeoutExpired:
        raise SigningError("git commit-tree -S timed out after 120s (a passphrase prompt?)") from None
    if p.returncode != 0:
        raise SigningError("commit.gpgSign is set but the status commit could not be signed: "
                           + p.stderr.decode("utf-8", "replace").strip()[:500])
    return p.stdout.decode().strip()


class SigningError(Exception):
    """Signing failed (no key, no agent, a passphrase asked for); raised as the caller's GitError."""

"""Code pins: stage upstream code at one exact commit into a bundle's ``inputs/<code.path>``.

A run's ``spec.code`` names a repository (a URL, or a path on the reconciler host) and a 40-hex
commit. At bundle build the repository is cloned and checked out at that commit, the checkout is
verified (HEAD is the commit, the tree is clean) and ``.git`` is dropped, so the staged files are
exactly the commit's tree and the bundle's digest is the same for every build of the same spec.

Refused, with a :class:`PermanentError` (fix the spec or the repository; retrying cannot help):

- a local repository whose working tree is dirty (uncommitted or untracked files): what would run is
  not what the commit says, and the person who launched it may believe otherwise;
- a commit that does not exist in the repository, or names something that is not a commit (a tag
  object, a tree, a blob).

A clone that fails for another reason (network, a host that does not answer) is a
:class:`TemporaryError`.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from reconciler.core import procenv
from reconciler.core.errors import PermanentError, TemporaryError

GIT_TIMEOUT = 600.0


def _git(args: list[str], cwd: Path | None = None, timeout: float = GIT_TIMEOUT) -> subprocess.CompletedProcess:
    # procenv's allowlist: a clone of a run's code repository runs that repository's git settings
    # and helpers, and must not see the secrets this process holds.
    env = procenv.for_git({"GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true", "LC_ALL": "C"})
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise TemporaryError(f"git {' '.join(args[:2])} timed out after {timeout:.0f}s") from e
    except OSError as e:
        raise PermanentError(f"git is not available on the reconciler host: {e}") from e


def _local_repo(repo: str) -> Path | None:
    path = Path(repo[len("file://"):] if repo.startswith("file://") else repo).expanduser()
    return path if path.is_dir() else None


def check_clean(path: Path) -> None:
    r = _git(["status", "--porcelain", "--untracked-files=normal"], cwd=path, timeout=120)
    if r.returncode != 0:
        raise PermanentError(f"code.repo {path} is not a git repository: {r.stderr.strip()[:200]}")
    dirty = [line[3:] for line in r.stdout.splitlines() if line.strip()]
    if dirty:
        shown = ", ".join(dirty[:5]) + (f" and {len(dirty) - 5} more" if len(dirty) > 5 else "")
        raise PermanentError(f"code.repo {path} has a dirty working tree ({shown}); commit or remove the changes: "
                             "a run pinned to a commit must run exactly that commit")


def tree_digest(root: Path) -> tuple[str, int, int]:
    """sha256 over (relative path, file sha256) of every file, sorted; with the file count and size."""
    h = hashlib.sha256()
    files = size = 0
    for p in sorted(q for q in root.rglob("*") if q.is_file() and not q.is_symlink()):
        data = p.read_bytes()
        files += 1
        size += len(data)
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest(), files, size


def stage(code, dest: Path) -> dict:
    """Clone ``code.repo`` at ``code.commit`` into ``dest`` (which must not exist); return its record."""
    local = _local_repo(code.repo)
    if local is not None:
        check_clean(local)
    dest.parent.mkdir(parents=True, exist_ok=True)
    r = _git(["clone", "--quiet", "--no-checkout", str(local) if local else code.repo, str(dest)])
    if r.returncode != 0:
        err = r.stderr.strip()[:300]
        if local is not None or "not found" in err.lower() or "does not exist" in err.lower():
            raise PermanentError(f"cannot clone code.repo {code.repo}: {err}")
        raise TemporaryError(f"cannot clone code.repo {code.repo}: {err}")
    kind = _git(["cat-file", "-t", code.commit], cwd=dest, timeout=60)
    if kind.returncode != 0:  # not in the default clone: fetch the commit itself (servers that allow it)
        _git(["fetch", "--quiet", "origin", code.commit], cwd=dest)
        kind = _git(["cat-file", "-t", code.commit], cwd=dest, timeout=60)
    what = kind.stdout.strip()
    if kind.returncode != 0:
        raise PermanentError(f"code.commit {code.commit} does not exist in {code.repo}")
    if what != "commit":
        raise PermanentError(f"code.commit {code.commit} is a {what} in {code.repo}, not a commit")
    r = _git(["-c", "advice.detachedHead=false", "checkout", "--quiet", "--detach", code.commit], cwd=dest)
    if r.returncode != 0:
        raise PermanentError(f"cannot check out {code.commit} of {code.repo}: {r.stderr.strip()[:300]}")
    head = _git(["rev-parse", "HEAD"], cwd=dest, timeout=60).stdout.strip()
    if head != code.commit:
        raise PermanentError(f"checked out {head}, not the pinned {code.commit}")
    check_clean(dest)
    shutil.rmtree(dest / ".git")
    digest, files, size = tree_digest(dest)
    return {"repo": code.repo, "commit": code.commit, "path": f"inputs/{code.path}", "files": files, "size": size,
            "tree_sha256": digest}

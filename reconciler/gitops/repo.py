"""Git as the only durable state: commit status files, and nothing else, after a pass.

Commits are built by ``git fast-import`` from HEAD's tree and the status paths, and the branch is
moved with a compare-and-swap, so whatever the user has staged or left modified elsewhere in the
checkout is never swept into a reconciler commit. The commit includes
every status file that differs from HEAD, not only those written by this pass: a pass killed after
writing and before committing loses nothing. Its message is made from what it holds, so a file
written by an earlier pass (run with --no-commit, or killed before committing) still gets its
transition line, and the counts in a message always match the commit's content.

Git's output is read NUL-separated (``-z``), so a path is never quoted or escaped, and git runs
with ``LC_ALL=C`` wherever its messages are matched.
"""

from __future__ import annotations

import os
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from reconciler.core import procenv
from reconciler.core.errors import TemporaryError

from . import checkout, signing

# Reading the checkout (checkout.py), offered here beside what is done with it.
Checkout, open_repo, head, head_ref = checkout.Checkout, checkout.open_repo, checkout.head, checkout.head_ref

STATUS_DIR = "status"


@dataclass
class Author:
    name: str
    email: str


def dirty_paths(root: Path) -> tuple[list[str], list[str]]:
    """The status files (status/<name>.yaml) and the ledger's files (status/README.md,
    status/<run>.svg) that differ from HEAD (modified, new or deleted), from one ``git status``."""
    p = run_git(root, "status", "--porcelain", "-z", "--untracked-files=all", "--no-renames", "--", STATUS_DIR)
    statuses, ledger = set(), set()
    for entry in p.stdout.split("\0"):
        path = entry[3:]
        leaf = path[len(STATUS_DIR) + 1:]
        # One level only: status/<name>.yaml. Anything else under status/ is not the reconciler's.
        if not path.startswith(STATUS_DIR + "/") or "/" in leaf:
            continue
        if leaf.endswith(".yaml"):
            statuses.add(path)
        elif leaf == "README.md" or leaf.endswith(".svg"):
            ledger.add(path)
    return sorted(statuses), sorted(ledger)


def dirty_status_paths(repo) -> list[str]:
    """status/*.yaml paths that differ from HEAD (modified, new or deleted)."""
    return dirty_paths(Path(repo.working_tree_dir))[0]


def dirty_ledger_paths(repo) -> list[str]:
    """The ledger's files (status/README.md, status/<run>.svg) that differ from HEAD."""
    return dirty_paths(Path(repo.working_tree_dir))[1]


@dataclass
class StatusCommit:
    sha: str
    paths: list[str]  # the status files it holds


def commit_status(repo, message: str | Callable[[list[str]], str], author: Author) -> StatusCommit | None:
    """Commit the status files that differ from HEAD; return the new commit, or None if nothing.
    ``message`` may be a function of the committed paths, so the message describes the commit.

    Four git processes, whatever the number of files (five where commits are signed:
    signing.py): ``status`` finds them, one ``fast-import``
    writes their blobs, the trees and the commit (starting from HEAD's tree, so nothing the user
    staged elsewhere is swept in, and moving no ref of its own), ``update-ref`` moves the branch
    with a compare-and-swap, and ``update-index`` aligns the real index's entries for these paths
    with the commit, so ``git status`` stays clean and the user's other staged changes stay staged.
    """
    root = Path(repo.working_tree_dir)
    paths, ledger = dirty_paths(root)
    # A link (or anything but a plain file) under status/ is not the reconciler's: never followed
    # into a commit, where it would publish whatever it points at.
    odd = {path for path in [*paths, *ledger] if _not_plain(root / path)}
    paths, ledger = [x for x in paths if x not in odd], [x for x in ledger if x not in odd]
    if not paths and not ledger:
        return None
    if callable(message):
        message = message(paths) if paths else "status: ledger"
    parent = head(repo)
    ref = head_ref(repo)
    new = import_commit(root, [*paths, *ledger], message, author, parent)
    if new is None:  # the files hold what HEAD holds (a change staged and undone, say)
        return None
    new = _signed(root, repo.git_dir, new, parent, message, author)
    moved = run_git(root, "update-ref", ref, new, parent or "0" * 40, check=False)
    if moved.returncode != 0:
        raise TemporaryError("the branch moved while committing status; will retry: "
                             f"{moved.stderr.strip()}")
    _index_files(root, [*paths, *ledger])
    return StatusCommit(new, paths)


def _not_plain(path: Path) -> bool:
    """Whether ``path`` exists as something other than a regular file (a missing one is a deletion)."""
    try:
        return not stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


# fast-import names the commit's branch; `reset` without `from` at the end of the stream drops that
# branch again before fast-import writes any ref (git-fast-import(1), "reset"), so the commit is
# reachable only once update-ref has moved the real branch to it.
_SCRATCH_REF = b"refs/reconciler/status-commit"


def import_commit(root: Path, paths: list[str], message: str, author: Author, parent: str | None) -> str | None:
    """One ``git fast-import``: the files at ``paths`` (plain, not executable; a missing one is
    deleted) as blobs, on top of ``parent``'s tree, in a commit whose sha is returned; None when
    status/ comes out as ``parent`` has it. Nothing goes through a temporary file, an index or a
    loose object: the objects are one pack (``fastimport.unpackLimit=0``: below the default limit
    fast-import would start ``unpack-objects`` to write them loose, one file each)."""
    out = bytearray()
    if parent:
        out += b"ls %s %s\n" % (parent.encode(), STATUS_DIR.encode())
    edits = bytearray()
    for n, path in enumerate(paths, start=2):
        quoted = _quoted(path)
        try:
            data = _read_plain(root / path)
        except FileNotFoundError:
            edits += b"D %s\n" % quoted
            continue
        out += b"blob\nmark :%d\ndata %d\n%s\n" % (n, len(data), data)
        edits += b"M 100644 :%d %s\n" % (n, quoted)
    text = _message(message)
    who = b"%s<%s> now\n" % (_ident(author.name) + b" " if _ident(author.name) else b"", _ident(author.email))
    out += b"commit %s\nmark :1\nauthor %scommitter %sdata %d\n%s" % (_SCRATCH_REF, who, who, len(text), text)
    if parent:
        out += b"from %s\n" % parent.encode()
    out += edits + b"\nls :1 %s\nget-mark :1\nreset %s\n\ndone\n" % (STATUS_DIR.encode(), _SCRATCH_REF)
    try:
        p = subprocess.run(["git", "-C", str(root), "-c", "fastimport.unpackLimit=0", "fast-import", "--quiet",
                            "--date-format=now"], input=bytes(out), capture_output=True, timeout=300, env=git_env())
    except subprocess.TimeoutExpired:
        raise GitError("git fast-import timed out after 300s") from None
    if p.returncode != 0:
        raise GitError(f"git fast-import failed: {p.stderr.decode('utf-8', 'replace').strip()[:500]}")
    lines = p.stdout.decode("utf-8", "replace").splitlines()
    if parent and len(lines) == 3 and lines[0] == lines[1]:
        return None
    return lines[-1].strip()


def _message(message: str) -> bytes:
    text = message.encode("utf-8", "surrogateescape") if _encodable(message) else message.encode("utf-8", "replace")
    if text and not text.endswith(b"\n"):
        text += b"\n"  # as ``git commit-tree -m`` completes the line
    return text


def _signed(root: Path, git_dir: str, new: str, parent: str | None, message: str, author: Author) -> str:
    """``new`` as it is, or written again signed where the checkout's git signs its commits
    (signing.py: fast-import cannot sign)."""
    env = git_env(Author(_ident(author.name).decode(), _ident(author.email).decode()))
    if not signing.signs(root, git_dir, env):
        return new
    try:
        return signing.sign(root, new, parent, _message(message), env)
    except signing.SigningError as e:
        raise GitError(str(e)) from None


def _read_plain(path: Path) -> bytes:
    """The file's bytes, never through a link (one made since the caller looked is refused)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise GitError(f"{path.name}: not committed, not a plain file ({e.strerror})") from None
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8", "surrogateescape")
        return True
    except UnicodeEncodeError:
        return False


def _ident(text: str) -> bytes:
    """A name or address as git writes it into an ident line: no ``<``, ``>`` or line break, and
    no leading or trailing whitespace or punctuation (git's own rule for GIT_AUTHOR_NAME)."""
    crud = " .,:;<>\"'\\\t\n\r"
    return "".join(c for c in text if c not in "<>\n").strip(crud).encode("utf-8", "replace")


def _quoted(path: str) -> bytes:
    """A path as fast-import reads one: C-style quoted, so a space, a quote or a line break in a
    name under status/ is taken literally."""
    if path.isprintable() and '"' not in path and "\\" not in path:
        return path.encode("utf-8", "surrogateescape")  # taken as it is: the rest of the line
    out = bytearray(b'"')
    for b in path.encode("utf-8", "surrogateescape"):
        if b in (0x22, 0x5C):
            out += b"\\%c" % b
        elif b < 0x20 or b == 0x7F:
            out += b"\\%03o" % b
        else:
            out.append(b)
    return bytes(out + b'"')


def _index_files(root: Path, paths: list[str]) -> None:
    """The real index's entries for ``paths`` set from the files (the commit's content), or
    removed where a file is gone; the user's other entries stay as they are. ``--add`` records
    each file's stat data, so the next ``git status`` need not hash it again (``--index-info``
    would leave the entries without it: the next status of a first pass hashed 10,000 files)."""
    p = subprocess.run(["git", "-C", str(root), "update-index", "--add", "--remove", "-z", "--stdin"],
                       input="".join(f"{path}\0" for path in paths).encode("utf-8", "surrogateescape"),
                       capture_output=True, timeout=120, env=git_env())
    if p.returncode != 0:
        raise GitError(f"git update-index failed: {p.stderr.decode('utf-8', 'replace').strip()[:500]}")


def transitions_message(lines: list[str], files: int | None = None) -> str:
    """``lines``: one per run whose phase, generation or attempt moved; ``files``: how many status
    files the commit holds (at least as many: progress and conditions change without a transition)."""
    files = len(lines) if files is None else files
    if lines:
        head_line = f"status: {len(lines)} transition(s)" + (f" in {files} file(s)" if files != len(lines) else "")
    else:
        head_line = f"status: {files} file(s) updated"
    body = "\n".join(f"- {line}" for line in lines[:200])
    if len(lines) > 200:
        body += f"\n- ... and {len(lines) - 200} more"
    return head_line + ("\n\n" + body if body else "") + "\n"


def last_commits(path: Path, files: list[str]) -> dict[str, str]:
    """The last commit that changed each of ``files`` (paths relative to the repository), found in
    one walk of the history that stops as soon as every file is found. Files never committed are
    left out."""
    want = set(files)
    if not want:
        return {}
    tops = sorted({f.split("/", 1)[0] for f in want})
    found: dict[str, str] = {}
    proc = subprocess.Popen(["git", "-C", str(path), "-c", "core.quotePath=false", "log", "--format=%x01%H", "--name-only", "--no-renames",
                             "--", *tops], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, env=git_env(), text=True)
    try:
        sha = ""
        for line in proc.stdout:
            line = line.rstrip("\n")
            if line.startswith("\x01"):
                sha = line[1:]
            elif line in want and line not in found:
                found[line] = sha
                if len(found) == len(want):
                    break
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    return found


def head_blobs(repo, paths: list[str]) -> dict[str, str | None]:
    """Files' texts at HEAD (None where HEAD has no such file, or no commit yet), read by one
    ``git cat-file --batch`` for all of them: a pass may ask for thousands."""
    if not paths:
        return {}
    if head(repo) is None:
        return {p: None for p in paths}
    query = "".join(f"HEAD:{p}\n" for p in paths).encode()
    proc = subprocess.run(["git", "-C", str(repo.working_tree_dir), "cat-file", "--batch"], input=query,
                          capture_output=True, env=git_env(), timeout=120)
    if proc.returncode != 0:
        raise GitError(f"git cat-file failed: {proc.stderr.decode(errors='replace').strip()[:500]}")
    out, pos, found = proc.stdout, 0, {}
    for p in paths:
        eol = out.index(b"\n", pos)
        header = out[pos:eol].split()
        pos = eol + 1
        found[p] = None  # "<name> missing", or not a blob
        if len(header) == 3:  # "<sha> <type> <size>", then the bytes and a newline
            size = int(header[2])
            if header[1] == b"blob":
                found[p] = out[pos:pos + size].decode("utf-8", "replace")
            pos += size + 1
    return found


# ---------------------------------------------------------------- the daemon's remote: fetch, rebase, push
#
# The daemon tracks one branch of one remote. Its own commits touch status/ only and users never
# edit status/, so replaying them onto the remote's newer commits (a rebase, never a merge
# commit) cannot conflict in normal operation. If it does anyway (someone edited status/ by hand,
# or another writer raced), the rebase is aborted and the checkout is reset to the remote: the
# unpushed status is dropped and the next pass derives it again from what it observes.


class GitError(TemporaryError):
    """A git command failed (network, refused push, conflict): the daemon retries later."""


def git_env(author: Author | None = None) -> dict[str, str]:
    """Git's environment: procenv's allowlist (git's own settings, never the secrets this process
    holds for runs and providers: a hook or a credential helper would see them), non-interactive."""
    env = procenv.for_git()
    env["GIT_TERMINAL_PROMPT"] = "0"
    env["LC_ALL"] = "C"  # its messages are matched below (_rejected, fetch): English, whatever the host's locale
    env.setdefault("GIT_SSH_COMMAND", "ssh -o BatchMode=yes")
    if author is not None:
        env.update(GIT_AUTHOR_NAME=author.name, GIT_AUTHOR_EMAIL=author.email,
                   GIT_COMMITTER_NAME=author.name, GIT_COMMITTER_EMAIL=author.email)
    return env


def run_git(path: Path, *args: str, author: Author | None = None, timeout: float = 120.0,
            check: bool = True, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    try:
        p = subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, timeout=timeout,
                           env={**git_env(author), **(extra_env or {})}, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise GitError(f"git {args[0]} timed out after {timeout:.0f}s") from None
    if check and p.returncode != 0:
        raise GitError(f"git {' '.join(args[:2])} failed: {(p.stderr or p.stdout).strip()[:500]}")
    return p


def _rev(path: Path, ref: str) -> str | None:
    p = run_git(path, "rev-parse", "-q", "--verify", ref + "^{commit}", check=False)
    return p.stdout.strip() if p.returncode == 0 else None


def current_branch(path: Path) -> str | None:
    p = run_git(path, "symbolic-ref", "-q", "--short", "HEAD", check=False)
    return p.stdout.strip() if p.returncode == 0 and p.stdout.strip() else None


@dataclass
class SyncResult:
    head_before: str | None
    head_after: str | None
    upstream: str | None
    action: str  # "none", "fast-forward", "rebase", "reset" (a failed rebase), "ahead", "no-upstream"
    ahead: int = 0  # commits of ours not on the remote after syncing
    error: str = ""  # why a rebase failed (action "reset")

    @property
    def moved(self) -> bool:
        return self.head_before != self.head_after


class Remote:
    """One checkout tracking ``remote``/``branch``."""

    def __init__(self, path: Path, remote: str, branch: str, author: Author, timeout: float = 120.0):
        self.path, self.remote, self.branch, self.author, self.timeout = path, remote, branch, author, timeout
        self.tracking = f"refs/remotes/{remote}/{branch}"

    def fetch(self) -> str | None:
        """Fetch the branch; return the remote's commit, or None when the remote has no such branch yet."""
        p = run_git(self.path, "fetch", "--quiet", "--no-tags", self.remote,
                    f"+refs/heads/{self.branch}:{self.tracking}", timeout=self.timeout, check=False)
        if p.returncode != 0:
            err = (p.stderr or p.stdout).strip()
            if "couldn't find remote ref" in err.lower():
                return None
            raise GitError(f"git fetch {self.remote} {self.branch} failed: {err[:500]}")
        return _rev(self.path, self.tracking)

    def ahead(self) -> int:
        if _rev(self.path, self.tracking) is None:
            return 1 if _rev(self.path, "HEAD") else 0
        p = run_git(self.path, "rev-list", "--count", f"{self.tracking}..HEAD", check=False)
        return int(p.stdout.strip() or 0) if p.returncode == 0 else 0

    def integrate(self) -> SyncResult:
        """Bring HEAD up to the fetched remote branch: fast-forward, or rebase our status commits onto it."""
        before = _rev(self.path, "HEAD")
        upstream = _rev(self.path, self.tracking)
        if upstream is None:
            return SyncResult(before, before, None, "no-upstream", 1 if before else 0)
        if before == upstream:
            return SyncResult(before, before, upstream, "none", 0)
        if before is None or self._is_ancestor(before, upstream):
            args = ["merge", "--ff-only", "--quiet", upstream] if before else ["reset", "--keep", upstream]
            run_git(self.path, *args, author=self.author)
            return SyncResult(before, _rev(self.path, "HEAD"), upstream, "fast-forward", 0)
        if self._is_ancestor(upstream, before):
            return SyncResult(before, before, upstream, "ahead", self.ahead())
        p = run_git(self.path, "-c", "rebase.autoStash=true", "rebase", "--quiet", upstream, author=self.author,
                    check=False)
        if p.returncode == 0:
            return SyncResult(before, _rev(self.path, "HEAD"), upstream, "rebase", self.ahead())
        self.recover(upstream)
        res = SyncResult(before, _rev(self.path, "HEAD"), upstream, "reset", 0)
        res.error = (p.stderr or p.stdout).strip()[:500]
        return res

    def recover(self, upstream: str) -> None:
        """A rebase failed: abort it, take the remote's commits and its status/, drop ours."""
        run_git(self.path, "rebase", "--abort", check=False)
        if run_git(self.path, "reset", "--keep", upstream, check=False).returncode != 0:
            # Local edits in the way of the remote's: the daemon's checkout mirrors the remote.
            run_git(self.path, "reset", "--hard", "--quiet", upstream)
        run_git(self.path, "clean", "-fdq", "--", STATUS_DIR, check=False)

    def push(self) -> None:
        p = run_git(self.path, "push", "--porcelain", self.remote, f"HEAD:refs/heads/{self.branch}",
                    timeout=self.timeout, check=False)
        if p.returncode != 0:
            err = (p.stdout + "\n" + p.stderr).strip()
            raise PushRejected(err[:500]) if _rejected(err) else GitError(f"git push failed: {err[:500]}")
        # Record what the remote now has, so ahead() is right without another fetch.
        run_git(self.path, "update-ref", self.tracking, "HEAD", check=False)

    def _is_ancestor(self, a: str, b: str) -> bool:
        return run_git(self.path, "merge-base", "--is-ancestor", a, b, check=False).returncode == 0


class PushRejected(GitError):
    """The remote moved (non-fast-forward): fetch, rebase, push again."""


def _rejected(err: str) -> bool:
    low = err.lower()
    return any(s in low for s in ("[rejected]", "updates were rejected", "non-fast-forward", "fetch first", "stale info",
                                  "failed to update ref", "cannot lock ref", "! [remote rejected]"))

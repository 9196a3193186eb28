"""``reconcile stop|start|restart NAME``: steer a run from the command line, still through git.

The repository is the only way to tell the reconciler anything, so these commands do what a user
would do by hand: change one field of the run's spec file and commit that file alone (or, with
``--patch``, print the change for a pull request and write nothing). The daemon then picks the
commit up like any other: nothing here talks to a machine.

- ``stop`` sets ``desiredState: Stopped`` (the run is terminated, its status kept);
- ``start`` sets it back to ``Running`` (a new generation: the spec's content changed);
- ``restart`` sets ``restartedAt`` to now, which changes the spec's content as well, so the run
  starts again from the beginning as a new generation with its retries counted afresh; that is the
  way to run a Failed run again without editing what it runs.

The file is edited with ruamel.yaml's round trip, so the user's comments, order and quoting stay
as they were; only the one key changes. A file with uncommitted changes is refused (committing it
would commit someone's unfinished edit under this command's message), as is a run whose spec is
not there. The commit uses the user's own git identity: it is the user's act, not the daemon's.
"""

from __future__ import annotations

import argparse
import difflib
import io
import os
import sys
import time
from pathlib import Path

from reconciler.core.config import Config
from reconciler.core.errors import ReconcilerError, UsageError

ACTIONS = ("stop", "start", "restart")
HELP = {
    "stop": "stop a run: commit desiredState: Stopped to its spec (or --patch: print the change)",
    "start": "start a stopped run again: commit desiredState: Running to its spec (or --patch)",
    "restart": "run it again from the beginning as a new generation: commit restartedAt to its spec (or --patch)",
}


def build(p: argparse.ArgumentParser, run_names) -> None:
    """The arguments of the three commands (``run_names``: completion of NAME)."""
    p.add_argument("name", metavar="NAME", help="a run (its spec file is changed)").completer = run_names
    p.add_argument("--patch", action="store_true", help="print the change as a patch for a pull request; write "
                   "and commit nothing")
    p.add_argument("--no-commit", dest="steer_no_commit", action="store_true",
                   help="write the spec file but do not commit it")
    p.add_argument("-m", "--message", metavar="TEXT", help="the commit message (default: 'Stop run NAME', ...)")


def spec_file(repo: Path, name: str) -> Path:
    """The file of run ``name``: the loaded run's file, or (a spec that does not load) the Run file
    named after it anywhere under specs/ (a run's file name is its name)."""
    from reconciler.spec.load import load_tree

    from .common import no_such_run

    desired = load_tree(repo)
    entry = desired.runs.get(name)
    if entry is not None:
        return repo / entry.rel
    for p in sorted((repo / "specs").rglob(f"{name}.yaml")):
        if p.is_file() and _is_run(p):
            return p
    raise no_such_run(name, list(desired.runs) + list(desired.invalid))


def _is_run(p: Path) -> bool:
    try:
        head = p.read_text(errors="replace")[:4096]
    except OSError:
        return False
    return any(line.split("#")[0].strip() in ("kind: Run", 'kind: "Run"', "kind: 'Run'") for line in head.splitlines())


def edited(text: str, action: str, now: float | None = None) -> tuple[str, str]:
    """``text`` with the action's one key changed → (new text, what changed, for the message).
    Raises UsageError when the change makes no sense for the run as it is."""
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap

    y = YAML(typ="rt")
    y.preserve_quotes = True
    y.width = 4096  # never re-wrap the user's long lines
    doc = y.load(text)
    spec = doc.get("spec") if isinstance(doc, CommentedMap) else None
    if not isinstance(spec, CommentedMap):
        raise UsageError("the file has no spec mapping to change")
    state = spec.get("desiredState", "Running")
    if action == "stop":
        if state == "Stopped":
            raise UsageError("it is already stopped (desiredState: Stopped)")
        _set(spec, "desiredState", "Stopped")
        what = "desiredState: Stopped"
    elif action == "start":
        if state != "Stopped":
            raise UsageError("it is not stopped (use 'reconcile restart' to run it again from the beginning)")
        _set(spec, "desiredState", "Running")
        what = "desiredState: Running"
    else:
        if state == "Stopped":
            raise UsageError("it is stopped (use 'reconcile start')")
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now))
        _set(spec, "restartedAt", stamp)
        what = f"restartedAt: {stamp}"
    out = io.StringIO()
    y.dump(doc, out)
    return out.getvalue(), what


def _set(spec, key: str, value: str) -> None:
    if key in spec:
        spec[key] = value
    else:  # after desiredState when there is one, else at the end: where a person would write it
        keys = list(spec)
        at = keys.index("desiredState") + 1 if "desiredState" in keys and key != "desiredState" else len(keys)
        spec.insert(at, key, value)


def _uncommitted(repo: Path, rel: str) -> bool:
    from reconciler.gitops.repo import run_git

    p = run_git(repo, "status", "--porcelain", "--", rel, check=False)
    return p.returncode != 0 or bool(p.stdout.strip())


def cmd_steer(action: str, args: argparse.Namespace, cfg: Config) -> int:
    from reconciler.gitops.repo import GitError, open_repo, run_git

    path = spec_file(cfg.repo, args.name)
    rel = path.relative_to(cfg.repo).as_posix()
    text = path.read_text()
    try:
        new, what = edited(text, action)
    except UsageError as e:
        raise UsageError(f"{rel}: cannot {action} run {args.name!r}: {e}") from None
    if args.patch:
        sys.stdout.writelines(difflib.unified_diff(text.splitlines(keepends=True), new.splitlines(keepends=True),
                                                   f"a/{rel}", f"b/{rel}"))
        return 0
    commit = not args.steer_no_commit
    if commit and open_repo(cfg.repo) is None:
        raise UsageError(f"{cfg.repo}: not a git repository (use --no-commit or --patch)")
    if commit and _uncommitted(cfg.repo, rel):
        raise UsageError(f"{rel} has uncommitted changes: commit or discard them first, or use --patch")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(new)
    os.replace(tmp, path)  # whole or not at all
    if not commit:
        print(f"{rel}: {what} (not committed)")
        return 0
    message = args.message or f"{action.capitalize()} run {args.name}\n\n{rel}: {what}\n"
    try:
        run_git(cfg.repo, "commit", "--only", "-q", "-m", message, "--", rel)
    except GitError as e:
        path.write_text(text)  # nothing half done: the file as it was
        raise ReconcilerError(f"{rel}: the change was not committed and is undone: {e}") from None
    head = run_git(cfg.repo, "rev-parse", "--short", "HEAD").stdout.strip()
    print(f"{rel}: {what} (commit {head}; push it, or let the daemon's repository pull it)")
    return 0

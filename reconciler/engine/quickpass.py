"""A fresh process's pass over a settled tree, proved to plan nothing before anything is loaded.

``reconcile --once`` from cron over thousands of finished runs would import the models, the
planner and the machines' code, and read the pass cache whole, to print "No changes". A pass
plans nothing when every run is settled (finished and untouched, ``loop.py``'s ``_settle``) and no
machine holds anything of this repository; then it writes, commits and saves nothing either. The
last full pass records what that takes in the pass cache's quick section (``passcache.facts``): its tree
had only runs, templates and at most a Policy, no invalid file, every run settled, no run's spec
file uncommitted. A quick pass (``check``) then proves that nothing moved since:

- every spec file is where it was, with the stat it was read under, outside git's racy window
  (``reconciler/spec/specfile.py``), and there is no other spec file;
- HEAD, the index and the ignore files are as the uncommitted-spec check last saw them;
- the status files are exactly the settled runs', each with the key it settled with;
- this machine's workspace root holds no workspace of a run (the only machine a tree without
  Fleets, Providers and Slurm templates has), and no silent machine or start-less instance is
  on record in the working state, and the launch journal holds no launch;
- the ledger's README is the one last written, and git was last found with nothing to commit
  under status/ with the same HEAD, index and files (else ``git status`` is asked, once).

Anything else, or any doubt (a value of the cache of the wrong type, a file that cannot be
stat-ed), and the caller runs the full pass, which plans, writes and commits as always and
records the facts again. The plan is the full pass's: empty, at the same moment.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from reconciler.core.identity import IDENTITY
from reconciler.core.plan import Plan
from reconciler.gitops import repo as gitops
from reconciler.spec.tree import walk

from . import passcache
from .uncommitted import repo_key

STATE_FILES = ("down-since.json", "first-seen.json")  # downtime.py, lookalikes.py: empty or absent
JOURNAL, JOURNAL_VERSION = "inflight.json", 1  # inflight.py's launch journal

log = logging.getLogger("reconciler")


def check(cfg, dry_run: bool = False) -> Plan | None:
    """The plan of a pass over this checkout when it is provably empty (see above); None when a
    full pass must run. ``cfg``: the configuration (``config.Config`` or the cached ``Settings``)."""
    now = time.time()
    try:
        why = _why_not(cfg, dry_run)
    except (KeyError, TypeError, ValueError, IndexError):  # a cache of another shape
        why = "the cache's quick section is not of this code's shape"
    if why is not None:
        log.debug("full pass: %s", why)
        return None
    return Plan(at=now)


def _why_not(cfg, dry_run: bool) -> str | None:
    q = passcache.read_quick(cfg.state_dir)
    if q is None or (cfg.ledger and not q.get("ledger")):
        return "no pass cache whose last pass found this tree settled"
    repo = gitops.open_repo(cfg.repo)
    if repo is None:
        return "not the top of a git checkout"
    ignores: list = []
    if _specs(str(cfg.repo), ignores) != q["specs"]:
        return "a spec file changed, came or went"
    key = repo_key(repo)
    if key is None or [*key, ignores] != q["dirty_key"]:
        return "HEAD, the index or an ignore file moved since git was last asked about specs/"
    status_dir = cfg.repo / "status"
    extra: dict[str, list[int]] = {}
    if _statuses(status_dir, extra) != q["status"]:
        return "a status file changed, came or went"
    if not _local_empty(cfg.local_root):
        return "this machine's workspace root holds a workspace"
    if not _state_empty(cfg.state_dir):
        return "the working state records a silent machine, a start-less instance or a launch"
    if dry_run:
        return None
    if cfg.ledger and _key(status_dir / "README.md") != q["readme"]:
        return "the ledger's README is not the one last written"
    if cfg.commit and not _status_committed(repo, key, extra, q.get("clean")):
        return "status/ differs from HEAD"
    return None


def _specs(root: str, ignores: list) -> str | None:
    """The digest of every spec file's path and stat (inode, size, mtime, ctime), in the order of
    the loader's own walk (``spec/tree.py``), which also gives ``ignores`` (the ignore files in the
    spec folders: the uncommitted check's key). The last full pass saved the same digest only for
    files read outside their racy window: the same stat now vouches for the same content
    (``reconciler/spec/specfile.py``)."""
    prefix = len(root) + 1
    found = walk(root, ignores)
    if any(stat is None for _, _, stat in found):
        return None
    return passcache.stats_digest((path[prefix:], *stat) for path, _, stat in found)


def _statuses(status_dir: Path, extra: dict) -> str | None:
    """The digest of every status file's run name and key (inode, size, mtime, as ``status/store.py``'s
    ``load_all`` compares them), by name; ``extra`` gets the other files git would report (the
    ledger's, hidden *.yaml) with their stats."""
    try:
        names = sorted(os.listdir(status_dir))
    except FileNotFoundError:
        names = []
    except OSError:
        return None
    base = os.path.join(status_dir, "")

    def entries():
        for n in names:
            if n.endswith(".yaml") and not n.startswith("."):
                s = os.stat(base + n)
                yield n[:-5], s.st_ino, s.st_size, s.st_mtime_ns
            elif n == "README.md" or n.endswith((".svg", ".yaml")):
                s = os.lstat(base + n)
                extra[n] = [s.st_ino, s.st_size, s.st_mtime_ns]

    try:
        return passcache.stats_digest(entries())
    except OSError:
        return None


def _local_empty(root: str) -> bool:
    """This machine's workspace root holds nothing the probe would report (``runtime/probe.py``
    looks only at entries named like a run identity)."""
    try:
        names = os.listdir(os.path.abspath(os.path.expanduser(root)))
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return not any(IDENTITY.match(n) for n in names)


def _state_empty(state_dir: Path) -> bool:
    """No silent machine and no start-less instance on record, and a launch journal with no
    launch in it (``inflight.py``): a pass would leave each of these files as it is."""
    for name in STATE_FILES:
        try:
            with open(state_dir / name, encoding="utf-8") as fh:
                if json.loads(fh.read(1 << 16)) != {}:
                    return False
        except FileNotFoundError:
            continue
        except (OSError, ValueError):
            return False
    try:  # absent: the full pass writes the first one (a journal proves what no launch was left)
        with open(state_dir / JOURNAL, encoding="utf-8") as fh:
            doc = json.loads(fh.read(1 << 16))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("version") == JOURNAL_VERSION and doc.get("launches") == []


def _key(path: Path) -> list | None:
    """``status/ledger.py``'s key of the README (inode, size, mtime), as JSON keeps it."""
    try:
        s = path.stat()
    except OSError:
        return None
    return [s.st_ino, s.st_size, s.st_mtime_ns]


def _status_committed(repo, key: list, extra: dict, clean) -> bool:
    """Nothing under status/ differs from HEAD: known when the commit step last found it so under
    this HEAD and index, with these files (the status files' keys are checked already); else git's
    own answer, one ``git status``."""
    if isinstance(clean, list) and len(clean) == 2 and clean[0] == key and clean[1] == extra:
        return True
    statuses, ledger = gitops.dirty_paths(Path(repo.working_tree_dir))
    return not statuses and not ledger

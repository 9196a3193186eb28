"""A fresh ``reconcile --once`` over a settled tree: the real command in a new process proves that
its pass plans nothing without importing the models, the planner, GitPython or the machines'
code, and prints what the full pass prints; any change since the last full pass (a spec file, a
status file, a workspace, the working state, an uncommitted status) gets the full pass again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from reconciler.engine import passcache
from tests.repo_helpers import make_repo, run_spec, wait_for

ROOT = Path(__file__).resolve().parents[2]
# What a pass that plans nothing must not import (each costs more than the whole quick pass).
HEAVY = ("pydantic", "git", "ruamel.yaml", "yaml", "fabric", "paramiko", "jsonschema", "reconciler.spec.models",
         "reconciler.spec.load", "reconciler.planner.make", "reconciler.machines.pool", "reconciler.rentals.inventory",
         "reconciler.daemon.dashboard", "reconciler.engine.loop", "reconciler.status.store", "reconciler.core.config")


def _tree(tmp_path: Path, ws_root: Path, n: int = 4) -> Path:
    runs = {f"done-{i}": run_spec(f"done-{i}", ["echo", str(i)], desired="Stopped") for i in range(n)}
    repo = make_repo(tmp_path / "repo", runs)
    (repo / "reconciler.yaml").write_text(f"workspace_root: {ws_root}\nnamespace: quick\nlocal_gpus: 0\n")
    subprocess.run(["git", "-C", str(repo), "add", "reconciler.yaml"], check=True)
    subprocess.run(["git", "-C", str(repo), "commit", "-qm", "config"], check=True)
    then = time.time() - 10  # outside the racy-clean window, as a tree nobody touched for a while
    for top in ("specs", "execution_templates"):
        for d, _, names in os.walk(repo / top):
            for name in names:
                os.utime(os.path.join(d, name), (then, then))
    return repo


class Modules(set):
    """The modules a process imported, and its log (it says why a pass was not quick)."""

    log = ""

    def __repr__(self) -> str:
        return f"<{len(self)} modules; log: {self.log[-1500:]!r}>"


def _once(repo: Path, *extra: str) -> tuple[dict, Modules]:
    """The command's JSON (without its time) and the modules it imported (``-X importtime``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECONCILER_")}
    env["RECONCILER_LOG_LEVEL"] = "DEBUG"
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "reconciler.cli.main", "--once", "--json",
                        "--repo", str(repo), *extra], cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    modules = Modules(line.split("|")[-1].strip() for line in p.stderr.splitlines() if line.startswith("import time:"))
    modules.log = "\n".join(line for line in p.stderr.splitlines() if not line.startswith("import time:"))
    out = json.loads(p.stdout)
    out.pop("at")
    return out, modules


def _quick(modules: set[str]) -> bool:
    return not any(m == h or m.startswith(h + ".") for m in modules for h in HEAVY)


def _settled(repo: Path) -> dict:
    """Passes until one is quick (the first writes the statuses and commits them; the next ones
    find git's index refreshed and record the answers); its output."""
    found: list = []

    def quick() -> bool:
        out, modules = _once(repo)
        found[:] = [out]
        return _quick(modules)

    wait_for(quick, timeout=60, interval=0.1, what="a quick pass")
    return found[0]


def _acting(out: dict) -> dict:
    """Without its no-op entries: a process that knows the runs are settled leaves them out of the
    plan, one that does not lists each as "none" (tests/engine/test_passcache.py compares the same)."""
    out = dict(out, changes=[c for c in out["changes"] if c["action"] != "none"])
    out["summary"] = {k: v for k, v in out["summary"].items() if k != "none"}
    return out


def _full(repo: Path) -> dict:
    """The output of a process that finds no cache, the working state kept as it was."""
    cache = passcache.cache_path(repo / ".reconciler")
    saved = cache.read_bytes()
    cache.unlink()
    try:
        out, modules = _once(repo, "--dry-run")
        assert not _quick(modules)
        return _acting(out)
    finally:
        cache.write_bytes(saved)


def test_a_settled_pass_imports_nothing_heavy_and_prints_what_the_full_pass_prints(tmp_path, ws_root):
    repo = _tree(tmp_path, ws_root)
    quick = _settled(repo)
    assert quick == {"changes": [], "commit": None, "committed": [], "diagnostics": [], "outcomes": [],
                     "summary": {}, "transitions": [], "warnings": [], "written": []}
    full = _full(repo)
    assert full == {k: quick[k] for k in full}
    before = passcache.cache_path(repo / ".reconciler").stat()
    out, modules = _once(repo)
    assert _quick(modules), modules
    assert out == quick
    after = passcache.cache_path(repo / ".reconciler").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # nothing saved
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    out, modules = _once(repo, "--dry-run")
    assert _quick(modules), modules
    assert {k: out[k] for k in full} == full
    assert subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout == head


def _changes(repo: Path, ws_root: Path) -> dict:
    """Each change a quick pass must not miss: name → what makes it."""
    spec = repo / "specs" / "runs" / "done-1.yaml"
    status = repo / "status" / "done-2.yaml"
    state = repo / ".reconciler"

    def touch_spec() -> None:
        os.utime(spec)  # the same bytes, a new stat: read again

    def edit_spec() -> None:
        spec.write_text(spec.read_text().replace('"1"', '"9"'))  # uncommitted: held, never launched

    def new_spec() -> None:
        (repo / "specs" / "runs" / "fresh.yaml").write_text(run_spec("fresh", ["true"], desired="Stopped"))

    def edit_status() -> None:
        status.write_text(status.read_text() + "# by hand\n")

    def stray_status() -> None:
        (repo / "status" / "nobody.yaml").write_text("phase: Running\n")

    def workspace() -> None:
        (ws_root / "quick" / "done-3-g1-a1").mkdir(parents=True)

    def silent_machine() -> None:
        (state / "down-since.json").write_text(json.dumps({"gpu-1": 1.0}))

    def readme() -> None:
        path = repo / "status" / "README.md"
        path.write_text(path.read_text() + "\n")

    def config() -> None:
        (repo / "reconciler.yaml").write_text((repo / "reconciler.yaml").read_text() + "parallel_machines: 4\n")

    return {f.__name__: f for f in (touch_spec, edit_spec, new_spec, edit_status, stray_status, workspace,
                                    silent_machine, readme, config)}


def test_every_change_since_the_last_full_pass_gets_the_full_pass(tmp_path, ws_root):
    for name, change in _changes(_tree(tmp_path / "probe", ws_root), ws_root).items():
        repo = _tree(tmp_path / name, ws_root / name)
        _settled(repo)
        _changes(repo, ws_root / name)[name]()
        out, modules = _once(repo)
        assert not _quick(modules), name  # the full pass: what it plans is its own tests' matter


def test_a_damaged_quick_section_is_not_used_and_a_tree_that_needs_planning_gets_none(tmp_path, ws_root):
    from reconciler.core import config as configs
    from reconciler.engine import quickpass

    repo = _tree(tmp_path, ws_root)
    _settled(repo)
    cfg = configs.load(str(repo))
    assert quickpass.check(cfg) is not None
    path = passcache.cache_path(repo / ".reconciler")
    good = path.read_bytes()
    head, quick, body = good.split(b"\n", 2)
    doc = json.loads(quick)
    for forged in (quick.replace(doc["status"].encode(), doc["specs"].encode()), quick[:-5], b"[]"):
        assert forged != quick
        path.write_bytes(head + b"\n" + forged + b"\n" + body)
        assert passcache.read_quick(repo / ".reconciler") is None and quickpass.check(cfg) is None
    path.write_bytes(good)
    assert quickpass.check(cfg) is not None

    # An invalid spec: its run is planned every pass (Invalid), so no pass is quick.
    (repo / "specs" / "runs" / "bad.yaml").write_text(run_spec("bad", ["true"], desired="Stopped",
                                                               extra="  colour: red\n"))
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(repo), "commit", "-qm", "bad"], check=True)
    for _ in range(3):
        out, modules = _once(repo)
        assert not _quick(modules) and out["diagnostics"]
    assert passcache.read_quick(repo / ".reconciler") is None

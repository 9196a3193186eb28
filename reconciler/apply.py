"""Apply: carry out a plan's changes and report an outcome per run; never raise for one run.

Changes run with bounded concurrency: machines in parallel, one machine's changes in order (so
a terminate that frees a GPU happens before the launch that takes it). A change that fails is
recorded as that run's outcome, with whether retrying can help, and the pass goes on.
"""

from __future__ import annotations

import json
import os
import shlex
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import bundle as bundles
from .backends import launchers
from .backends.base import LaunchResult, LaunchSpec
from .errors import PermanentError, ReconcilerError, TemporaryError
from .plan import LOCAL, Change, Plan
from .spec.load import DesiredState
from .spec.resolve import effective


@dataclass
class Outcome:
    name: str
    action: str
    ok: bool = True
    error: str = ""
    permanent: bool = False
    launched: LaunchResult | None = None
    machine: str | None = None
    workspace: str | None = None
    manifest: dict | None = None
    killed: list[str] = field(default_factory=list)


@dataclass
class ApplyContext:
    repo: Path
    desired: DesiredState
    transport_for: Callable[[str], object]
    spec_commit: str | None
    terminate_grace: float = 10.0
    remote_cleanup: str = "after_collect"
    parallel: int = 8
    secret_source: Callable[[str], str | None] = os.environ.get
    machine_python: Callable[[str], str | None] = lambda machine: None

    def bundle_dir(self, identity: str) -> Path:
        return self.repo / ".reconciler" / "bundles" / identity


def apply(plan: Plan, ctx: ApplyContext) -> list[Outcome]:
    todo = [c for c in plan.changes if c.mutates]
    groups: dict[str, list[Change]] = {}
    for c in todo:
        key = c.machine or (c.kill[0].machine if c.kill else LOCAL)
        groups.setdefault(key, []).append(c)

    def run_group(changes: list[Change]) -> list[Outcome]:
        return [_one(c, ctx) for c in changes]

    outcomes: list[Outcome] = []
    if len(groups) <= 1:
        for changes in groups.values():
            outcomes.extend(run_group(changes))
    else:
        with ThreadPoolExecutor(max_workers=max(1, min(ctx.parallel, len(groups)))) as pool:
            for result in pool.map(run_group, groups.values()):
                outcomes.extend(result)
    return outcomes


def _one(c: Change, ctx: ApplyContext) -> Outcome:
    out = Outcome(c.name, c.action, machine=c.machine)
    try:
        for k in c.kill:
            t = ctx.transport_for(k.machine)
            ws = k.workspace or t.workspace(k.identity)
            launchers.terminate(t, k.identity, ws, ctx.terminate_grace)
            out.killed.append(k.identity)
        if c.action in ("launch", "relaunch"):
            _launch(c, ctx, out)
        elif c.action == "collect" and c.machine:
            _collect(c, ctx, out)
    except PermanentError as e:
        out.ok, out.error, out.permanent = False, str(e), True
    except TemporaryError as e:
        out.ok, out.error = False, str(e)
    except ReconcilerError as e:
        out.ok, out.error = False, str(e)
    except Exception as e:  # noqa: BLE001 - one run's failure never stops the pass
        out.ok, out.error = False, f"{type(e).__name__}: {e}"
    return out


def _launch(c: Change, ctx: ApplyContext, out: Outcome) -> None:
    entry = ctx.desired.runs[c.name]
    template = ctx.desired.templates[entry.run.spec.template]
    eff = effective(entry.run, template)
    t = ctx.transport_for(c.machine)
    ws = t.workspace(c.identity)
    local_dir = Path(ws) if c.machine == LOCAL else ctx.bundle_dir(c.identity)
    python = eff.python or ctx.machine_python(c.machine)
    resume = _resume_path(t, c) if c.resume_from else None
    req = bundles.BundleRequest(
        repo_root=ctx.repo, identity=c.identity, run=entry.run, spec_digest=entry.digest, spec_commit=ctx.spec_commit,
        template=template, effective=eff, machine=c.machine, gpus=c.gpus, python=python, resume_from=resume,
    )
    b = bundles.build(req, local_dir)
    ws = t.stage(b.path, c.identity)
    secrets = {}
    missing = []
    for name in entry.run.spec.secrets:
        value = ctx.secret_source(name)
        if value is None:
            missing.append(name)
        else:
            secrets[name] = value
    if missing:
        raise TemporaryError(f"secret(s) {', '.join(missing)} not set on the reconciler host")
    spec = LaunchSpec(identity=c.identity, run_name=c.name, workspace=ws, launch_mode=eff.launch_mode,
                      image=eff.image, network=eff.network, pull=eff.pull, gpus=c.gpus, secrets=secrets)
    out.launched = launchers.launch(t, spec)
    out.workspace = ws


def _resume_path(t, c: Change) -> str | None:
    """The previous attempt's latest checkpoint on the same machine, when there is one."""
    prev_ws = t.workspace(c.resume_from)
    link = f"{prev_ws}/artifacts/output/last-checkpoint"
    r = t.sh(f"cd {shlex.quote(prev_ws)}/artifacts/output 2>/dev/null && ls -d checkpoint-* 2>/dev/null "
             "| sort -t- -k2 -n | tail -n 1", timeout=30)
    name = r.out.strip()
    if r.rc == 0 and name.startswith("checkpoint-"):
        return f"{prev_ws}/artifacts/output/{name}"
    del link
    return None


def _collect(c: Change, ctx: ApplyContext, out: Outcome) -> None:
    t = ctx.transport_for(c.machine)
    ws = c.workspace or t.workspace(c.identity)
    local_dir = Path(ws) if c.machine == LOCAL else ctx.bundle_dir(c.identity)
    t.fetch(c.identity, local_dir)
    manifest = bundles.manifest(local_dir) if local_dir.is_dir() else {"artifacts": []}
    job = local_dir / "job.json"
    if job.is_file():
        try:
            manifest["job"] = json.loads(job.read_text())["payload"]
        except (OSError, ValueError, KeyError):
            pass
    if local_dir.is_dir():
        (local_dir / "artifacts").mkdir(exist_ok=True)
        (local_dir / "artifacts" / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    remove = c.machine != LOCAL and ctx.remote_cleanup == "after_collect"
    launchers.finish(t, ws, remove)
    out.manifest, out.workspace = manifest, str(local_dir)

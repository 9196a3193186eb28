"""Apply: carry out a plan's changes and report an outcome per run; never raise for one run.

Changes run with bounded concurrency: machines in parallel, one machine's changes in order (so
a terminate that frees a GPU happens before the launch that takes it). A change that fails is
recorded as that run's outcome, with whether retrying can help, and the pass goes on.
"""

from __future__ import annotations

import os
import shlex
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from reconciler.artifacts import bundle as bundles
from reconciler.artifacts import provenance, safetar
from reconciler.core.actions import Action
from reconciler.machines import launchers
from reconciler.machines.base import LaunchResult, LaunchSpec, SlurmJob
from reconciler.spec.models.slurm import merged
from reconciler.core.errors import PermanentError, ReconcilerError, TemporaryError
from reconciler.core.identity import node_of, parse
from reconciler.core.names import LOCAL
from reconciler.rentals.providers.base import OfferUnavailable
from . import outputs
from . import resume as resume_at
from .parallel_launches import in_order
from reconciler.core.plan import Change, Plan
from reconciler.spec.load import DesiredState
from reconciler.spec.resolve import effective


def _after_stage() -> None:
    """Does nothing: a seam for the crash-safety tests (tests/faults.py replaces it with a kill),
    between staging a bundle on its machine and starting it."""


@dataclass
class Outcome:
    name: str
    action: Action
    ok: bool = True
    error: str = ""
    permanent: bool = False
    launched: LaunchResult | None = None
    machine: str | None = None
    workspace: str | None = None
    manifest: dict | None = None
    killed: list[str] = field(default_factory=list)
    side: bool = False  # a fence or a leftover's collection: not the run's own change, not its status
    rental: dict | None = None  # provision: the rental asked for; launch on a rental: its pinned host key
    rental_step: str | None = None  # where a launch on a rental stopped: "ssh" or "gpus"
    gpus_seen: str | None = None  # what the GPU check found on the rental
    outputs: dict | None = None  # a launch of a run with a Storage: the status's outputs as of the launch


@dataclass
class ApplyContext:
    repo: Path
    desired: DesiredState
    transport_for: Callable[[str], object]
    repo_head: str | None  # HEAD at launch (the bundle's repo_head); None outside git
    terminate_grace: float = 10.0
    remote_cleanup: str = "after_collect"
    parallel: int = 8
    secret_source: Callable[[str], str | None] = os.environ.get
    machine_python: Callable[[str], str | None] = lambda machine: None
    spec_commits: dict[str, str] = field(default_factory=dict)  # spec file → its spec commit (the loop finds them)
    providers: object = None  # rentals.Providers: the adapters for provision and release
    rental_key: Callable[[str], str | None] = lambda machine: None  # a rental's pinned (or first-seen) host key
    ssh_ready_timeout: float = 20.0
    checkpoint_copy_mbps: float | None = None  # bandwidth of checkpoint copies off rentals (None: unbounded)
    # What one collection or checkpoint copy may bring to this host (collect_max_bytes / _files).
    collect_limits: safetar.Limits = field(default_factory=safetar.Limits)
    repo_id: str = ""  # the repository's namespace: its folder in a Storage's bucket
    inflight: object = None  # engine/inflight.py Journal: each launch recorded before it is issued

    def local_dir(self, machine: str, identity: str, workspace: str) -> Path:
        """Where an attempt's bundle lives on this host: its workspace itself when it runs here."""
        return Path(workspace) if machine == LOCAL else self.repo / ".reconciler" / "bundles" / identity


def apply(plan: Plan, ctx: ApplyContext) -> list[Outcome]:
    todo = [c for c in plan.changes if c.mutates]
    groups: dict[str, list[Change]] = {}
    for c in todo:
        key = c.machine or (c.kill[0].machine if c.kill else LOCAL)
        groups.setdefault(key, []).append(c)

    def run_group(changes: list[Change]) -> list[Outcome]:
        return in_order(changes, lambda c: _one(c, ctx), ctx.transport_for)  # launches overlap: see there

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
    out = Outcome(c.name, c.action, machine=c.machine, side=c.phase is None)
    if c.action in (Action.PROVISION, Action.RELEASE):
        return _rental_change(c, ctx, out)
    try:
        for k in c.kill:
            t = ctx.transport_for(k.machine)
            ws = k.workspace or t.workspace(k.identity)
            done = launchers.terminate(t, k.identity, ws, ctx.terminate_grace if k.grace is None else k.grace)
            if done.get("error"):
                raise TemporaryError(f"cannot stop {k.identity} on {k.machine}: {done['error']}")
            out.killed.append(k.identity)
        if c.action == Action.TERMINATE and c.phase == "Terminated":
            _collect_stopped(c, ctx, out)
        if c.collect_first is not None:
            f = c.collect_first
            for n in c.collect_nodes or [f]:
                try:
                    _collect_into(ctx, n.machine, n.identity, n.workspace, final=False)
                except ReconcilerError:
                    pass  # the relaunch matters more than the failed attempt's logs; its workspace stays
        if c.action in (Action.LAUNCH, Action.RELAUNCH):
            _launch(c, ctx, out)
        elif c.action == Action.COLLECT and c.machine:
            _collect(c, ctx, out)
        elif c.action == Action.SAVE and not outputs.has_storage(ctx.desired, c.name):
            # (a run with a Storage uploads its checkpoints from the machine: nothing comes here)
            from reconciler.rentals import checkpoints

            checkpoints.save(ctx.transport_for(c.machine), c.identity, c.checkpoint, ctx.repo / ".reconciler",
                             c.name, c.generation, ctx.checkpoint_copy_mbps, ctx.collect_limits)
    except PermanentError as e:
        out.ok, out.error, out.permanent = False, str(e), True
    except ReconcilerError as e:
        out.ok, out.error = False, str(e)
    except Exception as e:  # noqa: BLE001 - one run's failure never stops the pass
        out.ok, out.error = False, f"{type(e).__name__}: {e}"
    return out


def _launch(c: Change, ctx: ApplyContext, out: Outcome) -> None:
    entry = ctx.desired.runs[c.name]
    # Secrets first: a launch that cannot start must leave nothing behind on the machine.
    refused = secret_refusals(ctx.desired, entry.run)
    if refused:  # validation refuses the run already; this holds even if a bug let it through
        raise PermanentError("; ".join(refused))
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
    if c.nodes:
        _launch_gang(c, ctx, out, entry, secrets)
        return
    t = ctx.transport_for(c.machine)
    if c.rental is not None:
        _rental_ready(c, ctx, t, out)
    out.launched, out.workspace = _launch_one(c, ctx, entry, secrets, t, c.identity, c.gpus, out=out)


def secret_refusals(desired: DesiredState, run) -> list[str]:
    """Why the run may not have each secret it lists that it may not have (empty: it may have them
    all), by the Policy's grants and the names the reconciler keeps to itself. A Policy file that
    is there but invalid grants nothing: its rules cannot be read, so no secret leaves."""
    from reconciler.spec.checks.secrets import provider_credentials
    from reconciler.spec.models.policy import secret_refusal

    if run.spec.secrets and desired.policy is None and any(f.kind == "Policy" for f in desired.files):
        return [f"the Policy is invalid, so no secret is given to any run ({', '.join(run.spec.secrets)} held back)"]
    policy = desired.policy.spec if desired.policy is not None else None
    reserved = provider_credentials(desired.files)  # the same names validation holds back
    rules = policy.secrets if policy is not None else None
    label = policy.teamLabel if policy is not None else "team"
    team = run.metadata.labels.get(label)
    out = []
    for name in run.spec.secrets:
        why = secret_refusal(rules, run.metadata.name, team, name, reserved, label)
        if why:
            out.append(why)
    return out


def _launch_one(c: Change, ctx: ApplyContext, entry, secrets: dict, t, identity: str, gpus: list[int],
                gang: dict | None = None, env: dict | None = None,
                out: Outcome | None = None) -> tuple[LaunchResult, str]:
    """Build, stage and start one instance (one node of a run on several machines: ``gang`` is
    its {rank, of, machines}, ``env`` its rank and rendezvous)."""
    template = ctx.desired.templates[entry.run.spec.template]
    eff = effective(entry.run, template)
    machine = t.machine.name
    local_dir = ctx.local_dir(machine, identity, t.workspace(identity))
    python = eff.python or ctx.machine_python(machine)
    # Outputs in a Storage (node 0 only: it is the node that saves): resumed from the bucket.
    sl = outputs.prepare(ctx, c, entry, t, identity, eff.launch_mode == "docker") \
        if not gang or gang.get("rank") == 0 else None
    resume, saved = (sl.resume_from, None) if sl is not None else resume_at.vm_resume(c, ctx, entry, t, identity)
    resume, mounts = resume_at.as_the_run_sees(resume, t.workspace(identity), eff.launch_mode == "docker")
    req = bundles.BundleRequest(
        repo_root=ctx.repo, identity=identity, run=entry.run, spec_digest=entry.digest, repo_head=ctx.repo_head,
        template=template, effective=eff, machine=machine, gpus=gpus, python=python, resume_from=resume,
        spec_commit=ctx.spec_commits.get(entry.rel), gang=gang,
        storage=sl.config if sl is not None else None, storage_name=sl.storage.metadata.name if sl else None,
    )
    b = bundles.build(req, local_dir)
    if saved is not None:
        from reconciler.rentals import checkpoints

        checkpoints.stage(saved, Path(b.path), ctx.collect_limits)
    ws = t.stage(b.path, identity, entry.digest)
    if sl is not None:
        outputs.into_container(t, sl, ws)
    _after_stage()
    spec = LaunchSpec(identity=identity, run_name=c.name, workspace=ws, launch_mode=eff.launch_mode,
                      image=eff.image, network=eff.network, pull=eff.pull, gpus=gpus, secrets=secrets,
                      spec_digest=entry.digest, slurm=slurm_job(template, eff, entry.run.spec.slurm),
                      env=dict(env or {}, **resume_at.env_for(entry, resume)), mounts=mounts,
                      storage_env=sl.env if sl is not None else {})
    if sl is not None and out is not None:
        out.outputs = sl.outputs
    return _issue(ctx, c.name, t, spec), ws


def _issue(ctx: ApplyContext, run: str, t, spec: LaunchSpec) -> LaunchResult:
    """Start ``spec`` with a deadline, recorded in the launch journal until the machine answers
    (engine/inflight.py); a launch whose answer is lost stays there until its deadline. A launch
    made by this process's own system calls is not recorded (``in_process``)."""
    if ctx.inflight is None:
        return launchers.launch(t, spec)
    if in_process(t, spec):
        return launchers.launch(t, spec, ctx.inflight.deadline())
    not_after = ctx.inflight.issue(run, t.machine.name, spec.identity)
    res = launchers.launch(t, spec, not_after)
    ctx.inflight.answered(run, t.machine.name, spec.identity)
    return res


def in_process(t, spec: LaunchSpec) -> bool:
    """A host process on this machine, started by this process itself up to its wrapper
    (machines/local_launch.py): no step of it runs outside this process, so none can land after
    this process is gone, and the journal has nothing to warn a successor of. The start is on the
    machine (``runtime/launched_at``, the claim) before the wrapper is started; a successor on
    this checkout starts only once this process has died (the checkout's lock), when each step
    has been made or never will be, and its look at the machine finds them. (A docker launch runs
    ``docker run`` in a shell, a launch elsewhere a command on the machine: those go on without
    this process, and are recorded.)"""
    return spec.slurm is None and spec.launch_mode == "host_process" and getattr(t, "start_host", None) is not None


def _launch_gang(c: Change, ctx: ApplyContext, out: Outcome, entry, secrets: dict) -> None:
    """Start every node of a run on several machines, or none: a node that cannot start stops the
    ones already started (the attempt is relaunched whole, never left running in part).

    The rendezvous is node 0's machine, at the address the reconciler reaches it by, on a port
    found free there now; each node learns it, its rank and the node count at launch
    (runtime/launch.env), so its bundle holds nothing that depends on where the others are."""
    transports = [ctx.transport_for(n.machine) for n in c.nodes]
    master = transports[0]
    fm = getattr(master.machine, "fleet_machine", None)
    addr = fm.ssh.host if fm is not None else "127.0.0.1"
    port = _free_port(master, addr)
    machines = [n.machine for n in c.nodes]
    started: list[tuple[object, str, str]] = []
    try:
        for rank, (n, t) in enumerate(zip(c.nodes, transports)):
            env = {"NNODES": str(len(c.nodes)), "NODE_RANK": str(rank), "MASTER_ADDR": addr, "MASTER_PORT": str(port)}
            launched, ws = _launch_one(c, ctx, entry, secrets, t, n.identity, n.gpus,
                                       gang={"rank": rank, "of": len(c.nodes), "machines": machines}, env=env,
                                       out=out if rank == 0 else None)
            started.append((t, n.identity, ws))
            n.workspace = ws
            if rank == 0:
                out.launched, out.workspace = launched, ws
    except Exception:
        for t, ident, ws in started:
            try:
                launchers.terminate(t, ident, ws, ctx.terminate_grace)
            except Exception:  # noqa: BLE001 - best effort: the next pass fences what is left
                pass
        raise
    out.launched = LaunchResult(c.identity, out.workspace, adopted=out.launched.adopted, pid=out.launched.pid)


def _free_port(t, addr: str) -> int:
    """A TCP port free on the machine now, for torchrun's rendezvous there."""
    script = ("for py in python3 python; do command -v $py >/dev/null 2>&1 && exec $py -c "
              + shlex.quote("import socket, sys; s = socket.socket(); s.bind((sys.argv[1], 0)); "
                            "print(s.getsockname()[1])") + f" {shlex.quote(addr)}; done; exit 127")
    r = t.sh(script, timeout=30)
    port = r.out.strip()
    if r.rc != 0 or not port.isdigit():
        raise TemporaryError(f"no free port for the rendezvous on {t.machine.name}: {r.err.strip()[:200]}")
    return int(port)


def slurm_job(template, eff, own=None) -> SlurmJob | None:
    """What sbatch asks for a run of a slurm template (None for other placements); ``own``: the
    run's spec.slurm, over the template's time limit, account, QOS and signal."""
    s = template.placement.slurm
    if s is None:
        return None
    r = eff.resources
    req = merged(s, own)
    return SlurmJob(env=dict(s.env), partition=s.partition, time_limit=req.time_limit, gres=s.gres,
                    sbatch_args=list(s.sbatch_args), nodes=r.nodes, gpus_per_node=r.gpu_count,
                    cpus_per_node=r.cpu_count, memory_gb=r.memory_gb, account=req.account, qos=req.qos,
                    signal=f"{req.signal.name}@{req.signal.before_s}" if req.signal else None)


def _rental_change(c: Change, ctx: ApplyContext, out: Outcome) -> Outcome:
    """Ask a provider for a machine, or give one back. A failure is never the run's end: the run
    waits (Pending, Provisioned False) and the next pass tries again."""
    try:
        if c.collect_first is not None:
            f = c.collect_first
            try:
                _collect_into(ctx, f.machine, f.identity, f.workspace, final=False)
            except ReconcilerError:
                pass  # the lost machine's logs matter less than the new machine
        adapter = ctx.providers.get(c.rental["provider"])
        if c.action == Action.PROVISION:
            offer = next(o for o in adapter.provider.spec.offers if o.id == c.rental["offer"])
            r = adapter.provision(c.rental["name"], offer)
            out.rental = {"provider": c.rental["provider"], "id": r.id, "name": r.name, "offer": offer.id,
                          "price_per_hour": r.price_per_hour if r.price_per_hour is not None else offer.price_per_hour}
        else:
            adapter.terminate(c.rental["id"])
            out.rental = dict(c.rental)
    except OfferUnavailable as e:  # no capacity there now: the next pass places on another offer
        ctx.providers.mark_bad(c.rental["provider"], e.offer, e.retry_after)
        out.ok, out.error = False, str(e)
    except ReconcilerError as e:
        out.ok, out.error = False, str(e)
    except Exception as e:  # noqa: BLE001 - one run's failure never stops the pass
        out.ok, out.error = False, f"{type(e).__name__}: {e}"
    return out


def _rental_ready(c: Change, ctx: ApplyContext, t, out: Outcome) -> None:
    """A rental is used only once SSH answers (under the pinned host key) and its GPUs are what
    the offer promised; a machine that is not is given back and its offer set aside for a while."""
    from reconciler.rentals.inventory import GpuMismatch, verify_gpus, wait_for_ssh

    out.rental_step = "ssh"
    wait_for_ssh(t, ctx.ssh_ready_timeout)
    out.rental = dict(c.rental, host_key=ctx.rental_key(c.machine))
    out.rental.pop("verify", None)
    fm = getattr(t.machine, "fleet_machine", None)
    if fm is not None:  # where it is, for the passes when the provider's API cannot say
        out.rental.update(host=fm.ssh.host, port=fm.ssh.port, user=fm.ssh.user, identity_file=fm.ssh.identity_file,
                          workspace_root=fm.workspace_root)
    want = c.rental.get("verify")
    if want:
        out.rental_step = "gpus"
        try:
            out.gpus_seen = verify_gpus(t, want)
        except GpuMismatch as e:
            try:
                ctx.providers.get(c.rental["provider"]).terminate(c.rental["id"])
            finally:
                ctx.providers.mark_bad(c.rental["provider"], c.rental.get("offer"))
            raise GpuMismatch(f"GPU check failed on {c.machine}: {e}; gave it back, offer "
                              f"{c.rental.get('offer')} set aside") from None
    out.rental_step = None


def _collect(c: Change, ctx: ApplyContext, out: Outcome) -> None:
    if c.remove:  # a leftover, or an ended run's workspace once git holds its end (endclean.py)
        _collect_leftover(c, ctx)
        return
    final = c.phase in ("Succeeded", "Failed", "Terminated")
    if c.nodes:  # each node's logs and artifacts; the run's manifest is node 0's
        for rank, n in enumerate(c.nodes):
            manifest, ws = _collect_into(ctx, n.machine, n.identity, n.workspace, final)
            if rank == 0:
                out.manifest, out.workspace = manifest, ws
    else:
        out.manifest, out.workspace = _collect_into(ctx, c.machine, c.identity, c.workspace, final)
    if final and ctx.remote_cleanup == "after_collect":
        for k in c.cleanup:
            t = ctx.transport_for(k.machine)
            launchers.finish(t, k.workspace or t.workspace(k.identity), remove=True)


def _collect_stopped(c: Change, ctx: ApplyContext, out: Outcome) -> None:
    """A run stopped for good: what it wrote until the end is collected now, as for any final end
    (a failure here only delays it: the next pass finds the instance uncollected)."""
    for k in c.kill:
        try:
            manifest, ws = _collect_into(ctx, k.machine, k.identity, k.workspace, final=True)
        except ReconcilerError:
            continue
        if node_of(k.identity) in (None, 0):  # a run on several machines: its manifest is node 0's
            out.manifest, out.workspace = manifest, ws


def _collect_leftover(c: Change, ctx: ApplyContext) -> None:
    """A leftover nothing will need again: keep its logs in the local bundle folder when it ran
    elsewhere (a bundle that never started has none), then remove its workspace, here too."""
    t = ctx.transport_for(c.machine)
    ws = c.workspace or t.workspace(c.identity)
    if c.machine != LOCAL and c.ran:
        local_dir = ctx.local_dir(c.machine, c.identity, ws)
        t.fetch(c.identity, local_dir, limits=ctx.collect_limits)
    launchers.finish(t, ws, remove=True)


def _collect_into(ctx: ApplyContext, machine: str, identity: str, workspace: str | None,
                  final: bool) -> tuple[dict, str]:
    """Fetch an attempt's artifacts into its local bundle and write its manifest there."""
    t = ctx.transport_for(machine)
    ws = workspace or t.workspace(identity)
    local_dir = ctx.local_dir(machine, identity, ws)
    p = parse(identity)
    # A run with a Storage: its checkpoints are in the bucket, and never come to this host.
    got = t.fetch(identity, local_dir, limits=ctx.collect_limits,
                  without_checkpoints=p is not None and outputs.has_storage(ctx.desired, p.name))
    # What the machine sent that is not a plain file or folder (a FIFO, a link), or beyond the
    # limits, was left out: the collection still counts (the run ends, its machine is released),
    # and what was left out is said in the manifest and the run's status.
    note = got.note()
    collection = dict(got.as_dict(), note=note) if note else None
    if local_dir.is_dir():  # artifacts/manifest.json: provenance and every artifact's size and hash
        full = provenance.write(local_dir, collection=collection)
        manifest = {"artifacts": full["run"]["artifacts"], "provenance": provenance.summary(full)}
    else:
        manifest = {"artifacts": []}
    if collection is not None:
        manifest["collection"] = collection
    # No collection removes the workspace: until git holds the end, it is the end's only record
    # (a later pass removes it: endclean.py); a failed attempt's also serves a retry's resume.
    launchers.finish(t, ws, False)
    return manifest, str(local_dir)

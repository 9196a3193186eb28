"""A run that is to run: its generation and attempt, adoption of what a lost pass launched, fencing
of stale instances, retries after a failure, stalls, and machines that do not answer.
"""

from __future__ import annotations

from functools import partial

from reconciler.core.actions import Action
from reconciler.core.identity import make, node_of, parse
from reconciler.core.names import LOCAL, SLURM_PREFIX, slurm_machine
from reconciler.core.observed import ObservedRun, ObservedWorld
from reconciler.core.plan import Change, Kill, Node, PlanSettings, bulk_change
from reconciler.core.runstatus import TERMINAL, RunStatus, iso, parse_iso
from reconciler.spec.load import DesiredState, RunEntry

from .book import PlanBook
from .fence import STARTS, hold_unseen_launches, launch_machines
from .gangs import _free_nodes, _resources, _stop_nodes
from .launch import launch as _launch
from . import ruled_out
from .render import _short
from .slurm_ends import slurm_verdict
from .stop import _on_unreachable


def _running(name: str, entry: RunEntry, prev: RunStatus | None, world: ObservedWorld, desired: DesiredState,
             settings: PlanSettings, now: float, missing: list[str], book: PlanBook) -> list[Change]:
    steady = _steady_running(name, entry, prev, world, desired, now)
    if steady is not None:
        return steady
    ended = [g for g in world.instances(name) if g.nodes and g.state != "running" and any(n.alive for n in g.nodes)]
    for g in ended:
        # Stopped by this pass's change: their room is the relaunch's.
        _free_nodes(g, book.slots, book, _resources(entry, desired, book))
    changes = _running_changes(name, entry, prev, world, desired, settings, now, missing, book)
    _hold_unseen(changes, name, entry, prev, world, desired, settings, now, book)
    for g in ended:
        # An attempt on several machines ends on every node at once: the nodes still running are
        # stopped with the run's change (their workers too: terminate stops every process that
        # carries the identity).
        _stop_nodes(changes, g)
    for c in changes:
        if c.action == Action.COLLECT and c.phase in ("Succeeded", "Failed"):
            # The run is over: the workspaces its earlier attempts left on remote machines can go
            # (they were collected when those attempts ended; local ones are the bundles themselves).
            c.cleanup = [Kill(r.machine, r.identity, r.workspace) for r in world.instances(name)
                         if r.identity != c.identity and not r.alive and r.machine != LOCAL
                         and r.state != "unknown"]
    return changes


_NONE = Action.NONE  # an Enum member looked up on its class costs a call


def _steady_running(name: str, entry: RunEntry, prev: RunStatus | None, world: ObservedWorld,
                    desired: DesiredState, now: float) -> list[Change] | None:
    """The decision for the bulk of a large fleet, without the general walk: the attempt the status
    records as Running is the run's only instance, runs (not queued, on one machine) and was built
    from the desired spec. The general path reaches ``_found_running`` with exactly these values
    then (generation and attempt as recorded, nothing stale, nothing ended to free, nothing to
    hold or clean up), so the plan is the same; None for every other case. ``now`` still reaches
    the stall check: a stall is judged every pass, as before."""
    if prev is None or prev.phase != "Running" or prev.handle is None or prev.generation <= 0 or not prev.attempt:
        return None
    digest = entry.digest
    if prev.spec.digest != digest:
        return None
    obs = world.only_instance(name)
    if obs is None:
        return None
    ident = obs.identity
    # identity.make's text, without its tuple: asked of every running run on every pass.
    if (obs.state != "running" or obs.nodes or obs.queued is not None or obs.spec_digest != digest
            or prev.handle.identity != ident or ident != f"{name}-g{prev.generation}-a{prev.attempt}"):
        return None
    base = dict(generation=prev.generation, attempt=prev.attempt, spec_digest=digest, spec_path=entry.rel)
    run = entry.run
    stalled = _stalled(run, obs, now) if run.spec.stall is not None else None
    if stalled and run.spec.stall.action == "terminate":
        return _found_running(name, entry, prev, desired, obs, ident, [], base, ident, now)
    # _found_running's last change, built as bulk_change builds a queue's (tests/planner/test_bulk_change.py).
    c = bulk_change(name, _NONE, "Running", "running", "Running", base, ident, obs.machine, None, [], [],
                    None, None, [])
    c.stalled = stalled
    return [c]


def _hold_unseen(changes, name, entry, prev, world, desired, settings, now, book) -> None:
    """A new identity waits for the machines that could hold an unrecorded launch (fence.py)."""
    if not book.any_down() or not any(c.action in STARTS for c in changes):
        return
    template = desired.templates[entry.run.spec.template]
    slurm = slurm_machine(template.placement.slurm) if template.placement.slurm is not None else None
    eff = book.effective(entry)
    rents = template.placement.kind == "rental" or template.placement.fallback == "rental"
    machines = launch_machines(name, eff, book.slots, book.candidates, slurm, rents, prev, world)
    hold_unseen_launches(changes, name, prev, world, machines, now, settings.unreachable_grace)


def _gang_changes(name, entry, prev, obs, world, desired, settings, now, launch, base, policy, stale, book):
    """What only a run on several machines needs: its staged nodes started where they were staged,
    a node whose machine does not answer waited for (the unreachable grace), a frozen node caught
    by its heartbeat. None: the common path decides (the folded instance reads like any other)."""
    ident = obs.identity
    if obs.state == "staged":
        # A pass died between staging the nodes and starting them: start them where they are, with
        # the same GPUs (the rendezvous is chosen at launch, so nothing in the bundles is stale).
        return [Change(name, Action.LAUNCH, "Launch", f"{ident} was staged but never started; starting it", "Running",
                       identity=ident, machine=obs.machine, backend=_backend(entry, desired), gpus=list(obs.gpus),
                       kill=stale, nodes=[Node(r.machine, r.identity, r.workspace, list(r.gpus)) for r in obs.nodes],
                       **base)]
    if obs.state != "running":
        return None
    if obs.unreachable:
        where = obs.unreachable[0]
        since, wait = _unreachable_wait(name, where, ident, prev, world, settings, now, base)
        if wait is not None:
            wait.kill = stale
            return [wait]
        why = f"lost: {where}, a node's machine, unreachable for {now - since:.0f}s"
        _free_nodes(obs, book.slots, book, _resources(entry, desired, book))
        return _stop_nodes(_after_failure(name, entry, prev, ident, obs, why, now, launch, base, policy,
                                          lost_at=since + settings.unreachable_grace), obs)
    frozen = [r for r in obs.nodes if r.alive and r.heartbeat_age is not None
              and r.heartbeat_age > settings.gang_heartbeat_timeout]
    if frozen:
        r = frozen[0]
        why = (f"node n{node_of(r.identity)} on {r.machine} has not beaten for {r.heartbeat_age:.0f}s "
               f"(frozen; gang_heartbeat_timeout {settings.gang_heartbeat_timeout:g}s): ending {ident} on every node")
        _free_nodes(obs, book.slots, book, _resources(entry, desired, book))
        return _stop_nodes(_after_failure(name, entry, prev, ident, obs, why, now, launch, base, policy,
                                          lost_at=now - r.heartbeat_age + settings.gang_heartbeat_timeout), obs)
    return None


def _unreachable_wait(name, where, ident, prev, world, settings, now, base) -> tuple[float, Change | None]:
    """Since when ``where`` has not answered, and the wait for it while within the unreachable
    grace (None once the grace is over: the instance there is lost)."""
    since = world.machines[where].unreachable_since or now
    left = settings.unreachable_grace - (now - since)
    if left <= 0:
        return since, None
    # No countdown in the text: an unchanged wait must leave the status byte-identical.
    return since, Change(name, Action.WAIT, "MachineUnreachable",
                         f"{where} does not answer ({world.machines[where].error or 'no reply'}); "
                         f"{ident} is declared lost at {iso(since + settings.unreachable_grace)} "
                         "if it still does not answer",
                         "Unknown", retry_after=min(left, 60.0), identity=ident,
                         machine=where, **base)


def generation_for(entry: RunEntry, prev: RunStatus | None, instances: list[ObservedRun]) -> int:
    """The generation the desired spec runs as.

    The previous one while the spec digest is unchanged, else the next. An instance found on a
    machine at that generation or later decides further: one built from this very spec is a launch
    whose status never reached git (adopt its generation); one built from any other content owns
    its generation for good, and the desired spec moves past every generation in use. So an
    identity never names two spec contents, even when status files were lost.
    """
    same_spec = prev is not None and prev.generation > 0 and prev.spec.digest == entry.digest
    gen = prev.generation if same_spec else (prev.generation + 1 if prev else 1)
    digests: dict[int, set[str | None]] = {}
    for r in instances:
        p = parse(r.identity)
        # An unreadable bundle (no job.json) that holds no process is only debris: it is rebuilt.
        if p is not None and (r.spec_digest is not None or r.alive):
            digests.setdefault(p.generation, set()).add(r.spec_digest)
    if not same_spec:
        ours = [g for g, ds in digests.items() if g >= gen and ds == {entry.digest}]
        if ours:
            gen = max(ours)
    if digests.get(gen, {entry.digest}) != {entry.digest}:
        gen = max(max(digests), gen) + 1
    return gen


def new_run(name: str, entry: RunEntry, desired: DesiredState, book: PlanBook, missing: list[str]) -> list[Change]:
    """A new run with nothing of it anywhere (no status, no instance; the bulk of a queue): nothing
    to adopt, fence or wait for, so it is the launch the cases of ``_running_changes`` would
    reach, without walking them (generation_for gives 1). ``_running`` adds nothing to it while
    every machine answers (no instance ended, no unseen launch to hold, no collect to clean up
    after), so make.py calls it directly then."""
    return _launch(name, entry, None, desired, book, missing, [], dict(
        generation=1, attempt=1, spec_digest=entry.digest, spec_path=entry.rel), 1, 1, "NewRun", "new run")


def _running_changes(name: str, entry: RunEntry, prev: RunStatus | None, world: ObservedWorld,
                     desired: DesiredState, settings: PlanSettings, now: float, missing: list[str],
                     book: PlanBook) -> list[Change]:
    """The changes of a run that is to run, by what is found of its current attempt: a gang's own
    cases, staged, unknown, not found, running, or ended."""
    run = entry.run
    policy = run.spec.restartPolicy
    instances = world.instances(name)
    if prev is None and not instances:
        return new_run(name, entry, desired, book, missing)
    gen = generation_for(entry, prev, instances)
    same_spec = prev is not None and prev.generation == gen and prev.spec.digest == entry.digest
    attempt = prev.attempt if (same_spec and prev.attempt) else 1
    for r in instances:  # an attempt launched by a pass whose status never reached git
        p = parse(r.identity)
        if p and p.generation == gen and p.attempt > attempt and r.built_for(entry.digest):
            attempt = p.attempt
    ident = make(name, gen, attempt)
    obs = _one_of(ident, world, instances, entry, prev)
    stale = [Kill(r.machine, r.identity, r.workspace) for r in instances
             if r.alive and (r.identity != ident or r is not obs)]
    base = dict(generation=gen, attempt=attempt, spec_digest=entry.digest, spec_path=entry.rel)
    changed = prev is not None and prev.generation > 0 and not same_spec

    launch = partial(_launch, name, entry, prev, desired, book, missing, stale, base, gen)
    handle_ident = prev.handle.identity if prev and prev.handle else None
    if obs is not None and obs.nodes:
        out = _gang_changes(name, entry, prev, obs, world, desired, settings, now, launch, base, policy, stale,
                            book)
        if out is not None:
            return out
    if obs is not None and obs.state == "staged":
        # Staged by an earlier pass that could not start it (or died first): finish launching it.
        return launch(attempt, "Launch", f"{ident} was staged but never started; starting it")
    if obs is not None and obs.state == "unknown":
        return [Change(name, Action.WAIT, "ObserveFailed", f"{obs.machine} cannot tell whether {ident} runs: "
                       f"{obs.message or 'no answer'}", "Unknown", identity=ident,
                       machine=obs.machine, retry_after=30.0, **base)]
    if obs is None:
        return _not_found(name, entry, prev, world, settings, now, launch, base, policy, instances, ident, gen,
                          attempt, same_spec, changed, handle_ident)
    if obs.state == "running":
        return _found_running(name, entry, prev, desired, obs, ident, stale, base, handle_ident, now)
    return _found_ended(name, entry, prev, desired, obs, ident, stale, base, handle_ident, now, launch, policy,
                        attempt)


def _one_of(ident, world, instances, entry, prev) -> ObservedRun | None:
    """The instance of ``ident``. Where a machine back after its grace holds the same identity too
    (launched by a pass whose status never reached git), the one built from this spec on the
    recorded machine is it; the other is stale, like any other attempt."""
    same = [r for r in instances if r.identity == ident]
    if len(same) < 2:
        return world.find(ident)
    where = prev.handle.machine if prev is not None and prev.handle is not None else None
    return min(same, key=lambda r: (not r.built_for(entry.digest), r.machine != where, r.machine))


def _not_found(name, entry, prev, world, settings, now, launch, base, policy, instances, ident, gen, attempt,
               same_spec, changed, handle_ident) -> list[Change]:
    """No instance of the current attempt on any machine: a wait for a machine that does not answer,
    done, lost, or a launch (new, changed spec, generation taken)."""
    unknown = _on_unreachable(world, prev)
    if unknown and handle_ident == ident:
        since, wait = _unreachable_wait(name, unknown, ident, prev, world, settings, now, base)
        if wait is not None:
            return [wait]
        return _after_failure(name, entry, prev, ident, None, f"lost: {unknown} unreachable for "
                              f"{now - since:.0f}s", now, launch, base, policy, lost_at=since + settings.unreachable_grace)
    if same_spec and prev is not None and prev.phase in TERMINAL and prev.attempt == attempt:
        return [Change(name, Action.NONE, "Done", f"{prev.phase.lower()}; nothing to do", prev.phase,
                       exit_code=prev.exit_code, identity=ident, **base)]
    if handle_ident == ident and prev is not None and prev.phase not in ("Pending", "Provisioning"):
        return _after_failure(name, entry, prev, ident, None, "lost: the workspace is gone from its machine",
                              now, launch, base, policy)
    if changed and prev.spec.digest == entry.digest:
        return launch(1, "GenerationTaken", f"generation {prev.generation} is used on a machine by another "
                                            f"spec's instance; this spec runs as generation {gen}")
    if changed:
        return launch(1, "SpecChanged", f"spec changed ({_short(prev.spec.digest)} → {_short(entry.digest)}): "
                                        f"generation {prev.generation} → {gen}")
    why = "new run" if prev is None else "not running yet"
    taken = [r.identity for r in instances if r.spec_digest != entry.digest]
    if taken:
        why += f"; {', '.join(taken)} on the machines ran another spec, so this one runs as generation {gen}"
    return launch(attempt, "NewRun" if prev is None or prev.generation == 0 else "Launch", why)


def _found_running(name, entry, prev, desired, obs, ident, stale, base, handle_ident, now) -> list[Change]:
    """The current attempt runs (or waits in Slurm's queue): adopted, stopped for a stall, or kept."""
    run = entry.run
    if obs.state == "running" and obs.queued is not None:
        return [Change(name, Action.WAIT, "Queued",
                       f"{ident} is queued in Slurm (job {obs.job}): {obs.queued}", "Pending",
                       identity=ident, machine=obs.machine, kill=stale, retry_after=15.0, **base)]
    if obs.state == "running":
        if (prev is not None and prev.phase == "Pending" and handle_ident == ident
                and obs.machine.startswith(SLURM_PREFIX)):
            return [Change(name, Action.ADOPT, "Started", f"Slurm started {ident} (job {obs.job})", "Running",
                           identity=ident, machine=obs.machine, backend=_backend(entry, desired),
                           workspace=obs.workspace, gpus=list(obs.gpus), kill=stale, **base)]
        if prev is not None and prev.phase == "Invalid" and handle_ident == ident:
            return [Change(name, Action.ADOPT, "SpecValid",
                           f"the spec is valid again; {ident} kept running on {obs.machine}",
                           "Running", identity=ident, machine=obs.machine, backend=_backend(entry, desired),
                           workspace=obs.workspace, gpus=list(obs.gpus), kill=stale, **base)]
        if prev is None or prev.phase != "Running" or handle_ident != ident:
            return [Change(name, Action.ADOPT, "Adopted",
                           f"found {ident} running on {obs.machine}; adopting it", "Running",
                           identity=ident, machine=obs.machine, backend=_backend(entry, desired), workspace=obs.workspace,
                           gpus=list(obs.gpus), kill=stale, **base)]
        stalled = _stalled(run, obs, now)
        if stalled and run.spec.stall.action == "terminate":
            return [Change(name, Action.TERMINATE, "Stalled",
                           f"{stalled}; terminating {ident} (stall.action: terminate)",
                           "Running", identity=ident, machine=obs.machine, stalled=stalled,
                           kill=stale + [Kill(obs.machine, ident, obs.workspace)], **base)]
        return [Change(name, Action.NONE if not stale else Action.TERMINATE, "Running" if not stale else "Fenced",
                       "running" if not stale else "stopping stale instances", "Running", identity=ident,
                       machine=obs.machine, kill=stale, stalled=stalled, **base)]


def _found_ended(name, entry, prev, desired, obs, ident, stale, base, handle_ident, now, launch, policy,
                 attempt) -> list[Change]:
    """The current attempt has ended: collected when it succeeded, run again after a preemption,
    else a failure (retried or final)."""
    run = entry.run
    if (obs.collected and prev is not None and prev.phase in TERMINAL and handle_ident == ident
            and prev.spec.digest == entry.digest and obs.state != "running"):
        # Its end is recorded and collected; the workspace waits for a pass that reads that end
        # from git to be removed (engine/endclean.py): nothing to decide again.
        return [Change(name, Action.NONE, "Done", f"{prev.phase.lower()}; nothing to do", prev.phase,
                       exit_code=prev.exit_code, identity=ident, **base)]
    if obs.state == "succeeded":
        if obs.collected and prev is not None and prev.phase == "Succeeded" and handle_ident == ident:
            return [Change(name, Action.NONE, "Done", "succeeded", "Succeeded", identity=ident, exit_code=0, **base)]
        return [Change(name, Action.COLLECT, "Succeeded", f"{ident} succeeded (exit 0)", "Succeeded", identity=ident,
                       machine=obs.machine, workspace=obs.workspace, exit_code=0, kill=stale, backend=_backend(entry, desired),
                       **base)]

    pre = prev.condition("Preempted") if prev is not None else None
    if pre is not None and pre.status == "True" and handle_ident == ident and obs.state != "running":
        # Stopped to make room for a run of higher priority: back when there is room, from its
        # last checkpoint, without spending a retry.
        resume = ident if getattr(run.spec.task, "resume", "never") == "auto" else None
        changes = launch(attempt + 1, "Resume", f"{ident} was preempted; running it again", resume_from=resume)
        c = changes[-1]
        if not obs.collected and c.action in (Action.RELAUNCH, Action.LAUNCH, Action.PROVISION):
            c.collect_first = Kill(obs.machine, obs.identity, obs.workspace)
        return changes

    stall = prev.condition("Stalled") if prev is not None else None
    stopped_for_stall = stall is not None and stall.status == "True"
    verdict = slurm_verdict(run, obs, ident) if obs.slurm_end else None
    if verdict is not None:  # Slurm's reason, and its bearing on a retry
        why, no_retry, code = verdict
        return _after_failure(name, entry, prev, ident, obs, why, now, launch, base, policy, no_retry=no_retry,
                              code=code)
    if obs.nodes:  # which node ended the attempt, and how
        return _after_failure(name, entry, prev, ident, obs, f"{ident} ended: {obs.message}", now, launch, base,
                              policy)
    why = {"failed": f"{ident} failed (exit {obs.exit_code})" + (f": {obs.message}" if obs.message else ""),
           "terminated": (f"{ident} was stopped after stalling ({stall.message})" if stopped_for_stall
                          else f"{ident} was terminated from outside (exit {obs.exit_code})"),
           "lost": f"{ident} is lost: no process and no result" + (f" ({obs.message})" if obs.message else "")}
    return _after_failure(name, entry, prev, ident, obs, why.get(obs.state, obs.state), now, launch, base, policy)


def _failed_at(obs: ObservedRun | None, prev: RunStatus | None, lost_at: float | None) -> float:
    """When the instance ended, for the backoff: its result, else when it was declared lost, else
    the last recorded transition, else its start. Never 'now': a clock that moves with every pass
    would push the relaunch back for ever."""
    for t in (obs.finished_at if obs is not None else None, lost_at,
              parse_iso(prev.history[-1].time) if prev is not None and prev.history else None,
              obs.started_at if obs is not None else None):
        if t:
            return float(t)
    return 0.0


def _stalled(run, obs: ObservedRun, now: float) -> str | None:
    """Why a running instance counts as stalled under ``spec.stall``, or None (pure: reads obs and now).

    Progress is the time of the last training step the probe saw (its logging.jsonl); before the
    first step, the instance's start. No progress for ``stall.afterSeconds`` is a stall.
    """
    stall = run.spec.stall
    if stall is None:
        return None
    last = parse_iso((obs.progress or {}).get("updated_at")) or obs.started_at
    if last is None:
        return None
    idle = now - last
    if idle <= stall.afterSeconds:
        return None
    since = f"step {obs.progress['step']}" if obs.progress and obs.progress.get("step") is not None else "the start"
    # No running count in the text: a message that changed every pass would rewrite the status every pass.
    return f"no training progress since {since} at {iso(last)} (stall.afterSeconds {stall.afterSeconds:g})"


def _after_failure(name, entry, prev, ident, obs, why, now, launch, base, policy, lost_at=None, no_retry=None,
                   code="Failed") -> list[Change]:
    """``no_retry``: why this end is never retried (else the restart policy decides); ``code``:
    the status's reason when the run stays failed."""
    attempt = base["attempt"]
    exit_code = obs.exit_code if obs is not None else None
    retries_used = attempt - 1 - ((prev.preemptions or 0) if prev is not None else 0)  # preemptions are not failures
    moved, ruled = ruled_out.elsewhere(name, entry, prev, ident, obs, why, launch, base)  # the machine's end
    if moved is not None:
        return moved
    retries_used -= ruled_out.not_retries(prev, base["generation"])  # nor ends on a ruled-out machine
    if obs is not None and obs.permanent and no_retry is None:  # e.g. the precheck refused the environment
        no_retry = "not retried: retrying cannot help"
    if no_retry is not None:
        policy = type(policy)(maxRetries=0, backoffSeconds=policy.backoffSeconds)
    no_retry = no_retry or "no retries left"
    if retries_used < policy.maxRetries:
        finished = _failed_at(obs, prev, lost_at)
        left = finished + policy.backoffSeconds - now
        if left > 0:
            # A time, not a countdown: the status of a run waiting out its backoff stays byte-identical.
            c = Change(name, Action.WAIT, "BackOff",
                       f"{why}; retry {retries_used + 1}/{policy.maxRetries} at {iso(finished + policy.backoffSeconds)}",
                       "Pending",
                       retry_after=left, identity=ident, exit_code=exit_code, **base)
            if obs is not None and not obs.collected:
                c.action, c.machine, c.workspace = Action.COLLECT, obs.machine, obs.workspace
            return [c]
        resume = ident if getattr(entry.run.spec.task, "resume", "never") == "auto" else None
        changes = launch(attempt + 1, "Relaunch", f"{why}; retry {retries_used + 1}/{policy.maxRetries}",
                         resume_from=resume)
        c = changes[-1]
        if obs is not None and not obs.collected and c.action in (Action.RELAUNCH, Action.PROVISION):
            # Its logs and manifest (a relaunch on a new rental asks for the machine first).
            c.collect_first = Kill(obs.machine, obs.identity, obs.workspace)
        return changes
    phase = "Failed"
    if obs is not None and not obs.collected:
        return [Change(name, Action.COLLECT, code, f"{why}; {no_retry}", phase, identity=ident,
                       machine=obs.machine, workspace=obs.workspace, exit_code=exit_code, ruled_out=ruled, **base)]
    if prev is not None and prev.phase == phase and prev.attempt == attempt:
        return [Change(name, Action.NONE, "Done", "failed; no retries left", phase, identity=ident,
                       exit_code=prev.exit_code, **base)]
    return [Change(name, Action.NONE, code, f"{why}; {no_retry}", phase, identity=ident, exit_code=exit_code,
                   **base)]


def _backend(entry: RunEntry, desired: DesiredState) -> str | None:
    t = desired.templates.get(entry.run.spec.template)
    return t.backend_key if t else None

"""Summarizing: a plan's change, its outcome and what was observed, turned into a run's next status.

This module is the one place that computes conditions, transitions, a rental's steps and what the
run's machines cost; ``store.py`` writes the result. A steady run's status is refreshed without a
copy, so an unchanged status stays the same object and the same bytes.
"""

from __future__ import annotations

import functools
from typing import Any

from reconciler.core.actions import Action
from reconciler.core.runstatus import (DIRTY, HISTORY_LIMIT, TERMINAL, Condition, Handle, RunStatus, Transition, cost_so_far,
                                        iso, parse_iso)

CURVE_POINTS = 120
# A pass summarizes every run at one ``now``: its text is made once, not for each condition and
# transition of each of thousands of statuses.
_iso = functools.lru_cache(maxsize=8)(iso)


def extend_curve(curve: list, progress: dict[str, Any] | None) -> list:
    """The curve with the progress's (step, loss) added. A step at or before the last one (a run
    that restarted from scratch, or from an earlier checkpoint) first drops the points it replaces;
    a full curve keeps its first and last points and every other one between, so it stays bounded
    and still spans the whole run."""
    if not progress:
        return curve
    step, loss = progress.get("step"), progress.get("loss")
    if isinstance(step, bool) or not isinstance(step, int) or isinstance(loss, bool) or not isinstance(loss, (int, float)):
        return curve
    try:
        value = round(float(loss), 6)
    except OverflowError:  # an int beyond the float range: no point to draw
        return curve
    if curve and curve[-1][0] == step and curve[-1][1] == value:
        return curve
    out = [tuple(p) for p in curve if p[0] < step] + [(step, value)]
    if len(out) > CURVE_POINTS:
        out = [out[0]] + out[1:-1][1::2] + [out[-1]]
    return out


def extend_curve_with(curve: list, points: list, progress: dict[str, Any] | None) -> list:
    """The curve with every point logged since it was last extended (``points``: the machine's
    last logged steps, oldest first; those at or before the curve's end are already on it), then
    the progress's own. A run that restarted (its newest step at or before the curve's end) is
    left to ``extend_curve``, which drops the points it replaces."""
    last = curve[-1][0] if curve else None
    newest = progress.get("step") if progress else None
    if last is not None and isinstance(newest, int) and newest > last:
        for step, loss in points:
            if step > last and step < newest:
                curve = extend_curve(curve, {"step": step, "loss": loss})
    elif last is None:
        for step, loss in points:
            if not isinstance(newest, int) or step < newest:
                curve = extend_curve(curve, {"step": step, "loss": loss})
    return extend_curve(curve, progress)


# ---------------------------------------------------------------- conditions and transitions


def set_condition(st: RunStatus, type_: str, status: str, reason: str, message: str, now: float) -> None:
    """Set a condition; its last_transition moves only when its status flips."""
    cur = st.condition(type_)
    if cur is None:
        st.conditions.append(Condition(type=type_, status=status, reason=reason, message=message, last_transition=_iso(now)))
        st.conditions.sort(key=lambda c: c.type)
        return
    if cur.status != status:
        cur.last_transition = _iso(now)
    cur.status, cur.reason, cur.message = status, reason, message


def record(st: RunStatus, phase: str, reason: str, now: float) -> None:
    """Move to a phase; a history entry is added when phase, generation or attempt changes."""
    last = st.history[-1] if st.history else None
    if last is None and st.created_at is None:
        st.created_at = _iso(now)
    if last is None or (last.phase, last.generation, last.attempt) != (phase, st.generation, st.attempt):
        st.history.append(Transition(time=_iso(now), phase=phase, generation=st.generation, attempt=st.attempt,
                                     reason=reason[:200]))
        st.history = st.history[-HISTORY_LIMIT:]
    st.phase = phase


# What a running training run changes on every pass without anything happening to it.
PROGRESS_ONLY = {"observed_at", "progress", "loss_curve", "cost"}


def progress_only(a: RunStatus | None, b: RunStatus) -> bool:
    """Whether ``b`` differs from ``a`` in progress alone: such a change can wait for the next
    progress write (``status_progress_interval``) without anyone missing a transition."""
    if a is None:
        return False
    return a.model_dump(exclude=PROGRESS_ONLY) == b.model_dump(exclude=PROGRESS_ONLY)


def same_ignoring_time(a: RunStatus | None, b: RunStatus) -> bool:
    if a is None:
        return False
    return a.model_dump(exclude={"observed_at"}) == b.model_dump(exclude={"observed_at"})


# ---------------------------------------------------------------- summarize


def records_new_spec(prev: RunStatus | None, change) -> bool:
    """Whether the status of ``change``'s run records another spec than ``prev`` did (a new spec
    digest or generation): then its spec commit is written anew."""
    return prev is None or prev.spec.digest != change.spec_digest or prev.generation != change.generation


def summarize(prev: RunStatus | None, change, outcome, obs, now: float, spec_commit: str | None) -> RunStatus:
    """The next status of one run, from its change, the change's outcome and what was observed.

    ``change`` is a plan.Change, ``outcome`` an apply.Outcome or None (nothing was done), ``obs`` the
    observed instance of the current identity or None. One reason per change: the change's.
    """
    if _steady(prev, change, outcome):
        return _refresh(prev, change, obs, now)
    st = prev.model_copy(deep=True) if prev is not None else RunStatus(name=change.name)
    new_spec = records_new_spec(st, change)
    if change.ruled_out is not None or st.generation != change.generation:  # a new generation: none ruled out
        st.ruled_out = change.ruled_out or None
    st.generation, st.attempt = change.generation, change.attempt
    if change.spec_digest:
        if new_spec:
            dirty = spec_commit == DIRTY
            st.spec.commit, st.spec.dirty = (None, True) if dirty else (spec_commit, None)
        st.spec.digest, st.spec.path = change.spec_digest, change.spec_path

    failed = outcome is not None and not outcome.ok
    if failed:
        _failed(st, change, outcome, now)
    elif change.phase is not None:
        _moved(st, change, outcome, obs, now)
    _rental_status(st, change, outcome, now)
    _placed(st, prev, change, outcome)
    if outcome is not None and outcome.ok and outcome.manifest is not None:
        _collected(st, outcome, now)
    if obs is not None and obs.progress:
        st.progress = obs.progress
        st.loss_curve = extend_curve_with(st.loss_curve, obs.curve, obs.progress)
    _outputs(st, outcome, obs)
    return st


def _outputs(st: RunStatus, outcome, obs) -> None:
    """A run with a Storage: what its machine reported uploading (engine/outputs.py checked it and
    kept the generation's earlier checkpoints), else, at a launch, where this attempt's outputs go
    (the generation's checkpoints recorded so far kept: they are still in the bucket)."""
    if obs is not None and getattr(obs, "outputs", None) is not None:
        st.outputs = obs.outputs
        return
    new = getattr(outcome, "outputs", None) if outcome is not None and outcome.ok else None
    if new is None:
        return
    old = st.outputs if isinstance(st.outputs, dict) and st.outputs.get("uri") == new.get("uri") else {}
    st.outputs = dict(new, checkpoints=list(old.get("checkpoints") or []))


def _failed(st: RunStatus, change, outcome, now: float) -> None:
    """The change's action failed: for good (the run fails), or to be retried."""
    if outcome.permanent:
        st.exit_code = None
        record(st, "Failed", outcome.error, now)
        st.message = outcome.error
        set_condition(st, "Ready", "False",
                      "LaunchFailed" if change.action in (Action.LAUNCH, Action.RELAUNCH) else "Error",
                      outcome.error, now)
    else:
        phase = st.phase if change.action not in (Action.LAUNCH, Action.RELAUNCH) else "Pending"
        record(st, phase, f"{change.action} failed: {outcome.error}", now)
        st.message = f"{change.action} failed, will retry: {outcome.error}"
        set_condition(st, "Ready", "False", "RetryableError", outcome.error, now)


def _moved(st: RunStatus, change, outcome, obs, now: float) -> None:
    """The change has a phase: the transition to it, the exit code, the retry time, the handle as
    observed, and the conditions."""
    if change.action in (Action.LAUNCH, Action.RELAUNCH, Action.ADOPT) and (outcome is None or outcome.ok):
        _launched(st, change, outcome, obs, now)
    elif change.action == Action.NONE:
        st.phase = change.phase
        if not st.history:
            record(st, change.phase, change.reason, now)
            st.message = change.reason
    else:
        record(st, change.phase, change.reason, now)
        st.message = change.reason
    if change.exit_code is not None or change.phase in ("Succeeded", "Failed"):
        st.exit_code = change.exit_code if change.exit_code is not None else st.exit_code
    st.retry_at = iso(now + change.retry_after) if change.code == "BackOff" and change.retry_after else None
    if obs is not None and change.identity == obs.identity and (
            st.handle is None or st.handle.identity != obs.identity):
        # The change is about an instance the status does not name yet (launched by a pass
        # whose status never reached git, then found ended): the handle must name it, or the
        # status would pin its end to another instance under this spec.
        st.handle = Handle(backend=change.backend, machine=obs.machine, identity=obs.identity,
                           workspace=obs.workspace, pid=obs.pid, container=obs.container, job=obs.job,
                           gpus=list(obs.gpus), nodes=_nodes(None, obs),
                           launched_at=iso(obs.started_at) if obs.started_at else None)
    if st.handle is not None and obs is not None and obs.pid and st.handle.identity == obs.identity:
        st.handle.pid = st.handle.pid or obs.pid
    if st.handle is not None and obs is not None and obs.job and st.handle.identity == obs.identity:
        st.handle.job = st.handle.job or obs.job
    _conditions(st, change, now)


def _launched(st: RunStatus, change, outcome, obs, now: float) -> None:
    """A launch, relaunch or adoption that went through: the handle names the new instance."""
    launched = outcome.launched if outcome is not None else None
    ws = (launched.workspace if launched else None) or change.workspace
    if change.action == Action.ADOPT or launched is not None:
        keep_time = st.handle is not None and st.handle.identity == change.identity and st.handle.launched_at
        st.handle = Handle(
            backend=change.backend, machine=change.machine, identity=change.identity, workspace=ws,
            pid=(launched.pid if launched else None) or (obs.pid if obs else None),
            container=(launched.container if launched else None) or (obs.container if obs else None),
            job=(launched.job if launched else None) or (obs.job if obs else None),
            gpus=list(change.gpus), launched_at=st.handle.launched_at if keep_time else _iso(now),
            nodes=_nodes(change, obs),
        )
    st.exit_code = None
    st.retry_at = None
    if change.action in (Action.LAUNCH, Action.RELAUNCH) and launched is not None and not launched.adopted:
        st.progress = None  # the previous attempt's progress is not this one's
        # Nor its artifacts and provenance: a status shows what the attempt that runs is made of
        # (the earlier one's stay in its collected bundle and manifest).
        st.artifacts, st.provenance = [], None
    if launched is not None and launched.adopted:
        reason = f"{change.reason} (found {change.identity} already running: adopted)"
    else:
        reason = change.reason
    record(st, change.phase, reason, now)
    st.message = reason


def _placed(st: RunStatus, prev: RunStatus | None, change, outcome) -> None:
    """A preemption counted once, and what placement considered."""
    if change.code == "Preempted" and change.phase is not None and (outcome is None or outcome.ok) and (
            prev is None or prev.condition("Preempted") is None or prev.condition("Preempted").status != "True"):
        st.preemptions = (st.preemptions or 0) + 1
    if change.considered and change.phase is not None and (outcome is None or outcome.ok):
        # A plain string: the status file is YAML, and PyYAML's safe writer refuses the enum.
        st.placement = {"action": str(change.action), "code": change.code, "considered": list(change.considered[:20])}


def _collected(st: RunStatus, outcome, now: float) -> None:
    """What a collection brought back: artifacts, provenance, and whether it left anything out."""
    arts = outcome.manifest.get("artifacts", [])
    st.artifacts = [{"path": a["path"], "size": a["size"]} for a in arts[:30]]
    if len(arts) > 30:
        st.artifacts.append({"path": f"... {len(arts) - 30} more (see artifacts/manifest.json)", "size": 0})
    if outcome.manifest.get("provenance"):
        st.provenance = outcome.manifest["provenance"]
    # A collection that left entries out (links, FIFOs, over the limits) still counts; the
    # condition says what it left out, and goes back to True once one leaves nothing out.
    collection = outcome.manifest.get("collection")
    if collection and collection.get("note"):
        reason = "LimitReached" if collection.get("truncated") else "EntriesSkipped"
        set_condition(st, "ArtifactsComplete", "False", reason, str(collection["note"])[:1000], now)
    elif st.condition("ArtifactsComplete") is not None:
        set_condition(st, "ArtifactsComplete", "True", "Complete", "", now)


RENTAL_WAITS = ("BudgetReached", "RentalLimit", "CostLimit", "ProviderUnavailable", "NoOffer", "NoProvider")


def _rental_status(st: RunStatus, change, outcome, now: float) -> None:
    """A rental's steps as conditions (Provisioned, SshReady, GpuVerified), its record in the
    handle, and what the run's machines cost. Cost is counted from the launch on a rental until
    the run leaves it (ends, or moves to another machine): ``since`` marks an open stretch, and
    ``so_far`` holds the closed ones, so a running run's status stays byte-identical."""
    rental = (outcome.rental if outcome is not None and outcome.rental else None) or change.rental
    ok = outcome is None or outcome.ok
    if change.action == Action.PROVISION and rental:
        if ok:
            st.handle = Handle(identity=change.identity, rental={k: rental.get(k) for k in
                                                                 ("provider", "id", "name", "offer", "price_per_hour")})
            set_condition(st, "Provisioned", "False", "Provisioning", f"asked {rental['provider']} for "
                          f"{rental['offer']} ({rental['name']})", now)
        else:
            set_condition(st, "Provisioned", "False", "ProvisionFailed", outcome.error, now)
    elif change.action == Action.WAIT and change.code == "Provisioning" and rental:
        if st.handle is None or st.handle.rental is None or st.handle.rental.get("id") != rental.get("id"):
            st.handle = Handle(identity=change.identity, rental={k: rental.get(k) for k in
                                                                 ("provider", "id", "name", "offer", "price_per_hour")})
        set_condition(st, "Provisioned", "False", "Provisioning", change.reason, now)
    elif change.action == Action.WAIT and change.code in RENTAL_WAITS:
        set_condition(st, "Provisioned", "False", change.code, change.reason, now)
    elif change.action in (Action.LAUNCH, Action.RELAUNCH) and rental:
        set_condition(st, "Provisioned", "True", "Running", f"{change.machine} ({rental.get('offer')})", now)
        step = outcome.rental_step if outcome is not None else None
        if ok or step == "gpus":
            set_condition(st, "SshReady", "True", "Connected", f"host key {_key_note(rental.get('host_key'))}", now)
        elif step == "ssh":
            set_condition(st, "SshReady", "False", "NotAnswering", outcome.error, now)
        if step == "gpus":
            set_condition(st, "GpuVerified", "False", "GpuMismatch", outcome.error, now)
        elif ok and outcome is not None:
            seen = outcome.gpus_seen
            set_condition(st, "GpuVerified", "True", "Verified" if seen else "NoGpu", seen or "the offer has no GPU", now)
        if ok and st.handle is not None and st.handle.machine == change.machine:
            st.handle.rental = {k: rental.get(k) for k in ("provider", "id", "name", "offer", "price_per_hour",
                                                           "host_key", "host", "port", "user", "identity_file",
                                                           "workspace_root") if rental.get(k) is not None}
            _close_cost(st, now)
            st.cost = dict(st.cost or {}, provider=rental.get("provider"), machine=change.machine,
                           price_per_hour=rental.get("price_per_hour"), since=iso(now))
            st.cost.setdefault("so_far", 0.0)
    if st.cost and st.cost.get("since") and (
            st.phase in TERMINAL or st.phase == "Pending"
            or (st.handle is not None and st.handle.machine != st.cost.get("machine"))):
        _close_cost(st, now)


def _close_cost(st: RunStatus, now: float) -> None:
    cost = st.cost or {}
    if parse_iso(cost.get("since")) is None:
        return
    total = cost_so_far(st, now)
    st.cost = {k: v for k, v in cost.items() if k not in ("since", "machine")}
    st.cost["so_far"] = round(total, 4)


def _nodes(change, obs) -> list[dict] | None:
    """The nodes of a run on several machines, for its handle: as launched, else as observed."""
    if change is not None and change.nodes:
        return [{"rank": k, "machine": n.machine, "identity": n.identity, "workspace": n.workspace}
                for k, n in enumerate(change.nodes)]
    if obs is not None and obs.nodes:
        from reconciler.core.identity import node_of

        return [{"rank": node_of(r.identity), "machine": r.machine, "identity": r.identity, "workspace": r.workspace}
                for r in obs.nodes]
    return None


def _key_note(key: str | None) -> str:
    return f"{key.split()[0]} …{key.split()[1][-12:]}" if key and len(key.split()) > 1 else "pinned"


def _steady(prev: RunStatus | None, change, outcome) -> bool:
    """Nothing happened to this run: same phase, generation, attempt and spec, no action taken.
    Asked of every run on every pass, so the conditions are walked once, in line."""
    if (outcome is not None or prev is None or change.action != Action.NONE or prev.phase != change.phase
            or prev.generation != change.generation or prev.attempt != change.attempt or not prev.history
            or (change.spec_digest is not None and prev.spec.digest != change.spec_digest)):
        return False
    # A condition left over from a passing trouble (a machine that answers again) needs the full path.
    for c in prev.conditions:
        if c.type == "MachineReachable":
            return c.status == "True"
    return True


_NONE = Action.NONE  # an Enum member looked up on its class costs a call


def unchanged(prev: RunStatus | None, change, obs) -> bool:
    """Whether ``summarize`` of ``change`` without an outcome returns ``prev`` itself: ``_steady``
    and ``_refresh`` finding nothing that moved, with the conditions walked once. Asked first of
    every run of a pass (engine/loop.py), so that the bulk of a steady pass makes no other call;
    tests/status/test_unchanged.py holds it to summarize."""
    if (prev is None or change.action != _NONE or prev.phase != change.phase
            or prev.generation != change.generation or prev.attempt != change.attempt or not prev.history
            or (change.spec_digest is not None and prev.spec.digest != change.spec_digest)):
        return False
    reachable = stall = None
    for c in prev.conditions:
        if c.type == "MachineReachable":
            if reachable is None:
                reachable = c
        elif c.type == "Stalled" and stall is None:
            stall = c
    if reachable is not None and reachable.status != "True":
        return False
    stalled = change.stalled
    if stalled:
        if stall is None or stall.status != "True" or stall.message != stalled:
            return False
    elif stall is not None and stall.status == "True" and change.phase == "Running":
        return False
    if obs is None:
        return True
    if obs.progress and obs.progress != prev.progress:
        return False
    if prev.handle is not None and obs.pid and not prev.handle.pid:
        return False
    outputs = getattr(obs, "outputs", None)
    return outputs is None or outputs == prev.outputs


def _refresh(prev: RunStatus, change, obs, now: float) -> RunStatus:
    """A steady run's status: only progress and the Stalled condition can move. Returns ``prev``
    itself when nothing did, so the common case costs no copy and no comparison."""
    progress = obs.progress if obs is not None and obs.progress else None
    stalled = change.stalled
    cur = None
    for c in prev.conditions:
        if c.type == "Stalled":
            cur = c
            break
    stall_moves = (stalled and (cur is None or cur.status != "True" or cur.message != stalled)) or (
        not stalled and cur is not None and cur.status == "True" and change.phase == "Running")
    pid_moves = prev.handle is not None and obs is not None and obs.pid and not prev.handle.pid
    outputs = getattr(obs, "outputs", None) if obs is not None else None
    outputs_move = outputs is not None and outputs != prev.outputs
    if (progress is None or progress == prev.progress) and not stall_moves and not pid_moves and not outputs_move:
        return prev
    st = prev.model_copy(deep=True)
    if outputs_move:
        st.outputs = outputs
    if progress is not None:
        st.progress = progress
        st.loss_curve = extend_curve_with(st.loss_curve, obs.curve, progress)
    if stalled:
        set_condition(st, "Stalled", "True", "NoProgress", stalled, now)
    elif stall_moves:
        set_condition(st, "Stalled", "False", "Progressing", "", now)
    if pid_moves:
        st.handle.pid = obs.pid
    return st


def _conditions(st: RunStatus, change, now: float) -> None:
    code = change.code
    if change.phase == "Invalid":
        set_condition(st, "SpecValid", "False", "ValidationFailed", change.reason, now)
        return
    set_condition(st, "SpecValid", "True", "Valid", "", now)
    if code == "MachineUnreachable":
        set_condition(st, "MachineReachable", "False", "Unreachable", change.reason, now)
    elif st.handle is not None and change.action != Action.WAIT:
        set_condition(st, "MachineReachable", "True", "Reachable", "", now)
    if code == "SecretMissing":
        set_condition(st, "SecretsAvailable", "False", "SecretMissing", change.reason, now)
    elif (st.condition("SecretsAvailable") is not None
          and change.action in (Action.LAUNCH, Action.RELAUNCH, Action.ADOPT)):
        set_condition(st, "SecretsAvailable", "True", "SecretsSet", "", now)
    if code == "Preempted":
        set_condition(st, "Preempted", "True", "Preempted", change.reason, now)
    elif st.condition("Preempted") is not None and change.action in (Action.LAUNCH, Action.RELAUNCH, Action.ADOPT):
        set_condition(st, "Preempted", "False", "Placed", "", now)
    if code == "NoCapacity" or code == "NoMachine":
        set_condition(st, "Scheduled", "False", code, change.reason, now)
    elif change.machine:
        set_condition(st, "Scheduled", "True", "Placed", f"on {change.machine}", now)
    phase = change.phase
    if phase == "Running":
        set_condition(st, "Ready", "True", "Running", "", now)
    elif phase == "Succeeded":
        set_condition(st, "Ready", "False", "Succeeded", "", now)
    elif phase in ("Failed", "Terminated", "Pending"):
        set_condition(st, "Ready", "False", code, change.reason, now)
    # spec.stall: the planner says whether a running instance made no progress; the condition lives here.
    stalled = change.stalled
    if stalled:
        set_condition(st, "Stalled", "True", "NoProgress", stalled, now)
    elif phase == "Running" and st.condition("Stalled") is not None and change.identity == (
            st.handle.identity if st.handle else None):
        set_condition(st, "Stalled", "False", "Progressing", "", now)

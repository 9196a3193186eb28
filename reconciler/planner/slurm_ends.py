"""What a Slurm job's end means for its run: Slurm's own reason in the status, and whether to retry.

Slurm knows why a job ended where the launch wrapper saw only a signal: the probe reports its end
state (core/slurm_end.py). An admin's cancel (any cancel the reconciler did not issue) is a
decision to respect: the run fails with who cancelled it and is not relaunched until its spec
changes. A time limit repeats itself unless the run can pick up where it stopped, so a TIMEOUT is
retried only when the run has a checkpoint to resume from. A node failure, a preemption, the OOM
killer and plain failures follow the restart policy.
"""

from __future__ import annotations

from reconciler.core.observed import ObservedRun


def can_resume(run, obs: ObservedRun) -> bool:
    """Whether a relaunch continues the run rather than starting it over: a complete checkpoint
    in its workspace (the probe lists them) and a task that resumes from it (resume: auto; a
    command task finds its own checkpoints)."""
    return bool(obs.checkpoints) and getattr(run.spec.task, "resume", "auto") != "never"


def slurm_verdict(run, obs: ObservedRun, ident: str) -> tuple[str, str | None, str] | None:
    """(why the attempt ended, why it is not retried or None to let the restart policy decide,
    the status's reason); None when Slurm's end changes nothing (a success, the reconciler's own
    cancel)."""
    end = obs.slurm_end or {}
    state = end.get("state")
    job = obs.job or "?"
    if state is None or state == "COMPLETED" or (state == "CANCELLED" and end.get("ours")):
        return None
    if state == "CANCELLED":
        who = end.get("by")
        why = (f"{ident} was cancelled by {who} (Slurm job {job})" if who else
               f"{ident} was cancelled outside the reconciler (Slurm job {job}; without accounting Slurm "
               "records no user)")
        return why, "not relaunched: a cancel from outside is respected until the spec changes", "CancelledInSlurm"
    if state == "TIMEOUT":
        why = f"{ident} reached its Slurm time limit (TIMEOUT, job {job})"
        if can_resume(run, obs):
            return why + f"; resumable from {obs.checkpoints[-1]}", None, "TimeLimit"
        return why, "not retried: it has no checkpoint to resume from, so it would time out again", "TimeLimit"
    if end.get("rank") is not None:
        why = f"{ident} failed: rank {end['rank']} exited {end.get('rank_exit')} (Slurm job {job} {state})"
    else:
        why = f"{ident} ended {state} in Slurm (job {job}, exit {obs.exit_code})"
    reason = {"NODE_FAIL": "NodeFail", "PREEMPTED": "PreemptedInSlurm", "OUT_OF_MEMORY": "OutOfMemory"}.get(
        state, "Failed")
    return why, None, reason

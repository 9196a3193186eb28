"""How a Slurm job ended, in Slurm's own words: its end state, who cancelled it, which rank failed.

The launch wrapper's result says only what it saw (a SIGTERM reads as "terminated", srun's code as
the job's). Slurm knows why: a time limit (TIMEOUT), a node that died (NODE_FAIL), the OOM killer
(OUT_OF_MEMORY), preemption (PREEMPTED), a cancel, and which user cancelled. The reconciler's own
cancels leave runtime/cancel_requested first, so any other cancel is someone else's. What is read
here is kept in runtime/slurm_end.json, so each ended job costs Slurm one question. Standard
library only, like the rest of the agent.
"""

from __future__ import annotations

import json
import os
import pwd
import re

from .readings import _read, _small_int

# Slurm's job end states (man squeue, JOB STATE CODES); any other reads as OTHER.
SLURM_END_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                    "BOOT_FAIL", "DEADLINE")
_TOKEN = re.compile(r"^[A-Za-z0-9_.+-]{1,64}$")
RANK_FILES = 256  # at most this many runtime/rank-N.exit files are read


def job_fields(out):
    """``scontrol -o show job``'s one line → its key=value fields."""
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def first_failed_rank(rt):
    """(rank, exit code) of the first rank of a multi-node job that failed on its own, or None.

    Each node's task writes runtime/rank-N.exit ("<code> <unix time>") when its entrypoint ends.
    A rank that failed by itself exits with its own code; the others are then killed by srun
    (--kill-on-bad-exit), ending by a signal (codes over 128) or not writing at all. So: the
    earliest of the codes 1..128, else the earliest non-zero."""
    try:
        names = sorted(os.listdir(rt))[:4096]
    except OSError:
        return None
    found = []
    for n in names:
        m = re.fullmatch(r"rank-([0-9]{1,4})\.exit", n)
        if not m:
            continue
        parts = (_read(os.path.join(rt, n), 64) or "").split()
        code = _small_int(parts[0], 3) if parts else None
        at = _small_int(parts[1], 12) if len(parts) > 1 else None
        if code:
            found.append((code > 128, at or 0, int(m.group(1)), code))
        if len(found) >= RANK_FILES:
            break
    if not found:
        return None
    _, _, rank, code = min(found)
    return rank, code


def _user_of(uid_text):
    uid = _small_int(uid_text, 10)
    if uid is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return str(uid)


def cancelled_by(job_id, env, slurm):
    """Who cancelled a job: accounting's "CANCELLED by <uid>" (sacct; slurmdbd keeps it), as a
    user name; None when the cluster keeps no accounting (scontrol and the job completion file do
    not say who)."""
    rc, out, _ = slurm(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State"], env)
    if rc != 0:
        return None
    m = re.search(r"CANCELLED by ([0-9]{1,10})", out)
    return _user_of(m.group(1)) if m else None


def read_end(rt, job_id, env, slurm):
    """Slurm's end of ``job_id``: {"state", "reason", "ours"|"by", "rank", "rank_exit"}; "active"
    while Slurm has not ended it yet; None when Slurm no longer knows it. Kept in slurm_end.json."""
    kept = _read(os.path.join(rt, "slurm_end.json"), 4096)
    if kept is not None:
        try:
            end = json.loads(kept)
        except (ValueError, RecursionError):
            end = None
        if isinstance(end, dict):
            return end
    rc, out, _ = slurm(["scontrol", "-o", "show", "job", job_id], env)
    if rc != 0:
        return None
    info = job_fields(out)
    state = (info.get("JobState") or "").split("+")[0]
    if state not in SLURM_END_STATES:
        # Still queued or running, or COMPLETING: not ended yet (its processes may still live).
        return "active" if state else None
    end = {"state": state, "job": job_id}
    reason = info.get("Reason", "")
    if _TOKEN.match(reason) and reason != "None":
        end["reason"] = reason
    code = _small_int(info.get("ExitCode", "").split(":")[0], 3)
    if code is not None:
        end["exit_code"] = code
    if state == "CANCELLED":
        if os.path.exists(os.path.join(rt, "cancel_requested")):
            end["ours"] = True
        else:
            by = cancelled_by(job_id, env, slurm)
            if by:
                end["by"] = by
    rank = first_failed_rank(rt)
    if rank is not None:
        end["rank"], end["rank_exit"] = rank
    try:
        tmp = os.path.join(rt, "slurm_end.json.tmp")
        with open(tmp, "w") as fh:
            json.dump(end, fh)
        os.replace(tmp, os.path.join(rt, "slurm_end.json"))
    except OSError:
        pass  # asked again next time
    return end


def describe(end, job_id):
    """A short sentence of a Slurm end, for the run's message."""
    state = end.get("state", "")
    if state == "CANCELLED":
        if end.get("ours"):
            return f"Slurm job {job_id} was cancelled by the reconciler"
        who = end.get("by")
        return f"Slurm job {job_id} was cancelled by {who}" if who else \
            f"Slurm job {job_id} was cancelled outside the reconciler (Slurm recorded no user: no accounting)"
    text = f"Slurm job {job_id} ended {state}"
    if end.get("rank") is not None:
        text += f": rank {end['rank']} exited {end.get('rank_exit')}"
    elif end.get("reason") and state not in ("TIMEOUT",):
        text += f" ({end['reason']})"
    return text


def apply_end(run, end, job_id):
    """Slurm's end into a run entry: its state when the wrapper left none, the failed rank's exit
    code, and the bounded record the trust boundary checks (run["slurm_end"])."""
    state = end.get("state", "")
    had_result = run.get("state") in ("succeeded", "failed", "terminated")
    if not had_result:
        run["state"] = "terminated" if state == "CANCELLED" else "failed"
        if run.get("exit_code") is None:
            run["exit_code"] = end.get("exit_code") or (143 if state == "CANCELLED" else 1)
    if run["state"] == "succeeded" and state == "COMPLETED":
        return
    if end.get("rank_exit") is not None:
        run["exit_code"] = end["rank_exit"]
    run["message"] = describe(end, job_id) + ("" if had_result else " without a result")
    run["slurm_end"] = {k: end[k] for k in ("state", "ours", "by", "rank", "rank_exit") if k in end}

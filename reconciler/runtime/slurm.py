"""The agent's Slurm half: squeue, scontrol and scancel, for workspaces submitted to a cluster.

A workspace submitted to Slurm (``runtime/slurm.json``) is judged by Slurm, not by a local pid: its
job runs on another node. One ``squeue`` per cluster answers for all of them (queued, with Slurm's
reason; running; ended), and ``scontrol show job`` for a job that ended without the wrapper's
result; stopping such a run is ``scancel``. Standard library only, like the rest of the agent.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

from .readings import TOOL_TIMEOUT, _read, _result, _small_int


# Slurm job states (squeue %T). Queued: not started yet, the reason says why. Active: started, not
# ended. Anything else has ended; an ended job normally left the wrapper's result.json.
SLURM_QUEUED = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD")
SLURM_ACTIVE = ("CONFIGURING", "RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING", "SUSPENDED",
                "STOPPED")
SLURM_STARTING = 30  # seconds a submission may take to show up in squeue


def _slurm_env(text):
    try:
        env = json.loads(text).get("env") or {}
    except (ValueError, AttributeError, RecursionError):
        env = {}
    if not isinstance(env, dict):
        return {}
    return {str(k): str(v) for k, v in env.items() if isinstance(v, (str, int, float))}


def _slurm(argv, env, timeout=30):
    """Run a Slurm command; (exit code, stdout, stderr). A missing command reads as a failure."""
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, **env})
    except (OSError, subprocess.SubprocessError) as e:
        return 127, "", str(e)
    return r.returncode, r.stdout, r.stderr


def slurm_jobs(names, env):
    """name → its jobs Slurm still knows, newest first: [{id, state, reason}]; None when squeue fails."""
    if not names:
        return {}
    rc, out, err = _slurm(["squeue", "-h", "-t", "all", "-o", "%i|%j|%T|%r", "-n", ",".join(sorted(names))], env,
                          TOOL_TIMEOUT)
    if rc != 0:
        return None
    jobs = {}
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4 and parts[1] in names:
            jobs.setdefault(parts[1], []).append({"id": parts[0], "state": parts[2], "reason": parts[3]})
    for found in jobs.values():
        found.sort(key=lambda j: _small_int(j["id"], 18) or 0, reverse=True)
    return jobs


def _scontrol_job(job_id, env):
    """What scontrol still says of a job: {JobState, ExitCode, Reason}; {} when it forgot it."""
    rc, out, _ = _slurm(["scontrol", "-o", "show", "job", job_id], env)
    if rc != 0:
        return {}
    fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
    return {k: fields.get(k, "") for k in ("JobState", "ExitCode", "Reason")}


def _slurm_ended(run, ws, job_id, state, env):
    """A job Slurm reports ended while its wrapper left no result (killed before or under it)."""
    text = _read(os.path.join(ws, "runtime", "result.json"))
    if text is not None:  # written between the first read and squeue's answer
        try:
            res = json.loads(text)
        except (ValueError, RecursionError):
            pass
        else:
            run.update(_result(res, os.path.join(ws, "runtime")))
            return
    info = _scontrol_job(job_id, env) if job_id else {}
    if not info and state == "gone":
        run.update(state="lost", message=f"Slurm no longer knows job {job_id} and it left no result")
        return
    state = info.get("JobState") or state
    code = info.get("ExitCode", "")
    exit_code = _small_int(code.split(":")[0], 9)
    if state == "CANCELLED":
        run.update(state="terminated", exit_code=143, message=f"Slurm job {job_id} was cancelled")
    else:
        reason = info.get("Reason") or ""
        run.update(state="failed", exit_code=exit_code if exit_code else 1,
                   message=f"Slurm job {job_id} ended {state}" + (f" ({reason})" if reason and reason != "None"
                                                                  else "") + " without a result")


def _slurm_runs(pending, now):
    """Judge Slurm workspaces with one squeue call per cluster (the jobs' environment names it)."""
    by_env = {}
    for entry, ws, run, text in pending:
        env = _slurm_env(text)
        by_env.setdefault(json.dumps(env, sort_keys=True), (env, []))[1].append((entry, ws, run))
    for env, items in by_env.values():
        jobs = slurm_jobs({entry for entry, _, _ in items}, env)
        for entry, ws, run in items:
            rt = os.path.join(ws, "runtime")
            recorded = (_read(os.path.join(rt, "slurm_job")) or "").strip()
            launched = _read(os.path.join(rt, "launched_at"))
            if jobs is None:
                run["state"], run["message"] = "unknown", "squeue did not answer"
                continue
            found = jobs.get(entry) or []
            job = next((j for j in found if j["id"] == recorded), found[0] if found else None)
            if job is not None:
                run["slurm_job"] = job["id"]
                if job["state"] in SLURM_QUEUED:
                    run["state"] = "running"
                    run["queued"] = job["reason"] if job["reason"] not in ("", "None") else "waiting to be scheduled"
                elif job["state"] in SLURM_ACTIVE:
                    run["state"] = "running"
                else:
                    _slurm_ended(run, ws, job["id"], job["state"], env)
            elif launched is None:
                run["state"] = "staged"
            elif recorded:
                run["slurm_job"] = recorded
                _slurm_ended(run, ws, recorded, "gone", env)
            else:
                young = launched.strip().replace(".", "", 1).isdigit() and now - float(launched) < SLURM_STARTING
                run["state"] = "running" if young else "lost"
                if not young:
                    run["message"] = "submitted, but Slurm has no job of this name and there is no result"


def _slurm_terminate(ws, identity, text, grace):
    """scancel the identity's job (by id, else by name) and wait for it to end; Slurm signals every
    step on every node, so no process of the run survives on any of them."""
    env = _slurm_env(text)
    out = {"identity": identity, "was_alive": False}

    def active():
        return [j for j in (slurm_jobs({identity}, env) or {}).get(identity, [])
                if j["state"] in SLURM_QUEUED + SLURM_ACTIVE]

    if not active():
        return out
    out["was_alive"] = True
    rc, _, err = _slurm(["scancel", "-n", identity], env)
    if rc != 0:
        out["error"] = f"scancel failed: {err.strip()[:200]}"
        return out
    deadline = time.time() + grace
    while active() and time.time() < deadline:
        time.sleep(0.2)
    if active():
        _slurm(["scancel", "--signal=KILL", "--full", "-n", identity], env)
        out["killed"] = True
        deadline = time.time() + 10
        while active() and time.time() < deadline:
            time.sleep(0.2)
    return out

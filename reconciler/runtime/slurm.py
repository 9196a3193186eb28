"""The agent's Slurm half: squeue, scontrol and scancel, for workspaces submitted to a cluster.

A workspace submitted to Slurm (``runtime/slurm.json``) is judged by Slurm, not by a local pid: its
job runs on another node. One ``squeue`` per cluster answers for all of them (queued, with Slurm's
reason; running; ended), and ``scontrol show job`` once for a job that ended other than in success
(``slurm_end.py``: Slurm's end state, who cancelled, the failed rank); stopping such a run is
``scancel`` of its job id. Jobs are looked for only among the submitting user's (``squeue -u``)
and by their full namespaced name, never by a bare run name: another repository's run of the
same name on the same cluster is never seen, adopted or cancelled. Standard library only, like
the rest of the agent.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import time

from .readings import TOOL_TIMEOUT, _read, _result, _small_int, carriers
from .slurm_end import apply_end, read_end


# Slurm job states (squeue %T). Queued: not started yet, the reason says why. Active: started, not
# ended. Anything else has ended; an ended job normally left the wrapper's result.json.
SLURM_QUEUED = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD")
SLURM_ACTIVE = ("CONFIGURING", "RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING", "SUSPENDED",
                "STOPPED")
SLURM_STARTING = 30  # seconds a submission may take to show up in squeue


def _slurm_doc(text):
    """runtime/slurm.json → (the Slurm commands' environment, the job's name or None)."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        doc = {}
    doc = doc if isinstance(doc, dict) else {}
    env = doc.get("env") or {}
    env = {str(k): str(v) for k, v in env.items() if isinstance(v, (str, int, float))} if isinstance(env, dict) else {}
    name = doc.get("name")
    return env, (name if isinstance(name, str) and 0 < len(name) <= 1024 and name.isprintable() else None)


def _slurm_env(text):
    return _slurm_doc(text)[0]


def _me():
    """The user this agent runs as: the one that submitted (sbatch ran over the same login)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def _slurm(argv, env, timeout=30):
    """Run a Slurm command; (exit code, stdout, stderr). A missing command reads as a failure."""
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, **env})
    except (OSError, subprocess.SubprocessError) as e:
        return 127, "", str(e)
    return r.returncode, r.stdout, r.stderr


def slurm_jobs(names, env):
    """job name → this user's jobs of that name Slurm still knows, newest first: [{id, state,
    reason}]; None when squeue fails."""
    if not names:
        return {}
    rc, out, err = _slurm(["squeue", "-h", "-t", "all", "-u", _me(), "-o", "%i|%j|%T|%r",
                           "-n", ",".join(sorted(names))], env, TOOL_TIMEOUT)
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


def _ended(run, ws, job_id, env):
    """A job Slurm says ended: the wrapper's result (read again: it may have been written since
    the first read) and Slurm's own end state, reason and failed rank."""
    rt = os.path.join(ws, "runtime")
    if run.get("state") not in ("failed", "terminated"):
        text = _read(os.path.join(rt, "result.json"))
        try:
            res = json.loads(text) if text is not None else None
        except (ValueError, RecursionError):
            res = None
        if res is not None:
            run.update(_result(res, rt))
            if run.get("state") == "succeeded":
                return
    end = read_end(rt, job_id, env, _slurm) if job_id else None
    if end == "active":
        # The wrapper has ended but Slurm has not (COMPLETING): the job still holds its nodes.
        run["state"] = "running"
        return
    if end is None:
        if run.get("state") not in ("failed", "terminated"):
            run.update(state="lost", message=f"Slurm no longer knows job {job_id} and it left no result")
        return
    apply_end(run, end, job_id)


def _judge(run, ws, found, env, now):
    """One workspace by what squeue listed of its job name (``found``, newest first)."""
    rt = os.path.join(ws, "runtime")
    recorded = (_read(os.path.join(rt, "slurm_job"), 64) or "").strip()
    launched = _read(os.path.join(rt, "launched_at"), 64)
    if recorded:
        job = next((j for j in found if j["id"] == recorded), None)
    else:  # submitted by a pass that died before recording the id: its full name, this user's
        job = found[0] if found else None
    if run.get("state") in ("failed", "terminated"):  # the wrapper's result: Slurm says why
        if job is not None or recorded:
            run["slurm_job"] = job["id"] if job is not None else recorded
            _ended(run, ws, run["slurm_job"], env)
        return
    if job is not None:
        run["slurm_job"] = job["id"]
        if job["state"] in SLURM_QUEUED:
            run["state"] = "running"
            run["queued"] = job["reason"] if job["reason"] not in ("", "None") else "waiting to be scheduled"
        elif job["state"] in SLURM_ACTIVE:
            run["state"] = "running"
        else:
            _ended(run, ws, job["id"], env)
    elif launched is None:
        run["state"] = "staged"
    elif recorded:
        run["slurm_job"] = recorded
        _ended(run, ws, recorded, env)
    else:
        young = launched.strip().replace(".", "", 1).isdigit() and now - float(launched) < SLURM_STARTING
        run["state"] = "running" if young else "lost"
        if not young:
            run["message"] = "submitted, but Slurm has no job of this name and there is no result"


def _slurm_runs(pending, now):
    """Judge Slurm workspaces with one squeue call per cluster (the jobs' environment names it)."""
    by_env = {}
    for entry, ws, run, text in pending:
        env, name = _slurm_doc(text)
        by_env.setdefault(json.dumps(env, sort_keys=True), (env, []))[1].append((name or entry, ws, run))
    for env, items in by_env.values():
        jobs = slurm_jobs({name for name, _, _ in items}, env)
        for name, ws, run in items:
            if jobs is None:
                if run.get("state") is None:
                    run["state"], run["message"] = "unknown", "squeue did not answer"
                continue
            _judge(run, ws, jobs.get(name) or [], env, now)
    _count_live(pending)


def _count_live(pending):
    """How many processes on this host still carry each workspace's identity (``live``): where the
    login host is also a node, a worker that escaped the job's tracking keeps an ended attempt
    alive, and it is stopped (``_escaped``) before anything replaces the attempt."""
    found = {}
    for entry, ws, run, _ in pending:
        root = os.path.dirname(os.path.abspath(ws).rstrip("/"))
        if root not in found:
            found[root] = carriers(root=root)
        pids = found[root].get(entry)
        if pids:
            run["live"] = len(pids)


def wants_slurm(rt, result_text):
    """Whether a Slurm workspace with a result still needs Slurm's word on how it ended (a
    failure or a stop the wrapper saw, not yet explained)."""
    if result_text is None:
        return True
    try:
        state = json.loads(result_text).get("state")
    except (ValueError, AttributeError, RecursionError):
        return False  # not the wrapper's: the probe reports it failed as it is
    return state in ("failed", "terminated") and os.path.exists(os.path.join(rt, "slurm.json"))


def _slurm_terminate(ws, identity, text, grace):
    """scancel the job by its id (recorded at submit; else this user's jobs of its full name) and
    wait for it to end; Slurm signals every step on every node, so no process of the run survives
    on any of them. runtime/cancel_requested says the cancel is the reconciler's own."""
    env, name = _slurm_doc(text)
    name = name or identity
    rt = os.path.join(ws, "runtime")
    recorded = (_read(os.path.join(rt, "slurm_job"), 64) or "").strip()
    out = {"identity": identity, "was_alive": False}

    def active():
        return [j["id"] for j in (slurm_jobs({name}, env) or {}).get(name, [])
                if j["state"] in SLURM_QUEUED + SLURM_ACTIVE and (not recorded or j["id"] == recorded)]

    ids = active()
    if not ids:
        return _escaped(ws, identity, out)
    out["was_alive"] = True
    try:
        with open(os.path.join(rt, "cancel_requested"), "w") as fh:
            fh.write(str(time.time()))
    except OSError:
        pass
    rc, _, err = _slurm(["scancel", *ids], env)
    if rc != 0:
        out["error"] = f"scancel failed: {err.strip()[:200]}"
        return out
    deadline = time.time() + grace
    while active() and time.time() < deadline:
        time.sleep(0.2)
    left = active()
    if left:
        _slurm(["scancel", "--signal=KILL", "--full", *left], env)
        out["killed"] = True
        deadline = time.time() + 10
        while active() and time.time() < deadline:
            time.sleep(0.2)
    return _escaped(ws, identity, out)


def _escaped(ws, identity, out):
    """Processes of the job that Slurm no longer tracks, on this host: a worker that daemonized
    escapes a cluster that tracks a job's processes by parentage (slurm.conf's ProctrackType
    proctrack/linuxproc) and outlives scancel. Only where the login host is also a node can they be
    seen here; those are SIGKILLed (the job was cancelled: SIGTERM was Slurm's), and the stop
    reports what survives, so that nothing replaces the attempt while it lives on."""
    root = os.path.dirname(os.path.abspath(ws).rstrip("/"))
    deadline = time.time() + 10
    while True:
        pids = carriers(root=root).get(identity, [])
        if not pids or time.time() >= deadline:
            break
        out["was_alive"] = True
        for pid in pids:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        time.sleep(0.1)
    if pids:
        out["left"] = len(pids)
        out["error"] = f"{len(pids)} process(es) of {identity} still alive on the login host after SIGKILL"
    return out

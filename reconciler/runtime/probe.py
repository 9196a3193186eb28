"""The machine agent: one call reports every run workspace on a machine, as JSON; it also stops runs.

Observing must cost one round trip per machine per pass, however many runs it holds, so this
script does all the looking on the machine itself: it lists the workspace root, reads each
interesting workspace's ``runtime/`` files, scans ``/proc`` once for live process groups, asks
docker once about every container, and prints one JSON document. The reconciler runs it in-process
for this machine and sends its source over SSH (``python3 -``) for others. Standard library only:
it runs with whatever python3 the execution plane has.

Which workspaces are reported: those of the run names asked for (any generation or attempt), and
every workspace of any name that is not yet collected (a process that may still be alive, possibly
an orphan to fence, or a fenced leftover waiting to be collected and cleaned). Collected
workspaces of other runs are skipped, so a machine with years of history stays cheap.

Each report carries the spec digest the workspace was built for (``job.json``): an instance is
only ever adopted under the spec it was built from. A workspace that was staged but never started
(no ``runtime/launched_at``) is ``staged``, not ``lost``: it holds no process and no result, and the
reconciler either finishes launching it or removes it.

A workspace submitted to Slurm (``runtime/slurm.json``) is judged by Slurm, not by a local pid: its
job runs on another node. One ``squeue`` per cluster answers for all of them (queued, with Slurm's
reason; running; ended), and ``scontrol show job`` for a job that ended without the wrapper's result.

The report also says what the machine itself asks for: a drain flag (``~/.reconciler/drain`` of
the login, written by ``reconcile agent drain`` on the machine: nothing new starts there) and,
when the fleet asks for it, the GPUs that processes the reconciler did not start are using
(``nvidia-smi``'s compute process list; a process is ours when its environment carries
``RECONCILER_IDENTITY``, which the launch wrapper exports to everything it starts).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

IDENTITY = re.compile(r"^(?P<name>[a-z0-9]([-a-z0-9]*[a-z0-9])?)-g(?P<gen>[0-9]+)-a(?P<attempt>[0-9]+)"
                      r"(-n[0-9]+)?\Z")  # identity.py's: a node of a run on several machines ends in -n<rank>
TAIL_BYTES = 8192
PRECHECK_EXIT = 3  # precheck.py: the environment does not match the spec
DRAIN_FILE = os.path.join("~", ".reconciler", "drain")


def _read(path, limit=65536):
    try:
        with open(path, "rb") as fh:
            return fh.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def _process_groups():
    """pgid → pids of its live (non-zombie) processes, from one scan of /proc."""
    groups = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return groups
    for entry in entries:
        if not entry.isdigit():
            continue
        stat = _read(f"/proc/{entry}/stat", 4096)
        if not stat:
            continue
        # comm may contain spaces and parentheses: fields start after the last ')'.
        rest = stat[stat.rfind(")") + 2:].split()
        if len(rest) < 3 or rest[0] in ("Z", "X"):
            continue
        groups.setdefault(int(rest[2]), []).append(int(entry))
    return groups


def _mentions(pid, identity):
    needle = identity.encode()
    for name in ("cmdline", "environ"):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as fh:
                if needle in fh.read():
                    return True
        except OSError:
            continue
    return False


def group_alive(pgid, identity, groups=None):
    """Whether process group ``pgid`` has a live member carrying ``identity`` (in its argv or
    environment), so a recycled pgid never counts. ``groups``: a scan to reuse (one per probe)."""
    members = (_process_groups() if groups is None else groups).get(pgid) or []
    return any(_mentions(pid, identity) for pid in members)


# The longest any one tool may take to answer a probe: well inside the reconciler's probe timeout
# (ssh_probe_timeout, 30 s by default), so a hung docker or squeue makes its runs "unknown" instead
# of making the whole machine unreachable (after a grace, its runs would be declared lost).
TOOL_TIMEOUT = 15


def _docker_states(names):
    if not names:
        return {}
    try:
        proc = subprocess.run(
            ["docker", "inspect", "--type", "container", "--format",
             '{{.Name}} {{.State.Status}} {{.State.ExitCode}} {{.State.Running}}'] + sorted(names),
            capture_output=True, text=True, timeout=TOOL_TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"__error__": str(e)}
    out = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4:
            code = parts[2].lstrip("-")
            code = int(parts[2]) if code.isascii() and code.isdigit() and len(code) <= 10 else -1
            out[parts[0].lstrip("/")] = {"status": parts[1][:40], "exit_code": code, "running": parts[3] == "true"}
    return out


PROGRESS_SCAN_LIMIT = 4 << 20  # bytes read backwards at most to find the last step line


def _iso(ts):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


MAX_NUMBER = 1e30  # a progress number beyond this (or NaN, or an infinity) is garbage, not a value


def _num(v):
    """A finite number of sane size, else None: a job's log may say NaN, 1e999 or 10**4000."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, int):
        return v if -MAX_NUMBER < v < MAX_NUMBER else None
    return v if v == v and -MAX_NUMBER < v < MAX_NUMBER else None


def normalize_progress(rec, updated_at):
    """One ms-swift logging.jsonl step line → {step, max_steps, loss, learning_rate, epoch, updated_at}.

    Only lines with a numeric ``loss`` are steps (the two summary lines at the end of training have
    ``train_loss``, not ``loss``); ``"global_step/max_steps": "3/10"`` gives step and max_steps.
    Returns None for anything else.
    """
    if not isinstance(rec, dict) or _num(rec.get("loss")) is None:
        return None
    step = max_steps = None
    gm = rec.get("global_step/max_steps")
    if isinstance(gm, str) and "/" in gm and len(gm) < 64:
        a, _, b = gm.partition("/")
        step, max_steps = _small_int(a, 15), _small_int(b, 15)
    if step is None and isinstance(rec.get("step"), int) and not isinstance(rec.get("step"), bool) \
            and 0 <= rec["step"] < 10**15:
        step = rec["step"]
    out = {"step": step, "max_steps": max_steps, "loss": rec["loss"], "learning_rate": _num(rec.get("learning_rate")),
           "epoch": _num(rec.get("epoch")), "updated_at": _iso(updated_at) if updated_at is not None else None}
    return out


def _last_step_line(path, limit=PROGRESS_SCAN_LIMIT):
    """The last line of a JSON-lines file that is a step (see normalize_progress), read from the end."""
    with open(path, "rb") as fh:
        fh.seek(0, 2)
        pos = fh.tell()
        carry = b""
        read = 0
        while pos > 0 and read < limit:
            n = min(TAIL_BYTES * 8, pos)
            pos -= n
            fh.seek(pos)
            chunk = fh.read(n) + carry
            read += n
            lines = chunk.split(b"\n")
            carry = lines.pop(0) if pos > 0 else b""  # may be a partial line: completed by the next chunk
            for line in reversed(lines):
                if b'"loss"' not in line:
                    continue
                try:
                    rec = json.loads(line.decode("utf-8", "replace"))
                except (ValueError, RecursionError):  # ValueError: also an over-long integer
                    continue
                if isinstance(rec, dict) and _num(rec.get("loss")) is not None:
                    return rec
    return None


def _progress(ws):
    """The latest training step from ms-swift's logging.jsonl (searched two levels deep), normalised."""
    base = os.path.join(ws, "artifacts", "output")
    best = None
    for dirpath, dirnames, filenames in _walk(base, 2):
        if "logging.jsonl" in filenames:
            p = os.path.join(dirpath, "logging.jsonl")
            try:
                m = os.stat(p).st_mtime
            except OSError:
                continue
            if best is None or m > best[0]:
                best = (m, p)
    if best is None:
        return None
    try:
        rec = _last_step_line(best[1])
    except OSError:
        return None
    return normalize_progress(rec, best[0]) if rec is not None else None


def _precheck_failure(ws):
    """The precheck's reason when it refused the run (artifacts/runtime-precheck.json, ok: false)."""
    text = _read(os.path.join(ws, "artifacts", "runtime-precheck.json"), 1 << 20)
    if not text:
        return None
    try:
        rep = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if isinstance(rep, dict) and rep.get("ok") is False:
        reason = rep.get("reason")
        return reason[:280] if isinstance(reason, str) and reason else "precheck failed"
    return None


def _checkpoints(ws):
    """Complete checkpoints (their trainer_state.json is written last) under artifacts/output, as
    workspace-relative paths, oldest step first."""
    base = os.path.join(ws, "artifacts", "output")
    found = []
    for dirpath, dirnames, filenames in _walk(base, 1):
        for d in dirnames:
            if d.startswith("checkpoint-") and d[11:].isdigit() and os.path.isfile(
                    os.path.join(dirpath, d, "trainer_state.json")):
                found.append((int(d[11:]), os.path.relpath(os.path.join(dirpath, d), ws)))
    return [p for _, p in sorted(found)]


def _walk(base, depth):
    if depth < 0 or not os.path.isdir(base):
        return
    try:
        entries = list(os.scandir(base))
    except OSError:
        return
    yield base, [e.name for e in entries if e.is_dir()], [e.name for e in entries if e.is_file()]
    for e in entries:
        if e.is_dir():
            yield from _walk(e.path, depth - 1)


def probe(root, names=None, now=None):
    """Every interesting workspace under ``root``, judged one by one: whatever one workspace's
    files hold (a job writes them), reading them can fail only that workspace's entry (state
    ``unknown`` with the reason), never the probe and so never the other runs on the machine."""
    now = time.time() if now is None else now
    root = os.path.abspath(os.path.expanduser(root))  # relative roots are under the login's home
    names = set(names or ())
    result = {"now": now, "root": root, "host": os.uname().nodename, "runs": {}}
    try:
        entries = sorted(os.listdir(root))
    except FileNotFoundError:
        return result
    except OSError as e:
        result["error"] = f"cannot list {root}: {e}"
        return result
    scan = {}  # the /proc scan, made once, on first need
    pending_docker = {}
    pending_slurm = []
    for entry in entries:
        m = IDENTITY.match(entry)
        if not m:
            continue
        ws = os.path.join(root, entry)
        try:
            found = _workspace(entry, m.group("name"), ws, names, now, scan)
        except Exception as e:  # noqa: BLE001 - one workspace's files must not stop the probe
            found = (_unreadable(ws, e), None)
        if found is None:
            continue
        run, pending = found
        if pending == "docker":
            pending_docker[run["container"]] = (entry, run)
        elif pending is not None:
            pending_slurm.append((entry, ws, run, pending))
        result["runs"][entry] = run
    if pending_slurm:
        try:
            _slurm_runs(pending_slurm, now)
        except Exception as e:  # noqa: BLE001
            for _, ws, run, _ in pending_slurm:
                if run.get("state") is None:
                    run.update(_unreadable(ws, e))
    if pending_docker:
        try:
            states = _docker_states(pending_docker)
        except Exception as e:  # noqa: BLE001 - docker's answer could not be read: cannot tell
            states = {"__error__": "cannot read docker's answer: %s: %s" % (type(e).__name__, e)}
        err = states.pop("__error__", None)
        for cname, (entry, run) in pending_docker.items():
            st = states.get(cname)
            if st is None:
                # No container and no result: gone (removed, or the daemon lost it).
                run["state"] = "unknown" if err else "lost"
                run["message"] = (err or "container not found and no result")[:300]
            elif st["running"]:
                run["state"] = "running"
            else:
                # Exited without the wrapper writing a result (killed, OOM): trust docker's code.
                run["state"] = "failed"
                run["exit_code"] = st["exit_code"]
                run["message"] = f"container {st['status']} without a result (exit {st['exit_code']})"
    return result


def _unreadable(ws, e):
    """The entry of a workspace whose files could not be read: neither alive nor dead."""
    return {"workspace": ws, "state": "unknown", "collected": False,
            "message": ("the probe could not read this workspace: %s: %s" % (type(e).__name__, e))[:300]}


def _small_int(text, digits=10):
    """A non-negative decimal integer of at most ``digits`` digits (a job may write anything in
    its files: a 5,000-digit number must not reach int(), which refuses more than 4,300)."""
    text = text.strip() if isinstance(text, str) else ""
    if 0 < len(text) <= digits and text.isascii() and text.isdigit():
        return int(text)
    return None


def _timestamp(text):
    """Unix seconds from a file the wrapper wrote ("1700000000" or "1700000000.25"), or None."""
    text = text.strip() if isinstance(text, str) else ""
    if not text or len(text) > 24 or not text.replace(".", "", 1).isascii() or not text.replace(".", "", 1).isdigit():
        return None
    t = float(text)
    return t if 0 <= t < MAX_TIME else None


MAX_TIME = 1e11  # unix seconds far beyond any real clock: a larger "time" is garbage
RESULT_STATES = ("succeeded", "failed", "terminated")


def _result(res, rt):
    """The fields of a parsed runtime/result.json. Anything but an object with a known state is
    not a result the wrapper wrote: the run failed, and the message says why."""
    if not isinstance(res, dict):
        return {"state": "failed", "message": "runtime/result.json is not a JSON object"}
    out = {}
    state = res.get("state", "failed")
    if state not in RESULT_STATES:
        out["state"], out["message"] = "failed", "runtime/result.json has no known state"
    else:
        out["state"] = state
    code = res.get("exit_code")
    out["exit_code"] = code if isinstance(code, int) and not isinstance(code, bool) and -2**31 <= code < 2**31 else None
    fin = _num(res.get("finished_ts"))
    out["finished_at"] = fin if fin is not None and 0 <= fin < MAX_TIME else None
    if "message" not in out:
        why = res.get("message")
        why = why if isinstance(why, str) and why else (_read(os.path.join(rt, "launch.err"), 600) or "").strip()
        if why and out["state"] != "succeeded":
            out["message"] = why[:300]
    if res.get("permanent") is True:  # the launcher found the instance can never start
        out["permanent"] = True
    return out


def _workspace(entry, name, ws, names, now, scan):
    """One workspace's entry and what is left to ask about it ("docker", the Slurm record, or
    None); None to leave it out (a collected workspace of a run not asked for)."""
    rt = os.path.join(ws, "runtime")
    result_text = _read(os.path.join(rt, "result.json"))
    collected = os.path.exists(os.path.join(rt, "collected"))
    if name not in names and result_text is not None and collected:
        return None
    run = {"workspace": ws, "collected": collected}
    pending = None
    job = _read(os.path.join(ws, "job.json"), 1 << 20)
    if job:
        try:
            payload = json.loads(job).get("payload", {})
            gpus = payload.get("gpus", [])
            run["gpus"] = [g for g in gpus if isinstance(g, int)][:64] if isinstance(gpus, list) else []
            digest = payload.get("spec_digest")
            run["spec_digest"] = digest if isinstance(digest, str) and len(digest) < 200 else None
            gang = payload.get("gang")
            if gang and isinstance(gang, dict):  # {rank, of, machines}: one node of a run on several machines
                machines = gang.get("machines")
                run["gang"] = {"rank": gang.get("rank"), "of": gang.get("of"),
                               "machines": [str(x)[:253] for x in machines[:1024]] if isinstance(machines, list) else []}
        except (ValueError, AttributeError, RecursionError):
            pass
    started = _timestamp(_read(os.path.join(rt, "started_at"), 64))
    if started is not None:
        run["started_at"] = started
    try:
        run["heartbeat_age"] = round(now - os.stat(os.path.join(rt, "heartbeat")).st_mtime, 3)
    except OSError:
        pass
    container = _read(os.path.join(rt, "container"), 256)
    slurm = _read(os.path.join(rt, "slurm.json")) if result_text is None else None
    if result_text is not None:
        try:
            res = json.loads(result_text)
        except (ValueError, RecursionError):  # ValueError: also a number over the int-digits limit
            run["state"], run["message"] = "failed", "runtime/result.json is not valid JSON"
        else:
            run.update(_result(res, rt))
    elif container:
        run["container"] = container.strip()
        pending = "docker"
    elif slurm is not None:
        pending = slurm
    else:
        pid = _small_int(_read(os.path.join(rt, "pid"), 64))
        if pid is not None and pid > 0:
            run["pid"] = pid
            if "groups" not in scan:
                scan["groups"] = _process_groups()
            run["state"] = "running" if group_alive(pid, entry, scan["groups"]) else "lost"
        else:
            launched = _read(os.path.join(rt, "launched_at"), 64)
            if launched is None:
                # Staged, never started (a launch refused before starting it, or a crash
                # between staging and launching): nothing ran, so nothing was lost.
                run["state"] = "staged"
            else:
                # Launched moments ago and the wrapper has not written its pid yet: still starting.
                at = _timestamp(launched)
                young = at is not None and now - at < 30
                run["state"] = "running" if young else "lost"
                if not young:
                    run["message"] = "no pid and no result: the launch never started"
    if run.get("state") == "failed" and run.get("exit_code") == PRECHECK_EXIT:
        reason = _precheck_failure(ws)
        if reason:
            run["message"], run["permanent"] = "precheck failed: " + reason[:280], True
    state = run.get("state")
    if name in names and (state in ("running", None)
                          or state in ("succeeded", "failed") and not run["collected"]):
        # Progress and checkpoints describe the run; they never decide its state. Unreadable
        # ones are left out, and the run is reported as it is.
        try:
            prog = _progress(ws)
        except Exception:  # noqa: BLE001
            prog = None
        if prog:
            run["progress"] = prog
        if state in ("running", None):
            try:
                ckpts = _checkpoints(ws)
            except Exception:  # noqa: BLE001
                ckpts = None
            if ckpts:
                run["checkpoints"] = ckpts[-100:]
    return run, pending


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


def _write_result(ws, state, code, message):
    rt = os.path.join(ws, "runtime")
    os.makedirs(rt, exist_ok=True)
    tmp = os.path.join(rt, "result.json.tmp")
    with open(tmp, "w") as fh:
        json.dump({"state": state, "exit_code": code, "finished_ts": time.time(), "message": message}, fh)
    os.replace(tmp, os.path.join(rt, "result.json"))


def terminate(ws, identity, grace=10.0):
    """Stop an instance and everything it started; idempotent. Returns what it found and did.

    Host processes: SIGTERM to the process group (the wrapper records "terminated"), then SIGKILL
    to whatever is left after the grace period. Only a group whose members carry the identity is
    signalled, so a recycled pid is never hit. Containers: docker stop, then docker rm -f. Slurm
    jobs: scancel (SIGTERM to every step on every node), then SIGKILL after the grace period.
    """
    ws = os.path.expanduser(ws)
    rt = os.path.join(ws, "runtime")
    out = {"identity": identity, "was_alive": False}
    container = _read(os.path.join(rt, "container"))
    slurm = _read(os.path.join(rt, "slurm.json"))
    if slurm is not None:
        out = _slurm_terminate(ws, identity, slurm, grace)
        if out.get("error"):
            return out
    elif container:
        name = container.strip()
        st = _docker_states([name]).get(name)
        out["was_alive"] = bool(st and st.get("running"))
        subprocess.run(["docker", "stop", "-t", str(int(grace)), name], capture_output=True, timeout=grace + 30)
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=60)
    else:
        pid_text = _read(os.path.join(rt, "pid"))
        if pid_text and pid_text.strip().isdigit():
            pgid = int(pid_text.strip())
            if group_alive(pgid, identity):
                out["was_alive"] = True
                if not _signal(pgid, 15):
                    out["error"] = f"not permitted to signal process group {pgid}"
                    return out
                if not _gone_within(pgid, identity, grace):
                    _signal(pgid, 9)
                    out["killed"] = True
                    _gone_within(pgid, identity, 5)
    if slurm is None and not container:
        # Processes that left the group (torchrun starts each worker in a session of its own):
        # they still carry the identity in their environment, and go with it.
        strays = _carrying(identity)
        if strays:
            out["was_alive"] = True
            _signal_pids(strays, 15)
            deadline = time.time() + grace
            while _carrying(identity) and time.time() < deadline:
                time.sleep(0.05)
            left = _carrying(identity)
            if left:
                _signal_pids(left, 9)
                out["killed"] = True
    if os.path.isdir(ws) and not os.path.exists(os.path.join(rt, "result.json")):
        _write_result(ws, "terminated", 137 if out.get("killed") else 143, "terminated by the reconciler")
    _drop_secrets(rt)
    return out


def _carrying(identity):
    """Live processes whose environment says they belong to ``identity`` (exactly that one)."""
    needle = f"RECONCILER_IDENTITY={identity}\0".encode()
    me = os.getpid()
    found = []
    for pids in _process_groups().values():
        for pid in pids:
            if pid == me:
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    env = b"\0" + fh.read() + b"\0"
            except OSError:
                continue
            if b"\0" + needle in env:
                found.append(pid)
    return found


def _signal_pids(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _gone_within(pgid, identity, seconds):
    """Poll until the group no longer carries ``identity``; whether it went within ``seconds``."""
    deadline = time.time() + seconds
    while group_alive(pgid, identity):
        if time.time() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _signal(pgid, sig):
    """Signal a process group; False only when it is not ours to signal."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        return False
    return True


def _drop_secrets(rt):
    try:
        os.remove(os.path.join(rt, "secrets.env"))
    except OSError:
        pass


def finish(ws, remove=False):
    """After collection: forget the container, mark the workspace collected (or remove it)."""
    ws = os.path.expanduser(ws)
    rt = os.path.join(ws, "runtime")
    container = _read(os.path.join(rt, "container"))
    if container:
        subprocess.run(["docker", "rm", "-f", container.strip()], capture_output=True, timeout=60)
    _drop_secrets(rt)
    if remove:
        import shutil

        shutil.rmtree(ws, ignore_errors=True)
        return {"removed": True}
    if os.path.isdir(ws):  # a workspace staged but never started has no runtime/ yet
        os.makedirs(rt, exist_ok=True)
        with open(os.path.join(rt, "collected"), "w") as fh:
            fh.write(str(time.time()))
    return {"removed": False}


def drain_state(path=DRAIN_FILE):
    """The machine's own drain flag: {"reason", "since"}, or None. A flag that cannot be parsed
    still drains (an engineer meant it), with its text as the reason."""
    text = _read(os.path.expanduser(path), 4096)
    if text is None:
        return None
    try:
        flag = json.loads(text)
        if isinstance(flag, dict):
            since = _num(flag.get("since"))
            reason = flag.get("reason")
            return {"reason": reason[:200] if isinstance(reason, str) else "", "since": since}
    except (ValueError, RecursionError):
        pass
    return {"reason": text.strip()[:200], "since": None}


def _ours(pid):
    """Whether a process was started by a launch wrapper (its environment names a run identity).
    An environment we cannot read (another user's process) is not ours."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as fh:
            return b"\0RECONCILER_IDENTITY=" in b"\0" + fh.read()
    except OSError:
        return False


def foreign_gpus(smi="nvidia-smi"):
    """Indices of the GPUs some process not started by the reconciler is using, from nvidia-smi.
    {"gpus": [...]} or {"error": why} (no nvidia-smi, or it failed: the planner then trusts the fleet)."""
    def query(*args):
        p = subprocess.run([smi, *args, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                           timeout=20)
        if p.returncode != 0:
            raise OSError((p.stderr or p.stdout).strip()[:200] or "exit %d" % p.returncode)
        return [[f.strip() for f in line.split(",")] for line in p.stdout.splitlines() if line.strip()]
    try:
        index = {uuid: int(i) for i, uuid in query("--query-gpu=index,uuid")}
        busy = set()
        for uuid, pid in query("--query-compute-apps=gpu_uuid,pid"):
            if uuid in index and pid.isdigit() and not _ours(int(pid)):
                busy.add(index[uuid])
        return {"gpus": sorted(busy)}
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        return {"error": "cannot read the GPUs' processes: %s" % e}


def dispatch(args):
    op = args.get("op", "probe")
    if op == "probe":
        report = probe(args.get("root", "."), args.get("names"))
        try:
            report["drain"] = drain_state()
        except Exception as e:  # noqa: BLE001 - a drain flag that cannot be read still drains
            report["drain"] = {"reason": "unreadable drain flag: %s" % type(e).__name__, "since": None}
        if args.get("gpu_processes"):
            try:
                report["foreign_gpus"] = foreign_gpus()
            except Exception as e:  # noqa: BLE001
                report["foreign_gpus"] = {"error": "cannot read the GPUs' processes: %s" % type(e).__name__}
        return report
    if op == "terminate":
        return terminate(args["workspace"], args["identity"], float(args.get("grace", 10)))
    if op == "finish":
        return finish(args["workspace"], bool(args.get("remove")))
    raise SystemExit(f"unknown op {op!r}")


def serve(stdin, stdout):
    """``--serve``: one JSON request a line on stdin, one JSON answer a line on stdout, until
    stdin closes (its SSH channel closed: the reconciler stopped or lost the connection). A
    long-lived reconciler keeps one per machine so that a probe costs no interpreter start."""
    for line in stdin:
        if not line.strip():
            continue
        try:
            answer = dispatch(json.loads(line))
        except Exception as e:  # noqa: BLE001 - reported to the caller, the helper goes on
            answer = {"__error__": f"{type(e).__name__}: {e}"}
        stdout.write(json.dumps(answer) + "\n")
        stdout.flush()
    return 0


def main(argv):
    if len(argv) > 1 and argv[1] == "--serve":
        return serve(sys.stdin, sys.stdout)
    args = json.loads(argv[1]) if len(argv) > 1 else {}
    print(json.dumps(dispatch(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

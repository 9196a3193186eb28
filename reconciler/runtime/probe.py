"""The machine agent: one call reports every run workspace on a machine, as JSON; its entry point.

Observing must cost one round trip per machine per pass, however many runs it holds, so this
script does all the looking on the machine itself: it lists the workspace root, reads each
interesting workspace's ``runtime/`` files, scans ``/proc`` once for live process groups, asks
docker once about every container, and prints one JSON document. The reconciler runs it in-process
for this machine and sends its source over SSH (``python3 -``) for others, together with its
siblings (``readings.py``: the guarded reads; ``slurm.py``: the Slurm half; ``stop.py``: stopping
runs), which it imports by their bare names (``reconciler/runtime/__init__.py`` says why). Standard
library only: it runs with whatever python3 the execution plane has.

Which workspaces are reported: those of the run names asked for (any generation or attempt), and
every workspace of any name that is not yet collected (a process that may still be alive, possibly
an orphan to fence, or a fenced leftover waiting to be collected and cleaned). Collected
workspaces of other runs are skipped, so a machine with years of history stays cheap.

Each report carries the spec digest the workspace was built for (``job.json``): an instance is
only ever adopted under the spec it was built from. A workspace that was staged but never started
(no ``runtime/launched_at``) is ``staged``, not ``lost``: it holds no process and no result, and the
reconciler either finishes launching it or removes it.

A workspace submitted to Slurm (``runtime/slurm.json``) is judged by Slurm, not by a local pid: its
job runs on another node (``slurm.py``: one ``squeue`` per cluster answers for all of them).

The report also says what the machine itself asks for: a drain flag (``~/.reconciler/drain`` of
the login, written by ``reconcile agent drain`` on the machine: nothing new starts there) and,
when the fleet asks for it, the GPUs that processes the reconciler did not start are using
(``nvidia-smi``'s compute process list; a process is ours when it runs as this login and its
environment carries ``RECONCILER_IDENTITY``, which the launch wrapper exports to everything it
starts).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

from .gpus import foreign_gpus
from .readings import (MAX_TIME, _checkpoints, _docker_states, _num, _process_groups, _read, _result, _small_int,
                       _walk, carriers, group_alive, leader_alive)
from .slurm import _slurm_runs, wants_slurm
from .stop import finish, terminate

IDENTITY = re.compile(r"^(?P<name>[a-z0-9]([-a-z0-9]*[a-z0-9])?)-g(?P<gen>[0-9]+)-a(?P<attempt>[0-9]+)"
                      r"(-n[0-9]+)?\Z")  # identity.py's: a node of a run on several machines ends in -n<rank>
TAIL_BYTES = 8192
# precheck.py: the environment does not match the spec; the entrypoint: no interpreter to run it with
PRECHECK_EXITS = (3, 127)
DRAIN_FILE = os.path.join("~", ".reconciler", "drain")


PROGRESS_SCAN_LIMIT = 4 << 20  # bytes read backwards at most to find the last step line
# The loss curve gets every step logged since the last pass, not only the newest: the last
# CURVE_POINTS step lines within CURVE_BYTES of the log's end (a pass every 30 s and a line every
# few steps is a handful; a long gap between passes keeps the newest ones).
CURVE_POINTS = 32
CURVE_BYTES = 64 << 10


def _iso(ts):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


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


def _recent_points(path):
    """[[step, loss], ...] of the last step lines of a JSON-lines log, oldest first."""
    with open(path, "rb") as fh:
        fh.seek(0, 2)
        start = max(0, fh.tell() - CURVE_BYTES)
        fh.seek(start)
        lines = fh.read(CURVE_BYTES).split(b"\n")
    if start:
        lines = lines[1:]  # a partial first line
    points = []
    for line in lines:
        if b'"loss"' not in line:
            continue
        try:
            p = normalize_progress(json.loads(line.decode("utf-8", "replace")), None)
        except (ValueError, RecursionError):
            continue
        if p is not None and p["step"] is not None:
            points.append([p["step"], p["loss"]])
    return points[-CURVE_POINTS:]


def _progress_file(ws):
    """The newest logging.jsonl of the run (searched two levels deep) and its time, or None."""
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
    return best


def _progress(ws, best=False):
    """The latest training step from ms-swift's logging.jsonl, normalised (``best``: the file,
    when the caller has looked for it already)."""
    best = _progress_file(ws) if best is False else best
    if best is None:
        return None
    try:
        rec = _last_step_line(best[1])
    except OSError:
        return None
    return normalize_progress(rec, best[0]) if rec is not None else None


def _precheck_failure(ws):
    """The precheck's reason when it refused the run (artifacts/runtime-precheck.json, ok: false),
    and whether the refusal is the machine's (``scope: machine``: another machine may take the run)."""
    text = _read(os.path.join(ws, "artifacts", "runtime-precheck.json"), 1 << 20)
    try:
        rep = json.loads(text) if text else None
    except (ValueError, RecursionError):
        return None, None
    if isinstance(rep, dict) and rep.get("ok") is False:
        reason = rep.get("reason")
        return (reason[:280] if isinstance(reason, str) and reason else "precheck failed",
                "machine" if rep.get("scope") == "machine" else None)
    return None, None


def probe(root, names=None, now=None, only=None):
    """Every interesting workspace under ``root``, judged one by one: whatever one workspace's
    files hold (a job writes them), reading them can fail only that workspace's entry (state
    ``unknown`` with the reason), never the probe and so never the other runs on the machine.
    ``only``: the run names whose workspaces to judge (None: all); the others are left out as if
    absent, and the /proc scan is made only if one of those asks for it."""
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
    scan = {"root": root}  # the /proc scan, made once, on first need; whose workspaces it is for
    pending_docker = {}
    pending_slurm = []
    for entry in entries:
        m = IDENTITY.match(entry)
        if not m or only is not None and m.group("name") not in only:
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


def _timestamp(text):
    """Unix seconds from a file the wrapper wrote ("1700000000" or "1700000000.25"), or None."""
    text = text.strip() if isinstance(text, str) else ""
    if not text or len(text) > 24 or not text.replace(".", "", 1).isascii() or not text.replace(".", "", 1).isdigit():
        return None
    t = float(text)
    return t if 0 <= t < MAX_TIME else None


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
    _job_fields(ws, run)
    started = _timestamp(_read(os.path.join(rt, "started_at"), 64))
    if started is not None:
        run["started_at"] = started
    try:
        run["heartbeat_age"] = round(now - os.stat(os.path.join(rt, "heartbeat")).st_mtime, 3)
    except OSError:
        pass
    container = _read(os.path.join(rt, "container"), 256)
    slurm = _read(os.path.join(rt, "slurm.json")) if wants_slurm(rt, result_text) else None
    if result_text is not None:
        try:
            res = json.loads(result_text)
        except (ValueError, RecursionError):  # ValueError: also a number over the int-digits limit
            run["state"], run["message"] = "failed", "runtime/result.json is not valid JSON"
        else:
            run.update(_result(res, rt))
        if slurm is not None:  # a Slurm job that failed or was stopped: Slurm says why
            pending = slurm
    elif container:
        run["container"] = container.strip()
        pending = "docker"
    elif slurm is not None:
        pending = slurm
    else:
        pid = _small_int(_read(os.path.join(rt, "pid"), 64))
        if pid is not None and pid > 0:
            run["pid"] = pid
            alive = leader_alive(pid, entry)  # the common case, without a scan of every process
            if not alive and "groups" not in scan:
                scan["groups"] = _process_groups()
            run["state"] = "running" if alive or group_alive(pid, entry, scan["groups"]) else "lost"
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
    if pending is None and not container:
        _live(entry, run, scan)
    if run.get("state") == "failed" and run.get("exit_code") in PRECHECK_EXITS:
        reason, run["scope"] = _precheck_failure(ws)
        if reason:
            run["message"], run["permanent"] = "precheck failed: " + reason[:280], True
    state = run.get("state")
    if name in names and (state in ("running", None)
                          or state in ("succeeded", "failed", "terminated") and not run["collected"]):
        _describe(ws, run, state)
    return run, pending


def _live(entry, run, scan):
    """How many processes carry the workspace's identity, in any session (``live``, when some do).
    A result.json says the wrapper's own child ended, not that everything the attempt started did:
    a worker in a session of its own outlives it, and keeps the attempt alive until it is stopped."""
    if "carriers" not in scan:
        scan["carriers"] = carriers(scan.get("groups"), scan.get("root"))
    pids = scan["carriers"].get(entry)
    if pids:
        run["live"] = len(pids)


def _job_fields(ws, run):
    """What ``job.json`` says of the workspace (its GPUs, spec digest, gang), into ``run``."""
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


def _describe(ws, run, state):
    """A run's progress and checkpoints, into ``run``."""
    # Progress and checkpoints describe the run; they never decide its state. Unreadable
    # ones are left out, and the run is reported as it is.
    try:
        found = _progress_file(ws)
        prog = _progress(ws, found)
    except Exception:  # noqa: BLE001
        found = prog = None
    if prog:
        run["progress"] = prog
        try:
            run["curve"] = _recent_points(found[1])
        except OSError:
            pass
    if state in ("running", None, "failed", "terminated"):  # ended: whether a retry can resume
        try:
            ckpts = _checkpoints(ws)
        except Exception:  # noqa: BLE001
            ckpts = None
        if ckpts:
            run["checkpoints"] = ckpts[-100:]
    _uploads(ws, run)


UPLOADS_LIMIT = 256 * 1024  # runtime/uploads.json: 64 checkpoints take ~25 KB


def _uploads(ws, run):
    """runtime/uploads.json (a run with a Storage: what it uploaded), passed on decoded; the
    control plane checks it (core/uploads.py). Too large or not JSON: passed on as a string,
    which the control plane refuses with its reason."""
    text = _read(os.path.join(ws, "runtime", "uploads.json"), UPLOADS_LIMIT + 1)
    if text is None:
        return
    try:
        run["uploads"] = json.loads(text) if len(text) <= UPLOADS_LIMIT else "too large"
    except (ValueError, RecursionError):
        run["uploads"] = "not JSON"


MACHINE_DRAIN_FILE = "/etc/reconciler/drain"  # root's (``reconcile agent drain --machine-wide``)


def drain_state(path=DRAIN_FILE, machine_path=MACHINE_DRAIN_FILE):
    """The machine's own drain flag: {"reason", "since"}, or None. A flag that cannot be parsed
    still drains (an engineer meant it), with its text as the reason. The machine-wide flag comes
    first: the login's own one lies in the home its jobs run in, so a job could lift it."""
    text = _read(machine_path, 4096)
    if text is None:
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


def dispatch(args):
    op = args.get("op", "probe")
    if op == "probe":
        only = args.get("only")
        report = probe(args.get("root", "."), args.get("names"), only=set(only) if only is not None else None)
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


def main(argv):
    if len(argv) > 1 and argv[1] == "--serve":
        from .resident import serve

        return serve(sys.stdin, sys.stdout, dispatch)
    args = json.loads(argv[1]) if len(argv) > 1 else {}
    print(json.dumps(dispatch(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""What every part of the machine agent reads: files a job wrote, the /proc scan, docker's states.

The probe (``probe.py``), the Slurm half (``slurm.py``) and stopping runs (``stop.py``) all read a
workspace's files, which a job may have written anything into, and ask the same questions of the
machine's processes and containers; the guarded readings live here so each answer is read one way.
Standard library only: it runs on machines with whatever python3 they have.
"""

from __future__ import annotations

import os
import subprocess


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


MAX_NUMBER = 1e30  # a progress number beyond this (or NaN, or an infinity) is garbage, not a value


def _num(v):
    """A finite number of sane size, else None: a job's log may say NaN, 1e999 or 10**4000."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, int):
        return v if -MAX_NUMBER < v < MAX_NUMBER else None
    return v if v == v and -MAX_NUMBER < v < MAX_NUMBER else None


def _small_int(text, digits=10):
    """A non-negative decimal integer of at most ``digits`` digits (a job may write anything in
    its files: a 5,000-digit number must not reach int(), which refuses more than 4,300)."""
    text = text.strip() if isinstance(text, str) else ""
    if 0 < len(text) <= digits and text.isascii() and text.isdigit():
        return int(text)
    return None


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

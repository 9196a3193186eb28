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
    for pid, (pgid, _session) in process_table().items():
        groups.setdefault(pgid, []).append(pid)
    return groups


def pids():
    """Every pid in /proc, alive or not: a zombie's environment and command line read empty, so
    whatever looks for a process by them skips it without its ``stat`` being read."""
    try:
        return [int(e) for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []


def leader_alive(pgid, identity):
    """Whether process ``pgid`` itself lives (not a zombie), leads group ``pgid`` and carries
    ``identity``: then group ``pgid`` has such a member (``group_alive`` is true) without a scan of
    every process. False says nothing: another member may still carry it."""
    stat = _read(f"/proc/{pgid}/stat", 4096)
    if not stat:
        return False
    rest = stat[stat.rfind(")") + 2:].split()
    return len(rest) >= 4 and rest[0] not in ("Z", "X") and rest[2] == str(pgid) and _mentions(pgid, identity)


def process_table():
    """pid → (pgid, session) of every live (non-zombie) process, from one scan of /proc."""
    table = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        stat = _read(f"/proc/{entry}/stat", 4096)
        if not stat:
            continue
        # comm may contain spaces and parentheses: fields start after the last ')'.
        rest = stat[stat.rfind(")") + 2:].split()
        if len(rest) < 4 or rest[0] in ("Z", "X"):
            continue
        table[int(entry)] = (int(rest[2]), int(rest[3]))
    return table


MAX_CARRIERS = 64  # pids kept per identity: enough to signal a torchrun's workers, bounded for the reply
_IDENTITY_VAR = b"\0RECONCILER_IDENTITY="
_BUNDLE_VAR = b"\0RECONCILER_BUNDLE="
ENVIRON_LIMIT = 1 << 20  # bytes of a process's environment read at most


def _carried(pid):
    """(identity, workspace) of a process, from its environment as the launch wrapper exports it to
    everything it starts (RECONCILER_IDENTITY, RECONCILER_BUNDLE), or None: not ours, gone, or
    another user's (its environment cannot be read)."""
    env = b"\0"
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            # In pieces: a read of the whole bound at once costs a 1 MiB buffer per process.
            while len(env) <= ENVIRON_LIMIT:
                piece = fh.read(65536)
                if not piece:
                    break
                env += piece
    except OSError:
        return None
    ident = _env_value(env, _IDENTITY_VAR)
    return (ident, _env_value(env, _BUNDLE_VAR)) if ident else None


def _env_value(env, var):
    at = env.find(var)
    if at < 0:
        return None
    start = at + len(var)
    end = env.find(b"\0", start)
    value = env[start:] if end < 0 else env[start:end]
    return value.decode("utf-8", "replace")[:4096] if 0 < len(value) <= 4096 else None


def _same_place(a, b):
    if a is None:
        return False
    if os.path.normpath(a) == os.path.normpath(b):
        return True
    try:
        return os.path.realpath(a) == os.path.realpath(b)
    except OSError:
        return False


def carriers(groups=None, root=None):
    """identity → live pids (at most MAX_CARRIERS each) of every process carrying a run identity,
    in any session or process group: what a process that left its group (``setsid``) still shares
    with the attempt that started it. One scan; ``groups``: a /proc scan to reuse (without one,
    the pids are listed and only their environments read: a zombie's reads empty).

    ``root``: only the processes whose workspace is ``root/<identity>``. An identity is the run's
    name, generation and attempt, and another repository (another namespace, another workspace
    root) may run one of the same name on the same machine: its processes are not this one's, and
    must never be counted or stopped as if they were."""
    me = os.getpid()
    out = {}
    for members in ([pids()] if groups is None else groups.values()):
        for pid in members:
            if pid == me:
                continue
            found = _carried(pid)
            if found is None:
                continue
            ident, bundle = found
            if root is not None and not _same_place(bundle, os.path.join(root, ident)):
                continue
            pids_of = out.setdefault(ident[:200], [])
            if len(pids_of) < MAX_CARRIERS:
                pids_of.append(pid)
    return out


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
        if res.get("scope") == "machine":  # ...on this machine (its docker, its images)
            out["scope"] = "machine"
    return out


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

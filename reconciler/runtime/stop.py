"""Stopping runs and finishing collected workspaces: the agent's ``terminate`` and ``finish``.

Stopping must reach everything a run started and nothing else: a process group only while its
members carry the run's identity, strays that left the group (a worker in a session of its own)
by the identity in their environment, re-checked until none is left, so that a stop that returns
without an error means nothing of the attempt lives on the machine (a replacement may start),
a container by its name, a Slurm job through scancel. Standard library only, like the rest of the
agent.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

from .readings import _docker_states, _read, _small_int, carriers, group_alive, process_table
from .slurm import _slurm_terminate


def _write_result(ws, state, code, message):
    rt = os.path.join(ws, "runtime")
    os.makedirs(rt, exist_ok=True)
    tmp = os.path.join(rt, "result.json.tmp")
    with open(tmp, "w") as fh:
        json.dump({"state": state, "exit_code": code, "finished_ts": time.time(), "message": message}, fh)
    os.replace(tmp, os.path.join(rt, "result.json"))


def terminate(ws, identity, grace=10.0):
    """Stop an instance and everything it started; idempotent. Returns what it found and did.

    Host processes: SIGTERM to the process group (the wrapper records "terminated") and to every
    process of the identity in other sessions, then SIGKILL to whatever is left after the grace
    period, until none is left; an error (and ``left``) if some outlive even that. Only a group
    whose members carry the identity is signalled, so a recycled pid is never hit. Containers:
    docker stop, then docker rm -f. Slurm jobs: scancel (SIGTERM to every step on every node),
    then SIGKILL after the grace period.
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
        out.update(_stop_host(rt, identity, grace))
        if out.get("error") and not out.get("left"):
            return out
    if os.path.isdir(ws) and not os.path.exists(os.path.join(rt, "result.json")):
        _write_result(ws, "terminated", 137 if out.get("killed") else 143, "terminated by the reconciler")
    _drop_secrets(rt)
    return out


# How long SIGKILLed processes get to leave the process table (they may be finishing a write to
# a network file system, in uninterruptible sleep): past it, the stop reports them as left.
KILL_WAIT = 10.0


def _remaining(pgid, identity, seen, root=None):
    """The attempt's live processes: its group's members while they carry the identity, every
    process elsewhere (another session, another group) whose environment names it, and every
    member of a session or group such a process leads or led. The last catch a child caught
    between fork and exec, whose environment cannot be read for that instant: one scan would miss
    it, and it would outlive the stop. ``seen``: the groups and sessions found so far (grown here)."""
    table = process_table()
    groups = {}
    for pid, (g, _) in table.items():
        groups.setdefault(g, []).append(pid)
    found = set(carriers(groups, root).get(identity, []))  # root: this workspace's, never a namesake's
    if pgid is not None and group_alive(pgid, identity, groups):
        found.update(groups[pgid])
        seen.add(("g", pgid))
    mine = {("g", os.getpgid(0)), ("s", os.getsid(0))}  # never the stopping process's own
    for pid in found:
        g, sid = table.get(pid, (None, None))
        # Only a group or session led by a process of the identity (or whose leader is gone): one
        # a shell of a user leads holds more than the attempt.
        for key in (("g", g), ("s", sid)):
            if key[1] is not None and key not in mine and (key[1] in found or key[1] not in table):
                seen.add(key)
    found.update(pid for pid, (g, sid) in table.items() if ("g", g) in seen or ("s", sid) in seen)
    found.discard(os.getpid())
    return found


def _stop_host(rt, identity, grace):
    """Host processes: SIGTERM to the group and to every carrier of the identity, the grace, then
    SIGKILL, re-scanning until nothing of the identity is left (a worker that forks while it is
    being killed is caught by the next scan). {"left": n} and an error when some survive."""
    pid = _small_int(_read(os.path.join(rt, "pid"), 64))
    pgid = pid if pid is not None and pid > 0 else None
    out = {}
    seen = set()
    root = os.path.dirname(os.path.dirname(os.path.abspath(rt)))  # <root>/<identity>/runtime
    left = _remaining(pgid, identity, seen, root)
    if not left:
        return out
    out["was_alive"] = True
    if pgid is not None and group_alive(pgid, identity) and not _signal(pgid, 15):
        return {"was_alive": True, "error": f"not permitted to signal process group {pgid}"}
    _signal_pids(left, 15)
    left = _wait_gone(pgid, identity, grace, 15, seen, root)
    if left:
        out["killed"] = True
        if pgid is not None and group_alive(pgid, identity):
            _signal(pgid, 9)
        _signal_pids(left, 9)
        left = _wait_gone(pgid, identity, KILL_WAIT, 9, seen, root)
    if left:
        out["left"] = len(left)
        out["error"] = f"{len(left)} process(es) of {identity} still alive after SIGKILL"
    return out


def _wait_gone(pgid, identity, seconds, sig, seen, root=None):
    """Poll until nothing of the identity lives, giving ``sig`` to any newcomer (a fork since the
    last scan); what is still there after ``seconds``."""
    signalled = set()
    deadline = time.time() + seconds
    while True:
        left = _remaining(pgid, identity, seen, root)
        if not left or time.time() >= deadline:
            return left
        _signal_pids(left - signalled, sig)
        signalled |= left
        time.sleep(0.05)


def _signal_pids(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


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
    for name in ("secrets.env", "storage.env"):  # storage.env: the Storage's credentials
        try:
            os.remove(os.path.join(rt, name))
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
        # The identity's claim (machines/launchers.py) goes with its workspace: a claim that
        # outlived it would refuse every later launch of the identity for another spec.
        head, name = os.path.split(ws.rstrip("/"))
        try:
            os.unlink(os.path.join(head, "." + name + ".claim"))
        except OSError:
            pass
        return {"removed": True}
    if os.path.isdir(ws):  # a workspace staged but never started has no runtime/ yet
        os.makedirs(rt, exist_ok=True)
        with open(os.path.join(rt, "collected"), "w") as fh:
            fh.write(str(time.time()))
    return {"removed": False}

"""Stopping runs and finishing collected workspaces: the agent's ``terminate`` and ``finish``.

Stopping must reach everything a run started and nothing else: a process group only while its
members carry the run's identity, strays that left the group by the identity in their environment,
a container by its name, a Slurm job through scancel. Standard library only, like the rest of the
agent.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

from .readings import _docker_states, _process_groups, _read, group_alive
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

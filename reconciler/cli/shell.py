"""``reconcile ssh NAME [--node N] [-- COMMAND...]``: a shell in the run's workspace, on its machine.

The run's status names its machine and workspace (node 0's, or ``--node N``'s for a run on several
machines); the machine is reached the way the reconciler reaches it: this machine directly, a Fleet
machine, a rental or a Slurm login host over SSH with the login, key and pinned host key the
reconciler uses. OpenSSH's ``ssh`` is the client (a terminal, job control and the user's escape
sequences need a real one), told to trust only the pinned key: a host key that does not match is
refused, never learned.

The process gets the reconciler's allowlisted environment plus the terminal's settings, not the
command line's own environment, which holds the secrets of every run and provider.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from reconciler.core import procenv
from reconciler.core.config import Config
from reconciler.core.errors import ReconcilerError, UsageError
from reconciler.core.names import LOCAL

TERMINAL = ("TERM", "COLORTERM", "COLUMNS", "LINES", "SHELL")


def build(p: argparse.ArgumentParser, run_names) -> None:
    p.add_argument("name", metavar="NAME", help="a run").completer = run_names
    p.add_argument("--node", type=int, default=0, metavar="N", help="for a run on several machines: node N "
                   "(default 0)")
    p.usage = f"{p.prog} NAME [--node N] [--repo DIR] [--config PATH] [-- COMMAND [ARG...]]"
    p.epilog = "After --: run COMMAND in the workspace instead of a login shell (a terminal when stdin is one)."


def target(cfg: Config, name: str, node: int):
    """(machine, workspace, status) of run ``name``'s node ``node``, from its status."""
    from reconciler.status import store as statuses

    from .common import no_such_run, status_names

    st = statuses.load_one(cfg.repo / "status", name)
    if st is None:
        raise no_such_run(name, status_names(cfg))
    h = st.handle
    if h is None or not h.workspace:
        raise ReconcilerError(f"run {name!r} has not been launched (no status handle)")
    nodes = h.nodes or [{"rank": 0, "machine": h.machine, "workspace": h.workspace}]
    for n in nodes:
        if n.get("rank") == node:
            return str(n.get("machine") or LOCAL), str(n.get("workspace") or ""), st
    raise UsageError(f"run {name!r} has no node {node} (nodes: {', '.join(str(n.get('rank')) for n in nodes)})")


def remote_script(workspace: str, command: list[str]) -> str:
    go = f"cd {shlex.quote(workspace)} || exit 1; "
    if command:
        return go + " ".join(shlex.quote(c) for c in command)
    return go + 'exec "${SHELL:-/bin/sh}" -l'


def ssh_argv(t, script: str, known_hosts: str, tty: bool) -> list[str]:
    """OpenSSH's arguments to reach the machine behind SSH transport ``t`` as the reconciler does."""
    ep = t.endpoint
    argv = ["ssh", "-p", str(t.port), "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}",
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "BatchMode=no", "-o", f"ConnectTimeout={int(t.connect_timeout) or 5}"]
    if ep.identity_file:
        argv += ["-i", os.path.expanduser(ep.identity_file), "-o", "IdentitiesOnly=yes"]
    argv += ["-t" if tty else "-T", f"{ep.user}@{t.host}" if ep.user else t.host, script]
    return argv


def _known_hosts(t, folder: str) -> str:
    """A known_hosts file with the machine's pinned key (or the Fleet's known_hosts file as it is)."""
    pinned = t.endpoint.host_key
    if not pinned:
        if t.machine.known_hosts:
            return os.path.expanduser(t.machine.known_hosts)
        raise ReconcilerError(f"{t.where}: no pinned host key and no known_hosts file: refusing to connect")
    host = t.host if t.port == 22 else f"[{t.host}]:{t.port}"
    path = Path(folder) / "known_hosts"
    path.write_text(f"{host} {' '.join(pinned.split()[:2])}\n")
    return str(path)


def cmd_ssh(args: argparse.Namespace, cfg: Config) -> int:
    from reconciler.machines.pool import recorded_pool
    from reconciler.spec.load import load_tree

    command = list(getattr(args, "remote", None) or [])
    machine, ws, st = target(cfg, args.name, args.node)
    env = procenv.base(keep=TERMINAL + ("SSH_AUTH_SOCK",))
    if machine == LOCAL:
        if not Path(ws).is_dir():
            raise ReconcilerError(f"{ws}: the workspace is not there any more (the run was cleaned up)")
        argv = command or [os.environ.get("SHELL") or "/bin/sh", "-l"]
        return subprocess.call(argv, cwd=ws, env=env)
    if shutil.which("ssh") is None:
        raise ReconcilerError("the ssh client (OpenSSH) is not installed here")
    pool = recorded_pool(cfg, load_tree(cfg.repo), {args.name: st})
    try:
        t = pool.get(machine)
        if not hasattr(t, "endpoint"):  # a Slurm cluster whose login host is this machine
            return subprocess.call(command or [os.environ.get("SHELL") or "/bin/sh", "-l"], cwd=ws, env=env)
        with tempfile.TemporaryDirectory(prefix="reconcile-ssh-") as d:
            argv = ssh_argv(t, remote_script(ws, command), _known_hosts(t, d), tty=sys.stdin.isatty())
            return subprocess.call(argv, env=env)
    finally:
        pool.close()

"""``reconcile agent ACTION``: the command line of ``reconciler/agent/tunnel.py`` (run, drain, resume, authorize)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

from reconciler.agent import tunnel as agent
from reconciler.core.errors import UsageError


def cmd_agent(args: argparse.Namespace) -> int:
    if args.action == "run":
        user, _, host = args.vm.rpartition("@")
        if not host or not user:
            raise UsageError("--vm must be USER@HOST (the login the agent's key may use on the reconciler's host)")
        for flag in ("vm_port", "listen_port", "sshd_port"):
            if not 1 <= getattr(args, flag) <= 65535:
                raise UsageError(f"--{flag.replace('_', '-')} must be a port (1-65535)")
        agent.configure_logging()
        return agent.run_agent(agent.TunnelSettings(
            vm_host=host, vm_user=user, vm_port=args.vm_port, listen_port=args.listen_port,
            sshd_port=args.sshd_port, identity_file=args.identity, known_hosts=args.known_hosts,
            max_backoff=max(0.1, args.max_backoff), report_every=max(1.0, args.report_every)))
    if args.action in ("drain", "resume") and args.machine_wide and args.home:
        raise UsageError("--machine-wide and --home name two different flags: give one")
    if args.action == "drain":
        path = agent.drain(args.reason, args.home, path=agent.drain_path(args.home, args.machine_wide))
        print(f"drained: {path} (running work finishes; nothing new starts here until 'reconcile agent resume')")
        return 0
    if args.action == "resume":
        print("resumed" if agent.resume(args.home, agent.drain_path(args.home, args.machine_wide))
              else "was not drained")
        return 0
    return _authorize(args)


def _authorize(args: argparse.Namespace) -> int:
    """The set-up for MACHINE's agent. The Match block covers every ``connect: tunnel`` machine of
    the repository's Fleets (they share the VM login), unless ``--only`` (one VM login per machine)."""
    from reconciler.agent.authorize import instructions
    from reconciler.spec.load import load_tree

    desired = load_tree(Path(args.repo or "."))
    machines = [m for f in desired.fleets.values() for m in f.spec.machines]
    machine = next((m for m in machines if m.name == args.machine), None)
    if machine is None:
        raise UsageError(f"no Fleet declares machine {args.machine!r}")
    if machine.connect != "tunnel":
        raise UsageError(f"machine {args.machine!r} has connect: {machine.connect}; set connect: tunnel and "
                         "tunnel_port in its Fleet first")
    if not 1 <= args.client_alive <= 3600:
        raise UsageError("--client-alive must be 1-3600 seconds")
    try:
        key = Path(args.key).read_text(encoding="utf-8").strip()
    except OSError as e:
        raise UsageError(f"{args.key}: {e.strerror}") from None
    if len(key.split()) < 2 or not key.split()[0].startswith(("ssh-", "ecdsa-", "sk-")):
        raise UsageError(f"{args.key}: not a public key ('ssh-ed25519 AAAA...')")
    ports = [machine.tunnel_port] if args.only else [m.tunnel_port for m in machines
                                                     if m.connect == "tunnel" and m.tunnel_port]
    print(instructions(machine.name, args.vm_user, machine.tunnel_port, key, ports, args.client_alive))
    return 0


def build_parser(p: argparse.ArgumentParser, prog: str, add_globals: Callable) -> None:
    """``reconcile agent``'s actions and options (the command line's parser calls it)."""
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    r = sub.add_parser("run", prog=f"{prog} agent run", help="hold the reverse tunnel (foreground; a systemd unit "
                       "runs it: deploy/reconciler-agent.service)")
    r.add_argument("--vm", required=True, metavar="[USER@]HOST", help="the reconciler's host and the login the "
                   "agent's key may use there")
    r.add_argument("--vm-port", type=int, default=22, metavar="PORT", help="its sshd port (default 22)")
    r.add_argument("--listen-port", type=int, required=True, metavar="PORT",
                   help="the tunnel's port on the host's loopback: the Fleet's tunnel_port")
    r.add_argument("--sshd-port", type=int, default=22, metavar="PORT", help="this machine's sshd (default 22)")
    r.add_argument("--identity", metavar="KEY", help="private key for the host (default: ssh's own)")
    r.add_argument("--known-hosts", metavar="FILE", help="known_hosts holding the host's key (default: ssh's own)")
    r.add_argument("--max-backoff", type=float, default=1.0, metavar="SECONDS",
                   help="longest wait between reconnects (default 1)")
    r.add_argument("--report-every", type=float, default=60.0, metavar="SECONDS",
                   help="while the tunnel is down, one 'still down' log line this often (default 60)")
    d = sub.add_parser("drain", prog=f"{prog} agent drain", help="take this machine out of service: running work "
                       "finishes, nothing new starts (no pull request needed)")
    d.add_argument("--reason", default="drained from the machine", help="shown in the runs' Pending reason")
    d.add_argument("--home", metavar="DIR", help="the home of the login the reconciler uses (default: yours)")
    u = sub.add_parser("resume", prog=f"{prog} agent resume", help="put this machine back in service")
    u.add_argument("--home", metavar="DIR", help="the home of the login the reconciler uses (default: yours)")
    for c in (d, u):
        c.add_argument("--machine-wide", action="store_true", help="the root-owned flag /etc/reconciler/drain "
                       "(as root), which jobs of the reconciler's login cannot lift")
    a = sub.add_parser("authorize", prog=f"{prog} agent authorize", help="print the authorized_keys line and sshd "
                       "Match block the reconciler's host needs for MACHINE's agent (run in the repository)")
    a.add_argument("machine", metavar="MACHINE", help="a Fleet machine with connect: tunnel")
    a.add_argument("--key", required=True, metavar="PUBFILE", help="the agent's public key file")
    a.add_argument("--vm-user", default="reconcile-tunnel", metavar="USER",
                   help="the login on the host that agents use (default reconcile-tunnel)")
    a.add_argument("--only", action="store_true", help="a Match block for MACHINE's port alone (when each "
                   "machine has a VM login of its own); by default it lists every connect: tunnel machine")
    a.add_argument("--client-alive", type=int, default=5, metavar="SECONDS",
                   help="ClientAliveInterval for the agents' login: a silently dead session frees its port "
                   "after about 6x this (measured; default 5)")
    for c in (r, d, u, a):
        if c is a:
            add_globals(c, "agent")

"""``reconcile agent ACTION``: the command line of ``reconciler/agent/tunnel.py`` (run, drain, resume, authorize)."""

from __future__ import annotations

import argparse
from pathlib import Path

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
            max_backoff=max(0.1, args.max_backoff)))
    if args.action == "drain":
        path = agent.drain(args.reason, args.home)
        print(f"drained: {path} (running work finishes; nothing new starts here until 'reconcile agent resume')")
        return 0
    if args.action == "resume":
        print("resumed" if agent.resume(args.home) else "was not drained")
        return 0
    return _authorize(args)


def _authorize(args: argparse.Namespace) -> int:
    from reconciler.spec.load import load_tree

    desired = load_tree(Path(args.repo or "."))
    machine = next((m for f in desired.fleets.values() for m in f.spec.machines if m.name == args.machine), None)
    if machine is None:
        raise UsageError(f"no Fleet declares machine {args.machine!r}")
    if machine.connect != "tunnel":
        raise UsageError(f"machine {args.machine!r} has connect: {machine.connect}; set connect: tunnel and "
                         "tunnel_port in its Fleet first")
    try:
        key = Path(args.key).read_text(encoding="utf-8").strip()
    except OSError as e:
        raise UsageError(f"{args.key}: {e.strerror}") from None
    if len(key.split()) < 2 or not key.split()[0].startswith(("ssh-", "ecdsa-", "sk-")):
        raise UsageError(f"{args.key}: not a public key ('ssh-ed25519 AAAA...')")
    line, block = agent.authorization(machine.name, args.vm_user, machine.tunnel_port, key)
    print(f"# On the reconciler's host, as root (docs/inhouse.md explains each line).\n"
          f"# 1. The login the agents use: useradd -m -s /usr/sbin/nologin {args.vm_user}\n"
          f"# 2. Append to ~{args.vm_user}/.ssh/authorized_keys:\n{line}\n"
          f"# 3. Append to /etc/ssh/sshd_config (Match blocks go last), then: sshd -t && systemctl reload ssh\n"
          f"{block}")
    return 0

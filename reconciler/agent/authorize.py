"""What the reconciler's host (the control VM) must allow the in-house agents, as text to paste.

One VM login usually serves every in-house machine, and sshd keeps, for each keyword, the first
value it obtains (sshd_config(5), "the first obtained value will be used"): a second ``Match
User`` block for the same login is dead text, so its machine's ``PermitListen`` never applies and
its agent is refused its forward. Hence ONE block per VM login, listing every machine's port
(``PermitListen`` takes several ``host:port`` values separated by whitespace: sshd_config(5),
PermitListen), printed again in full whenever a machine is added; the key lines stay one per
machine, each allowed only its own port.

``ClientAliveInterval``/``ClientAliveCountMax`` are in the block because a machine whose session
died without a FIN (power loss, a frozen network) otherwise keeps its port bound on the VM until
TCP gives up, and its own agent's new forward is refused all that while; with them the VM's sshd
drops the dead session once ClientAliveCountMax probes went unanswered (sshd_config(5),
ClientAliveCountMax), about 30 s with the values below (measured).
"""

from __future__ import annotations

# A silent death frees its port after about 2 x (count + 1) x interval, measured with OpenSSH 9.2
# (1 s: 8.2 s, 2 s: 16 s, 4 s: 32 s with count 3; 5 s x 2: 25.5-30 s): 5 x 2 is the ~30 s wanted.
# A live agent answers each probe at once, so a small count costs nothing.
CLIENT_ALIVE_INTERVAL = 5
CLIENT_ALIVE_COUNT = 2


def key_line(machine: str, listen_port: int, public_key: str) -> str:
    """The authorized_keys line: the key may hold its own forward ``127.0.0.1:listen_port`` only.

    ``restrict`` turns everything off; ``port-forwarding`` turns forwarding back on, local forwards
    included, and an authorized_keys ``permitopen="none"`` makes OpenSSH reject the whole line
    (measured), so the Match block closes what the key line cannot."""
    key = " ".join(public_key.split()[:2])
    return (f'restrict,port-forwarding,permitlisten="127.0.0.1:{listen_port}",command="/bin/false" '
            f"{key} reconcile-agent@{machine}")


def match_block(vm_user: str, ports: list[int], client_alive: int = CLIENT_ALIVE_INTERVAL,
                client_alive_count: int = CLIENT_ALIVE_COUNT) -> str:
    """The one ``Match User`` block for ``vm_user``, covering every port in ``ports``.

    ``AllowTcpForwarding remote`` (no -L), ``PermitOpen none``, ``PermitListen`` the agents'
    ports; ``ForceCommand`` stops a shell and ``PermitTTY no`` a terminal."""
    listen = " ".join(f"127.0.0.1:{p}" for p in sorted(set(ports)))
    return "\n".join([
        f"Match User {vm_user}",
        "    AllowTcpForwarding remote",
        "    PermitOpen none",
        f"    PermitListen {listen}",
        "    GatewayPorts no",
        "    X11Forwarding no",
        "    AllowAgentForwarding no",
        "    AllowStreamLocalForwarding no",
        "    PermitTunnel no",
        "    PermitTTY no",
        "    ForceCommand /bin/false",
        f"    ClientAliveInterval {client_alive}",
        f"    ClientAliveCountMax {client_alive_count}",
    ])


def account_command(vm_user: str) -> str:
    """Creates the agents' login so that sshd accepts its key with and without PAM: a fresh
    ``useradd`` account is locked ("!" in shadow), which sshd refuses under ``UsePAM no`` even for a
    key (measured, ../shared notes); ``usermod -p '*'`` unlocks it and still allows no password."""
    return f"useradd -m -s /usr/sbin/nologin {vm_user} && usermod -p '*' {vm_user}"


def instructions(machine: str, vm_user: str, listen_port: int, public_key: str, ports: list[int],
                 client_alive: int = CLIENT_ALIVE_INTERVAL) -> str:
    """The three steps ``reconcile agent authorize`` prints."""
    others = sorted(set(ports) - {listen_port})
    covers = f"this machine's port and {len(others)} other(s) of this login" if others else "this machine's port"
    return (f"# On the reconciler's host, as root (docs/inhouse.md explains each line).\n"
            f"# 1. The login the agents use (once): {account_command(vm_user)}\n"
            f"# 2. Append to ~{vm_user}/.ssh/authorized_keys (first: install -d -o {vm_user} -m 0700 "
            f"~{vm_user}/.ssh):\n{key_line(machine, listen_port, public_key)}\n"
            f"# 3. In /etc/ssh/sshd_config, REPLACE any earlier 'Match User {vm_user}' block with this one\n"
            f"#    ({covers}; Match blocks go last), then: sshd -t && systemctl reload ssh\n"
            f"{match_block(vm_user, [listen_port, *ports], client_alive)}")

"""Benchmark: how soon an in-house machine's tunnel is back after it drops.

Starts a control VM sshd and an in-house sshd on loopback (tests/infra/tunnel.py: the VM's agent
login restricted exactly as ``reconcile agent authorize`` prints; needs root) and the agent as a
real process (``python -m reconciler agent run``), then measures two kinds of drop:

- the VM goes away and comes back (its sshd stopped, which ends the sessions and the tunnel with
  them; started again after ``--down`` seconds): time from the VM accepting TCP again until the
  tunnel's port on the VM answers, through the in-house sshd's banner;
- the agent's ssh client dies (SIGKILL) while the VM stays up: time until the tunnel is back.

Target: at most 2 s after the VM is reachable. The agent's backoff is capped at 1 s by default
(``--max-backoff``), so the figure is about that cap plus one SSH handshake.

    sudo python benchmarks/tunnel_reconnect.py [--rounds 5] [--down 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.infra._proc import port_open, wait_until  # noqa: E402
from tests.infra.tunnel import Inhouse  # noqa: E402


def banner(port: int) -> bool:
    """The tunnel answers end to end: the in-house sshd's banner comes back through it."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.settimeout(1)
            return s.recv(8).startswith(b"SSH-2.0")
    except OSError:
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--down", type=float, default=3.0, help="seconds the VM stays away each round")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rc-tunnel-bench-") as tmp:
        setup = Inhouse(Path(tmp)).start()
        try:
            setup.start_agent()
            vm_back, client_back = [], []
            for _ in range(args.rounds):
                setup.vm.stop()
                wait_until(lambda: not setup.tunnel_open(), timeout=10, what="the tunnel to close")
                time.sleep(args.down)  # the VM really is away for a while: the agent backs off meanwhile
                setup.vm.start()  # returns once the VM accepts TCP
                t0 = time.perf_counter()
                wait_until(lambda: banner(setup.tunnel_port), timeout=30, interval=0.01, what="the tunnel")
                vm_back.append(time.perf_counter() - t0)
            for _ in range(args.rounds):
                # A session that has been up a while, as in real life (a drop within a second of the
                # last one is a flap, and the agent backs off from those, up to --max-backoff).
                time.sleep(1.5)
                os.kill(setup.ssh_child(), signal.SIGKILL)
                t0 = time.perf_counter()
                wait_until(lambda: not port_open("127.0.0.1", setup.tunnel_port, timeout=0.05), timeout=10,
                           interval=0.005, what="the tunnel to close")
                wait_until(lambda: banner(setup.tunnel_port), timeout=30, interval=0.01, what="the tunnel")
                client_back.append(time.perf_counter() - t0)
        finally:
            setup.close()
    for what, xs in (("VM back (after it accepts TCP) -> tunnel back", vm_back),
                     ("agent's ssh client killed -> tunnel back", client_back)):
        print(f"{what}: median {statistics.median(xs):.2f} s, max {max(xs):.2f} s over {len(xs)} rounds")
    ok = max(vm_back) <= 2.0
    print(f"target <= 2 s after the VM is reachable: {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

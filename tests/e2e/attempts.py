"""The live attempts of a run in a test's world, read from the process table: which identities
have a live process (in any session), a sampler that records every moment two of them were alive
at once, and a reaper for what a test leaves running. Only this world's workspace roots are
looked at: another suite beside this one may run attempts of the same name on this machine."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from reconciler.runtime.readings import carriers
from tests.world import World


def here(w: World) -> dict[str, list[int]]:
    """``carriers()`` of this world's workspace roots only: live processes by identity."""
    out: dict[str, list[int]] = {}
    for root in [w.local_root, *map(Path, w.roots)]:
        for ident, pids in carriers(root=str(root / "test")).items():
            out.setdefault(ident, []).extend(pids)
    return out


class Sampler(threading.Thread):
    """Every ``every`` seconds: which attempts of ``name`` have a live process; every moment with two."""

    def __init__(self, name: str, w: World, every: float = 0.02):
        super().__init__(daemon=True)
        self.name_prefix, self.every, self.w = f"{name}-g", every, w
        self.samples = 0
        self.overlaps: list[tuple[float, list[str]]] = []
        self.seen: set[str] = set()
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            alive = sorted(i for i in here(self.w) if i.startswith(self.name_prefix))
            self.samples += 1
            self.seen.update(alive)
            if len(alive) > 1:
                self.overlaps.append((time.time(), alive))
            self._halt.wait(self.every)

    def stop(self) -> None:
        self._halt.set()
        self.join(5)


def reap(name: str, w: World) -> None:
    """SIGKILL every live process of an attempt of ``name`` in this world, until none is left."""
    kill_until_gone(lambda: [p for i, ps in here(w).items() if i.startswith(f"{name}-g") for p in ps], 40)


def kill_until_gone(pids_of, tries: int = 20) -> None:
    """SIGKILL what ``pids_of()`` lists, again, until it lists nothing (a forking worker may add
    children between two rounds)."""
    for _ in range(tries):
        pids = pids_of()
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)

"""Connections to machines for one pass: made on first use, reused within the pass, closed after.

``local`` is this machine; every other name is a Fleet machine reached over SSH. A machine that a
status file names but no Fleet declares any more is reported unreachable with that reason.
"""

from __future__ import annotations

import threading

from .backends.base import MachineInfo
from .backends.local import LocalTransport
from .config import Config
from .errors import PermanentError
from .plan import LOCAL
from .spec.load import DesiredState
from .status import TERMINAL, RunStatus


class TransportPool:
    def __init__(self, cfg: Config, desired: DesiredState):
        self.cfg = cfg
        self._machines = {}
        self._fleet_of = {}
        self._source = {id(f.obj): f.rel for f in desired.files if f.obj is not None}
        for fleet in desired.fleets.values():
            for m in fleet.spec.machines:
                self._machines[m.name] = m
                self._fleet_of[m.name] = fleet
        self._open: dict[str, object] = {}
        self._lock = threading.Lock()

    def machines(self, previous: dict[str, RunStatus]) -> list[str]:
        names = {LOCAL, *self._machines}
        for st in previous.values():
            if st.handle is not None and st.handle.machine and st.phase not in TERMINAL:
                names.add(st.handle.machine)
        return sorted(names)

    def info(self, name: str) -> MachineInfo:
        if name == LOCAL:
            return MachineInfo(LOCAL, self.cfg.local_root, docker_host=self.cfg.docker_host)
        m = self._machines.get(name)
        if m is None:
            raise PermanentError(f"machine {name!r} is not declared in any Fleet")
        root = m.workspace_root.rstrip("/") + "/" + self.cfg.repo_namespace
        return MachineInfo(name, root, docker_host=m.docker_host, python=m.python, fleet_machine=m,
                           known_hosts=self._fleet_of[name].spec.known_hosts,
                           source=self._source.get(id(self._fleet_of[name])))

    def python_for(self, name: str) -> str | None:
        m = self._machines.get(name)
        return m.python if m is not None else None

    def get(self, name: str):
        with self._lock:
            t = self._open.get(name)
            if t is None:
                info = self.info(name)
                if name == LOCAL:
                    t = LocalTransport(info)
                else:
                    from .backends.ssh import SshTransport

                    t = SshTransport(info, connect_timeout=self.cfg.ssh_connect_timeout,
                                     command_timeout=self.cfg.ssh_command_timeout)
                self._open[name] = t
            return t

    def close(self) -> None:
        for t in self._open.values():
            try:
                t.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        self._open.clear()

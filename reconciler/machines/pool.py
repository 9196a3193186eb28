"""Connections to machines for one pass: made on first use, reused within the pass, closed after.

``local`` is this machine; every other name is a Fleet machine reached over SSH, or a rental
(``<provider>/<rental id>``) reached at the endpoint its provider's inventory gives. A machine that
a status file names but no Fleet declares any more (or a rental gone from its provider's
inventory) is reported unreachable with that reason.

A rental's host key is the one its status pinned, else the one its provider vouches for, else
the one it shows on first contact (recorded in ``first_keys``, then pinned in the status).
"""

from __future__ import annotations

import os
import threading

from reconciler.core import replies
from .base import MachineInfo
from .local import LocalTransport, StagingLocalTransport
from reconciler.core.config import Config
from reconciler.core.errors import PermanentError, TemporaryError
from reconciler.core.names import LOCAL, SLURM_PREFIX, slurm_machine
from reconciler.spec.load import DesiredState
from reconciler.core.runstatus import TERMINAL, RunStatus


def connection_key(info: MachineInfo, cfg: Config) -> tuple:
    """Everything a kept connection depends on: when any of it changes, a new one is made."""
    m = info.fleet_machine
    ep = m.ssh
    return (ep.host, ep.port, ep.user, ep.identity_file, ep.host_key, info.known_hosts, info.workspace_root,
            info.docker_host, getattr(m, "connect", "ssh"), getattr(m, "tunnel_port", None),
            cfg.ssh_connect_timeout, cfg.ssh_command_timeout, cfg.ssh_probe_timeout, cfg.ssh_max_reply_bytes)


class TransportPool:
    """``kept``: a long-lived reconciler's connections (machine → (key, transport)), reused from
    pass to pass while the machine's settings are unchanged; without it, every pass connects anew
    and closes at its end."""

    def __init__(self, cfg: Config, desired: DesiredState, kept: dict | None = None, factory=None):
        self.cfg = cfg
        replies.REPLY_BUDGET.resize(cfg.ssh_decode_budget_bytes)  # process-wide; a reload may change it
        self.kept = kept
        self.factory = factory  # MachineInfo → transport, instead of SSH (the scale benchmark's simulation)
        self._machines = {}
        self._fleet_of = {}
        # Only Fleets and Providers name machines; a Run's model is not parsed for this.
        self._source = {id(f.obj): f.rel for f in desired.files
                        if f.kind in ("Fleet", "Provider") and f.obj is not None}
        for fleet in desired.fleets.values():
            for m in fleet.spec.machines:
                self._machines[m.name] = m
                self._fleet_of[m.name] = fleet
        # Slurm clusters, as the machine their login host is (slurm:<login>), with their shared
        # root (validation holds each login host to one root; the first template by id names it).
        self._slurm = {}
        for t in sorted(desired.templates.values(), key=lambda t: t.id):
            if t.placement.slurm is not None:
                self._slurm.setdefault(slurm_machine(t.placement.slurm), t.placement.slurm)
        self._open: dict[str, object] = {}
        self._lock = threading.Lock()
        self._rentals: dict = {}  # machine → ObservedRental (this repository's, from the inventories)
        self._provider_errors: dict[str, str] = {}
        self._pinned: dict[str, str] = {}  # rental machine → host key recorded in a status
        self._recorded: dict[str, dict] = {}  # rental machine → the endpoint a status recorded
        self._inventory_read = False  # whether add_rentals gave this pool the providers' inventories
        self._providers = None
        self._provider_specs = dict(desired.providers)
        self.first_keys: dict[str, str] = {}  # rental machine → host key seen on first contact, this pass

    def add_rentals(self, rentals: dict, errors: dict[str, str], providers, previous: dict[str, RunStatus]) -> None:
        self._rentals, self._provider_errors, self._providers = rentals, errors, providers
        self._inventory_read = True
        self.use_recorded(previous)

    def use_recorded(self, previous: dict[str, RunStatus], providers=None) -> None:
        """Learn the rental endpoints and host keys the statuses recorded. A command that does not
        read the providers' inventories (``reconcile logs``, ``status --machines``) reaches rentals
        through these alone, logging in with the key its providers' adapters name."""
        if providers is not None:
            self._providers = providers
        for st in previous.values():
            r = st.handle.rental if st.handle is not None else None
            m = st.handle.machine if st.handle is not None else None
            if m and "/" in m and r and r.get("host_key"):
                self._pinned.setdefault(m, r["host_key"])
            # The endpoint a status recorded: used while the provider's inventory cannot be read
            # (its API is down, its spec invalid), so runs there are still seen, not lost.
            if m and r and r.get("host") and r.get("port") and st.phase not in TERMINAL:
                self._recorded.setdefault(m, r)

    def machines(self, previous: dict[str, RunStatus]) -> list[str]:
        names = {LOCAL, *self._machines, *self._slurm}
        names.update(m for m, r in self._rentals.items() if r.state == "running" and r.host and r.port)
        for st in previous.values():
            if st.handle is not None and st.handle.machine and st.phase not in TERMINAL:
                names.add(st.handle.machine)
        return sorted(names)

    def _rental_info(self, name: str) -> MachineInfo:
        from reconciler.spec.models.fleet import Machine, SshEndpoint

        provider = name.split("/", 1)[0]
        r = self._rentals.get(name)
        spec = self._provider_specs.get(provider)
        if r is None and (provider in self._provider_errors or not self._inventory_read) and name in self._recorded:
            rec = self._recorded[name]
            from reconciler.core.observed import ObservedRental

            r = ObservedRental(machine=name, provider=provider, id=rec.get("id", ""), name=rec.get("name", ""),
                               state="running", identity="", host=rec["host"], port=rec["port"], user=rec.get("user"),
                               workspace_root=rec.get("workspace_root"), host_key=rec.get("host_key"))
        if r is None:
            if not self._inventory_read:
                raise PermanentError(f"rental {name}: no status records its endpoint")
            if provider in self._provider_errors:
                raise TemporaryError(f"rental {name}: the inventory of {provider} cannot be read "
                                     f"({self._provider_errors[provider]})")
            raise PermanentError(f"rental {name} is gone from {provider}'s inventory")
        if r.state != "running" or not (r.host and r.port):
            raise TemporaryError(f"rental {name} is {r.state}, not running")
        if spec is not None:
            ssh = spec.spec.ssh
        elif name in self._recorded:  # its provider's spec is invalid: what the status recorded
            from reconciler.spec.models.provider import RentalSsh

            rec = self._recorded[name]
            ssh = RentalSsh.model_construct(**{**RentalSsh().model_dump(), **{
                k: rec[k] for k in ("user", "identity_file", "workspace_root") if rec.get(k)}})
        else:
            raise TemporaryError(f"rental {name}: provider {provider} is not defined (or its spec is invalid)")
        key = self._pinned.get(name) or r.host_key or self.first_keys.get(name)
        identity = ssh.identity_file
        if spec is not None and self._providers is not None:
            identity = self._providers.identity_file(provider)
        endpoint = SshEndpoint.model_construct(host=r.host, port=r.port, user=r.user or ssh.user,
                                               identity_file=identity, host_key=key)
        machine = Machine.model_construct(name=name, ssh=endpoint, connect="ssh", tunnel_port=None,
                                          foreign_gpus="ignore", workspace_root=r.workspace_root or ssh.workspace_root,
                                          docker_host=getattr(ssh, "docker_host", None), python=ssh.python,
                                          max_tasks=1, labels={})
        root = machine.workspace_root.rstrip("/") + "/" + self.cfg.repo_namespace
        return MachineInfo(name, root, docker_host=getattr(ssh, "docker_host", None), python=ssh.python,
                           fleet_machine=machine,
                           source=(self._source.get(id(spec)) if spec is not None else None) or f"provider {provider}")

    def rental_key(self, name: str) -> str | None:
        """The host key a rental is pinned to now (None: not a rental, or not met yet)."""
        r = self._rentals.get(name)
        if r is None:
            return self._pinned.get(name)
        return self._pinned.get(name) or r.host_key or self.first_keys.get(name)

    def _slurm_info(self, name: str) -> MachineInfo:
        s = self._slurm.get(name)
        if s is None:
            raise PermanentError(f"{name}: no slurm template names login {name.split(':', 1)[1]!r} any more")
        root = s.workspace_root.rstrip("/") + "/" + self.cfg.repo_namespace
        if s.login == LOCAL:
            return MachineInfo(name, root)
        m = self._machines.get(s.login)
        if m is None:
            raise PermanentError(f"{name}: login host {s.login!r} is not declared in any Fleet")
        return MachineInfo(name, root, python=m.python, fleet_machine=m, known_hosts=self._fleet_of[s.login].spec.known_hosts,
                           source=self._source.get(id(self._fleet_of[s.login])))

    def info(self, name: str) -> MachineInfo:
        if name == LOCAL:
            return MachineInfo(LOCAL, self.cfg.local_root, docker_host=self.cfg.docker_host)
        if name.startswith(SLURM_PREFIX):
            return self._slurm_info(name)
        if "/" in name:
            return self._rental_info(name)
        m = self._machines.get(name)
        if m is None:
            raise PermanentError(f"machine {name!r} is not declared in any Fleet")
        root = m.workspace_root.rstrip("/") + "/" + self.cfg.repo_namespace
        return MachineInfo(name, root, docker_host=m.docker_host, python=m.python, fleet_machine=m,
                           known_hosts=self._fleet_of[name].spec.known_hosts,
                           source=self._source.get(id(self._fleet_of[name])))

    def python_for(self, name: str) -> str | None:
        m = self._machines.get(name)
        if m is None and "/" in name and name.split("/", 1)[0] in self._provider_specs:
            return self._provider_specs[name.split("/", 1)[0]].spec.ssh.python
        return m.python if m is not None else None

    def get(self, name: str):
        with self._lock:
            t = self._open.get(name)
            if t is None:
                if "/" in name and name in self._rentals and self.rental_key(name) is None:
                    r = self._rentals[name]
                    from reconciler.rentals.inventory import fetch_host_key

                    try:  # first contact: the key seen now is the one pinned from here on
                        self.first_keys[name] = fetch_host_key(r.host, r.port, self.cfg.ssh_connect_timeout)
                    except Exception as e:  # noqa: BLE001 - not up yet is the usual reason
                        raise TemporaryError(f"rental {name} ({r.host}:{r.port}): SSH not answering: {e}") from None
                info = self.info(name)
                if name == LOCAL:
                    t = LocalTransport(info)
                elif name.startswith(SLURM_PREFIX) and info.fleet_machine is None:
                    t = StagingLocalTransport(info)  # a Slurm cluster whose login host is this machine
                elif self.factory is not None:
                    t = self.factory(info)
                else:
                    from .ssh import SshTransport

                    key = connection_key(info, self.cfg) if self.kept is not None else None
                    old = self.kept.get(name) if self.kept is not None else None
                    if old is not None and old[0] == key:
                        t = old[1]
                        t.round_trips = 0  # counted per pass
                    else:
                        if old is not None:
                            old[1].close()
                        t = SshTransport(info, connect_timeout=self.cfg.ssh_connect_timeout,
                                         command_timeout=self.cfg.ssh_command_timeout,
                                         probe_timeout=self.cfg.ssh_probe_timeout,
                                         max_reply_bytes=self.cfg.ssh_max_reply_bytes)
                        if self.kept is not None:
                            t.kept = True  # its probes go to a helper kept running there; reconnects back off
                            self.kept[name] = (key, t)
                self._open[name] = t
            return t

    def close(self) -> None:
        """The pass is over: its connections close, except the kept ones (a kept connection to a
        machine this pass did not use is closed: the machine left the fleet or has nothing)."""
        kept = {id(t) for _, t in self.kept.values()} if self.kept is not None else set()
        for t in self._open.values():
            if id(t) in kept:
                continue
            try:
                t.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
        if self.kept is not None:
            for name in [n for n in self.kept if n not in self._open]:
                try:
                    self.kept.pop(name)[1].close()
                except Exception:  # noqa: BLE001
                    pass
        self._open.clear()


def recorded_pool(cfg: Config, desired: DesiredState, previous: dict[str, RunStatus]) -> TransportPool:
    """A pool for a one-off command: Fleet machines as declared, rentals at the endpoints their
    statuses recorded (no provider's API is called)."""
    from reconciler.rentals.inventory import Providers

    providers = Providers(cfg.repo, cfg.state_dir, os.environ.get)
    providers.sync(desired)
    pool = TransportPool(cfg, desired)
    pool.use_recorded(previous, providers)
    return pool

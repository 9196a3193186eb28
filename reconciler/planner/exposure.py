"""Runs of different teams under one unix login: said in the plan, because nothing prevents it.

A run's secrets live in its processes' environment (``/proc/<pid>/environ``) and its files in its
workspace. Any process of the same unix user on that machine can read both: the login, not the run,
is the boundary. Where runs of two teams are live (or about to be launched) under one login (one
``user@host`` of a Fleet, however many Fleet entries name it; this machine for placement
``local``; one Slurm cluster's submitting user), each team can read the other's secrets. The
remedy is the machine's: one login per team (or per run), as several Fleet entries for the host
with different ``ssh.user``. This module only makes the exposure visible, as plan warnings; it is
pure (the plan, the observed world and the desired state in, sentences out).
"""

from __future__ import annotations

import hashlib

from reconciler.core.actions import Action
from reconciler.core.identity import split
from reconciler.core.names import LOCAL
from reconciler.core.observed import ObservedWorld
from reconciler.core.plan import Plan
from reconciler.spec.load import DesiredState

NO_TEAM = "(no team)"


def logins(desired: DesiredState) -> dict[str, str]:
    """Fleet machine name → the unix login its runs run as, as people name it: ``user@host[:port]``
    (two entries for the same login give the same). A machine no Fleet declares (this machine, a
    Slurm cluster, a rental) is its own login."""
    out = {}
    for fleet in desired.fleets.values():
        for m in fleet.spec.machines:
            ssh = m.ssh
            port = f":{ssh.port}" if getattr(m, "connect", "ssh") == "ssh" and ssh.port != 22 else ""
            out[m.name] = f"{ssh.user}@{ssh.host}{port}"
    return out


def shared_login_warnings(desired: DesiredState, world: ObservedWorld, plan: Plan) -> list[str]:
    """One warning per login that runs of more than one team hold (live, or launched by this plan).

    The sentences depend only on who is placed where, the logins and the runs' teams: when those
    are what the last call saw (the same placements, logins and spec file contents), its sentences
    are the answer, without reading every run's labels again (a steady pass over a large fleet)."""
    label = desired.policy.spec.teamLabel if desired.policy is not None else "team"
    placed = _placed(world, plan)
    known = logins(desired) if placed else {}
    teams = _teams_key(desired, placed)
    last = _last[0]
    if teams is not None and last is not None and last[:4] == (label, teams, known, placed):
        return list(last[4])
    out = _warnings(desired, placed, label, known)
    _last[0] = (label, teams, known, placed, tuple(out)) if teams is not None else None
    return out


# The last call's (team label, its runs' contents, logins, placements, sentences): one, and of
# values only, so that it holds no spec record or model alive (engine/rehome.py counts on that).
_last: list = [None]


def _teams_key(desired: DesiredState, placed: dict[str, set[str]]) -> bytes | None:
    """A digest of each placed run's name and spec file content (its team is read from those
    bytes); None when a run has no file (made in memory, not loaded)."""
    runs = desired.runs
    shas = []
    for names in placed.values():
        for name in names:
            entry = runs.get(name)
            if entry is None:
                shas.append(name + "=-")
                continue
            f = entry.file
            if f is None:
                return None
            shas.append(name + "=" + f.sha)
    return hashlib.blake2b("\0".join(shas).encode(), digest_size=16).digest()


_STARTS = (Action.LAUNCH, Action.RELAUNCH)  # asked of every change: an Enum member looked up on its class costs a call


def _placed(world: ObservedWorld, plan: Plan) -> dict[str, set[str]]:
    """Machine → the names of the runs live there or launched there by ``plan``."""
    placed: dict[str, set[str]] = {}
    for m in world.machines.values():
        here = None
        for r in m.runs.values():
            if r.state != "running":  # ObservedRun.alive, without the property's call
                continue
            p = split(r.identity)[0]
            if p is not None:
                if here is None:
                    here = placed.setdefault(m.name, set())
                here.add(p.name)
    for c in plan.changes:
        if c.action in _STARTS:
            for machine in [n.machine for n in c.nodes] or [c.machine]:
                if machine:
                    placed.setdefault(machine, set()).add(c.name)
    return placed


def _warnings(desired: DesiredState, placed: dict[str, set[str]], label: str, known: dict[str, str]) -> list[str]:
    shared: dict[str, dict[str, set[str]]] = {}  # login → team → runs
    machines_of: dict[str, set[str]] = {}
    for machine, names in placed.items():
        login = known.get(machine, machine)
        machines_of.setdefault(login, set()).add(machine)
        for name in names:
            entry = desired.runs.get(name)
            if entry is None:
                continue
            team = entry.run.metadata.labels.get(label) or NO_TEAM
            shared.setdefault(login, {}).setdefault(team, set()).add(name)
    out = []
    for login, teams in sorted(shared.items()):
        if len(teams) < 2:
            continue
        who = "; ".join(f"{t}: {', '.join(sorted(r)[:3])}" + (" ..." if len(r) > 3 else "")
                        for t, r in sorted(teams.items()))
        where = ", ".join(sorted(machines_of[login]))
        what = ("the reconciler's own login on this machine (local)" if login == LOCAL
                else f"the unix login {login} (machine {where})")
        remedy = ("run them on Fleet machines, one login per team" if login == LOCAL
                  else "give each team its own login (a Fleet entry per team with its own ssh.user)")
        out.append(f"runs of different teams share {what}: {who}; each can read the others' secrets "
                   f"(/proc/<pid>/environ) and workspaces; {remedy}")
    return out

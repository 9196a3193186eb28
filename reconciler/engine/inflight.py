"""Launches in flight: what a reconciler killed mid-launch may still start after it died.

A launch is a command on a machine (over SSH, or a local subprocess) that goes on when the
reconciler that issued it is killed: the bundle is unpacked, then the wrapper started. If it lands
after the next reconciler looked at that machine, and that one numbered the run's next identity
blind (git never heard of the launch), one identity would name two spec contents.

Two things bound it. Each launch carries a deadline (the reconciler's clock at issue plus
``launch_ttl``) that the machine checks last before the job starts (machines/launchers.py), so a
launch lands before it or never. And this journal, ``.reconciler/inflight.json`` (never in git),
is written before each launch is issued and cleared when its answer arrives: a restart on the
same checkout holds exactly the runs whose launches had no answer, until their deadlines plus
``launch_clock_margin`` (planner/fence.py ``hold_predecessor_launches``). Without a journal (a
fresh clone, a lost state folder) nothing can be proven, so every start of an identity that no
status records and no machine shows waits one ``launch_ttl`` plus the margin from the process's
first pass: any predecessor died before that pass, so its last deadline is behind it by then.

An entry whose answer never came (the connection dropped mid-launch) stays until its deadline has
passed: the launch may still land, made by this very process.

Writes are few: launches issued at the same moment (a burst, ``launch_width`` at once) share one
write of the file, and an answer is written with the next launch or at the end of the pass
(``flush``), not on its own. An answer that is not on disk yet only leaves an entry that a
successor would honour for a launch that did land (it is in sight on its machine then): a hold of
that run until the deadline, never a start too early.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger("reconciler")
FILE = "inflight.json"
VERSION = 1
MAX_ENTRIES = 100_000  # a file larger than this is not ours: read as no journal


@dataclass(frozen=True)
class Entry:
    run: str
    machine: str
    identity: str
    not_after: float  # the launch's deadline (this host's clock)


class Journal:
    """The launches this checkout's reconcilers issued and heard no answer from."""

    def __init__(self, cfg):
        self.path = Path(cfg.state_dir) / FILE
        self.ttl, self.margin = cfg.launch_ttl, cfg.launch_clock_margin
        found = _load(self.path)
        # No readable journal: the predecessor's launches cannot be known (see the module's text).
        self.proven = found is not None
        self.entries: dict[tuple[str, str, str], Entry] = {(e.run, e.machine, e.identity): e for e in found or []}
        self.first_pass: float | None = None
        self.blanket_until: float | None = None
        self._lock = threading.Lock()  # the entries
        self._write_lock = threading.Lock()  # one writer at a time; a write covers every change before it
        self._changes = 0  # changes made to the entries, and how many of them are on disk
        self._written = 0
        self._made = False  # the state folder is known to exist

    def begin(self, now: float, history: bool) -> None:
        """The first pass that may launch: the blanket hold (no journal) counts from here, and
        the journal is written at once, so the next process on this checkout has one.
        ``history``: whether the repository had statuses then; without any, no reconciler ever
        pushed here and there is no blanket hold (docs/loop.md, "Identities", says what that
        leaves open). The statuses this process writes later change nothing of that."""
        if self.first_pass is None:
            self.first_pass = now
            if not self.proven and history:
                self.blanket_until = now + self.ttl + self.margin
            with self._lock:
                self._expire(now)
                self._changes += 1
            self.flush()

    def issue(self, run: str, machine: str, identity: str, now: float | None = None) -> float:
        """Record a launch about to be issued; its deadline. Returns once the entry is on disk."""
        now = time.time() if now is None else now
        e = Entry(run, machine, identity, now + self.ttl)
        with self._lock:
            self._expire(now)
            self.entries[(run, machine, identity)] = e
            self._changes += 1
        self.flush()
        return e.not_after

    def answered(self, run: str, machine: str, identity: str) -> None:
        """The machine answered: the launch started or adopted the identity. (A launch that failed
        keeps its entry until its deadline: a lost connection and a refusal read alike here.)
        Written with the next launch or ``flush``."""
        with self._lock:
            if self.entries.pop((run, machine, identity), None) is not None:
                self._changes += 1

    def flush(self) -> None:
        """Write the entries if a change is not on disk yet. Callers that arrive while another
        writes wait for it, and find their change written by it or write once more themselves."""
        with self._lock:
            wanted = self._changes
        with self._write_lock:
            if self._written >= wanted:
                return
            with self._lock:
                doc = {"version": VERSION, "launches": [asdict(e) for e in self.entries.values()]}
                upto = self._changes
            self._write(doc)
            self._written = upto

    def holds(self, now: float) -> tuple[dict[str, Entry], float | None]:
        """What to hold: per run, the unanswered launch whose hold ends last; and until when every
        unrecorded, unseen identity waits (None: no blanket hold)."""
        per_run: dict[str, Entry] = {}
        for e in list(self.entries.values()):
            if e.not_after + self.margin > now and (e.run not in per_run or e.not_after > per_run[e.run].not_after):
                per_run[e.run] = e
        blanket = self.blanket_until if self.blanket_until is not None and self.blanket_until > now else None
        return per_run, blanket

    def _expire(self, now: float) -> None:
        for k, e in list(self.entries.items()):
            if e.not_after + self.margin <= now:
                del self.entries[k]

    def _write(self, doc: dict) -> None:
        """Atomically: a process killed while writing leaves the old journal, never half of one."""
        if not self._made:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._made = True
        tmp = str(self.path.with_name(f".{FILE}.{os.getpid()}.tmp"))
        with open(tmp, "wb") as fh:
            fh.write(json.dumps(doc, sort_keys=True).encode())
        os.replace(tmp, self.path)


def _load(path: Path) -> list[Entry] | None:
    """The journal's entries; None when there is none or it cannot be read (no proof either way)."""
    try:
        if path.stat().st_size > 64 * MAX_ENTRIES:
            return None
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("launches"), list):
        return None
    out = []
    for d in doc["launches"]:
        try:
            out.append(Entry(str(d["run"]), str(d["machine"]), str(d["identity"]), float(d["not_after"])))
        except (KeyError, TypeError, ValueError):
            return None
    return out


def hold(plan, world, previous: dict, journal: Journal, now: float) -> float | None:
    """Turn the plan's starts that a predecessor's launch could collide with into waits
    (planner/fence.py); return when the last of those waits ends (None: nothing held)."""
    from reconciler.planner.fence import hold_predecessor_launches

    per_run, blanket = journal.holds(now)
    if not per_run and blanket is None:
        return None
    inflight = {r: (e.machine, e.identity, e.not_after + journal.margin) for r, e in per_run.items()}
    hold_predecessor_launches(plan, world, previous, inflight, blanket, now)
    ends = [max(inflight.get(c.name, ("", "", 0.0))[2], blanket or 0.0)
            for c in plan.changes if c.code == "LaunchInFlight"]
    return max(ends, default=None)


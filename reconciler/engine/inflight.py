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

A host process launched on this machine by this process's own system calls (machines/local_launch.py)
is not recorded: nothing of it runs outside this process before its wrapper starts, so nothing of
it can land once this process is gone (engine/apply.py ``in_process`` says why that is enough).
It still carries a deadline (``deadline``), checked by the same guard.

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
PREVIOUS = ".inflight.json.previous"  # the journal while its successor is renamed into place (Journal._write)
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

    def deadline(self, now: float | None = None) -> float:
        """The deadline of a launch that is not recorded (engine/apply.py ``in_process``)."""
        return (time.time() if now is None else now) + self.ttl

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
        """Atomically: a process killed while writing leaves the old journal, never half of one.

        Never a rename over an existing file: ext4 (``auto_da_alloc``, ext4(5)) starts writing the
        new file's data out on such a rename, and the rename waits for it: 3 to 17 ms on this
        kind of VM, against 0.1 ms for a rename onto a free name. So the journal in place is
        first moved aside as ``PREVIOUS`` (a free name: a stale one is removed first), the new one
        renamed into the free place, and the old one removed; a process killed in between leaves
        ``PREVIOUS`` alone, which ``_load`` reads then (it is the journal of every launch issued
        so far: ``issue`` returns only after the write)."""
        if not self._made:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._made = True
        tmp = str(self.path.with_name(f".{FILE}.{os.getpid()}.tmp"))
        with open(tmp, "wb") as fh:
            fh.write(json.dumps(doc, sort_keys=True).encode())
        aside = str(self.path.with_name(PREVIOUS))
        _unlink(aside)
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            aside = ""
        os.rename(tmp, self.path)
        if aside:
            _unlink(aside)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _load(path: Path) -> list[Entry] | None:
    """The journal's entries; None when there is none or it cannot be read (no proof either way).
    Without the journal, the one moved aside while it was replaced (a writer killed in between)."""
    doc = None
    # (in, aside, in again: a writer may move one between the reads; none of the three: no journal)
    for p in (path, path.with_name(PREVIOUS), path):
        try:
            if p.stat().st_size > 64 * MAX_ENTRIES:
                return None
            doc = json.loads(p.read_text())
            break
        except FileNotFoundError:
            continue
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


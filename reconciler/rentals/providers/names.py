"""What an HTTP adapter remembers between passes and restarts: the way back from a provider's short
name to the reconciler's rental name, and when each rental was first seen.

Providers are sent ``offers.provider_name(name)`` (a hash: see reconciler/spec/offers.py), so the
reconciler's name cannot be read off a listing. It is kept in three places, tried in order: this
book (written before the create is sent, so a create whose answer is lost is still recognised),
the provider's own metadata for the rental (Lambda tags, Targon envs; checked against the hash),
and, when both are gone, the namespace hash in the name itself, which is enough for the orphan
sweep to give the machine back (``offers.lost_rental_name``).

First-seen times stand in for a creation time where the provider reports none (Lambda's Instance
has no creation time in its OpenAPI 1.10.0): provisionTimeout, maxDuration and orphanGrace count
from them. They are kept in the state folder, so a restarted reconciler does not start the clocks
again.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

from reconciler.spec.offers import lost_rental_name, namespace_hash, parse_rental_name, provider_name, \
    split_provider_name

log = logging.getLogger("reconciler.providers")


class NameBook:
    def __init__(self, path: Path | None):
        self.path = path
        self.names: dict[str, str] = {}  # provider name → reconciler name
        self.seen: dict[str, float] = {}  # rental id → unix time first seen (or asked for)
        self.namespaces: set[str] = set()
        self._lock = threading.Lock()
        self._load()

    def _load(self) -> None:
        if self.path is None or not self.path.exists():
            return
        try:
            doc = json.loads(self.path.read_text())
            self.names = {str(k): str(v) for k, v in (doc.get("names") or {}).items()}
            self.seen = {str(k): float(v) for k, v in (doc.get("seen") or {}).items()}
            self.namespaces = {str(n) for n in doc.get("namespaces") or []}
        except (OSError, ValueError, TypeError, AttributeError) as e:
            log.warning("rental name book %s unreadable (%s); starting empty", self.path, e)

    def _save(self) -> None:
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"names": self.names, "seen": self.seen,
                                       "namespaces": sorted(self.namespaces)}, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError as e:  # the provider's metadata still holds the names
            log.warning("rental name book %s not written: %s", self.path, e)

    def remember(self, name: str) -> str:
        """The provider name for ``name``, recorded before anything is sent."""
        pname = provider_name(name)
        parsed = parse_rental_name(name)
        with self._lock:
            if self.names.get(pname) != name or (parsed and parsed.namespace not in self.namespaces):
                self.names[pname] = name
                if parsed is not None:
                    self.namespaces.add(parsed.namespace)
                self._save()
        return pname

    def resolve(self, pname: str, hint: str | None = None) -> str | None:
        """The reconciler name behind a provider's name: the name itself when it is one of ours in
        the older long form; the book's; ``hint`` (from the provider's metadata) when it hashes to
        ``pname``; a lost-rental name when only the namespace hash is known; else None."""
        if parse_rental_name(pname) is not None:
            return pname
        parts = split_provider_name(pname)
        if parts is None:
            return None
        with self._lock:
            known = self.names.get(pname)
        if known is not None:
            return known
        if hint and parse_rental_name(hint) is not None and provider_name(hint) == pname:
            self.remember(hint)
            return hint
        with self._lock:
            for ns in self.namespaces:
                if namespace_hash(ns) == parts[0]:
                    return lost_rental_name(ns, pname)
        return None

    def first_seen(self, rental_id: str, now: float | None = None) -> float:
        with self._lock:
            if rental_id not in self.seen:
                self.seen[rental_id] = now if now is not None else time.time()
                self._save()
            return self.seen[rental_id]

    def forget_except(self, live_ids: set[str]) -> None:
        """Drop the first-seen times of rentals no longer listed (names stay: they are tiny, and a
        late listing of a rental must still resolve)."""
        with self._lock:
            gone = [i for i in self.seen if i not in live_ids]
            for i in gone:
                del self.seen[i]
            if gone:
                self._save()


def book_for(state_dir: Path | None, provider: str) -> NameBook:
    return NameBook(Path(state_dir) / "providers" / f"{provider}.json" if state_dir is not None else None)

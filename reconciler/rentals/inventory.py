"""Rentals at run time: the adapters of the repository's providers, one inventory listing per
provider and pass, the GPU check of a fresh machine, and first-contact host keys.

The planner decides from ``ObservedWorld.rentals`` (filled here) and apply carries out its
``provision`` and ``release`` changes through the same adapters. API calls per pass are bounded
by the number of providers, not of rentals: one inventory listing each (in parallel), one live
offer listing each (Targon, Lambda, RunPod, Vast.ai), plus one call per machine asked for or given
back.

Live offers reach the planner as values, like the catalog always did: once per pass each
provider's listing is merged with its catalog (``offers.effective_offers``) and the pass's copy of
the Provider carries the result as ``spec.offers``. A listing that fails leaves the catalog as
written (logged): the pass goes on with what the repository says.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from reconciler.core.errors import PermanentError, ReconcilerError, TemporaryError
from reconciler.core.observed import ObservedRental
from reconciler.spec.offers import effective_offers, gpu_tokens, parse_rental_name
from .providers.base import AdapterContext, adapter_for, valid_rentals
from reconciler.spec.load import DesiredState

log = logging.getLogger("reconciler")
BAD_OFFER_SECONDS = 1800.0
BAD_OFFERS_FILE = "bad-offers.json"  # under the state folder (.reconciler/, git-ignored)


class Providers:
    """The adapters of the repository's providers, kept across passes (their rate limits, caches
    and the offers that failed a GPU check lately live with them)."""

    def __init__(self, repo: Path, state_dir: Path, secret_source: Callable[[str], str | None]):
        self.ctx = AdapterContext(secret_source=secret_source, state_dir=state_dir, repo=repo)
        self._adapters: dict[str, tuple[str, object]] = {}
        # Offers set aside (failed GPU check, no capacity): kept in the state folder too, so that
        # a `reconcile --once` from cron remembers them as the daemon does and does not rent the
        # same bad offer again on every run.
        self._bad_path = Path(state_dir) / BAD_OFFERS_FILE if state_dir is not None else None
        self.bad_offers: dict[tuple[str, str], float] = _read_bad_offers(self._bad_path, time.time())
        self.offer_errors: dict[str, str] = {}  # provider → why its live offers were not read this pass
        self._offers_in_use: dict[str, dict] = {}  # provider → {offer id: Offer} of its live rentals
        self._lock = threading.Lock()

    def sync(self, desired: DesiredState) -> None:
        """Make an adapter for every provider, anew where its spec changed."""
        with self._lock:
            for name, p in desired.providers.items():
                key = json.dumps(p.model_dump(mode="json"), sort_keys=True)
                if name not in self._adapters or self._adapters[name][0] != key:
                    self._adapters[name] = (key, adapter_for(p, self.ctx))
            # An invalid provider file keeps the adapter of its last valid spec (if this process
            # has one): its rentals stay listed, and nothing of them is released meanwhile.
            for name in [n for n in self._adapters if n not in desired.providers
                         and n not in desired.invalid_providers]:
                del self._adapters[name]
        self.price(desired)

    def price(self, desired: DesiredState, parallel: int = 8) -> None:
        """This pass's offers: each provider with a market lists it once, and ``desired`` (this
        pass's copy) and the adapter get the Provider with the catalog merged into it."""
        names = [n for n in desired.providers if hasattr(self._adapters.get(n, (None, None))[1], "live_offers")]
        if not names:
            return

        def one(name: str):
            try:
                return name, self.get(name).live_offers(), None
            except ReconcilerError as e:
                return name, None, str(e)
            except Exception as e:  # noqa: BLE001 - one provider's listing never stops the pass
                return name, None, f"{type(e).__name__}: {e}"

        with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(names)))) as pool:
            results = list(pool.map(one, names))
        for name, live, error in results:
            p = desired.providers[name]
            if error is not None:
                self.offer_errors[name] = error
                log.warning("provider %s: live offers unavailable (%s); the catalog is used as written", name, error)
            else:
                self.offer_errors.pop(name, None)
            offers = effective_offers(p, live)
            # An offer a live rental was made from stays known (a Vast.ai ask leaves the market once
            # rented): the planner checks the machine's GPUs and fit against it.
            ids = {o.id for o in offers}
            offers += [o for i, o in sorted(self._offers_in_use.get(name, {}).items()) if i not in ids]
            merged = p.model_copy(update={"spec": p.spec.model_copy(update={"offers": offers})})
            desired.providers[name] = merged
            self.get(name).provider = merged

    def get(self, name: str):
        with self._lock:
            found = self._adapters.get(name)
        if found is None:
            raise PermanentError(f"provider {name!r} is not defined")
        return found[1]

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._adapters)

    def calls(self) -> int:
        with self._lock:
            return sum(getattr(a, "calls", 0) for _, a in self._adapters.values())

    def mark_bad(self, provider: str, offer: str | None, seconds: float = BAD_OFFER_SECONDS) -> None:
        if not offer:
            return
        now = time.time()
        with self._lock:
            # Another process may have set offers aside since this one read the file: keep theirs.
            merged = _read_bad_offers(self._bad_path, now)
            for key, until in self.bad_offers.items():
                if until > now:
                    merged[key] = max(until, merged.get(key, 0.0))
            merged[(provider, offer)] = max(now + (seconds or BAD_OFFER_SECONDS), merged.get((provider, offer), 0.0))
            self.bad_offers = merged
            _write_bad_offers(self._bad_path, merged)

    def identity_file(self, provider: str) -> str | None:
        a = self.get(provider)
        if a.provider.spec.ssh.identity_file:
            return a.provider.spec.ssh.identity_file
        make = getattr(a, "identity_file", None)
        return str(make()) if make is not None else None

    def observe(self, namespace: str, parallel: int = 8) -> tuple[dict[str, ObservedRental], dict[str, str]]:
        """One inventory listing per provider: this repository's rentals, and the providers whose
        inventory could not be read (nothing is provisioned or reaped there this pass)."""
        names = self.names()
        rentals: dict[str, ObservedRental] = {}
        errors: dict[str, str] = {}

        def one(name: str):
            try:
                return name, self.get(name).inventory(), None
            except ReconcilerError as e:
                return name, [], str(e)
            except Exception as e:  # noqa: BLE001 - one provider's trouble never stops the pass
                return name, [], f"{type(e).__name__}: {e}"

        if not names:
            return rentals, errors
        with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(names)))) as pool:
            results = list(pool.map(one, names))
        for name, items, error in results:
            if error is not None:
                errors[name] = error
                continue
            self._remember_offers(name, items)
            # Every adapter's ids, checked once more here (the command adapter's come from a
            # program's output): a bad one is left out with the reason in the log.
            for r in valid_rentals(name, items):
                parsed = parse_rental_name(r.name, namespace)
                if parsed is None or r.state == "terminated":
                    continue  # not this repository's: never looked at again
                machine = f"{name}/{r.id}"
                rentals[machine] = ObservedRental(
                    machine=machine, provider=name, id=r.id, name=r.name, state=r.state, identity=parsed.identity,
                    n=parsed.n, host=r.host, port=r.port, user=r.user, price_per_hour=r.price_per_hour,
                    created_at=r.created_at, offer=r.offer, message=r.message, workspace_root=r.workspace_root,
                    host_key=r.host_key)
        return rentals, errors

    def _remember_offers(self, name: str, items: list) -> None:
        try:
            known = {o.id: o for o in self.get(name).provider.spec.offers}
        except PermanentError:
            return
        used = {r.offer for r in items if r.offer and r.state != "terminated"}
        before = self._offers_in_use.get(name, {})
        self._offers_in_use[name] = {i: known.get(i) or before[i] for i in used if i in known or i in before}


def _read_bad_offers(path: Path | None, now: float) -> dict[tuple[str, str], float]:
    """The offers still set aside; a missing, unreadable or malformed file (or entry) counts as
    none set aside: the worst that costs is one more rental of a bad offer."""
    if path is None:
        return {}
    try:
        doc = json.loads(path.read_text())
        entries = doc.get("offers") if isinstance(doc, dict) else None
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        log.warning("%s unreadable (%s); no offer is set aside", path, e)
        return {}
    out: dict[tuple[str, str], float] = {}
    for e in entries if isinstance(entries, list) else []:
        try:
            key, until = (str(e["provider"]), str(e["offer"])), float(e["until"])
        except (KeyError, TypeError, ValueError):
            continue
        if until > now:
            out[key] = max(until, out.get(key, 0.0))
    return out


def _write_bad_offers(path: Path | None, bad: dict[tuple[str, str], float]) -> None:
    """Written whole to a temporary file renamed over the old one: a reader (or a kill -9) never
    sees half a file."""
    if path is None:
        return
    doc = {"offers": [{"provider": p, "offer": o, "until": round(u, 3)} for (p, o), u in sorted(bad.items())]}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        ignore = path.parent / ".gitignore"
        if not ignore.exists():  # the state folder is never committed, even where .gitignore forgot it
            ignore.write_text("*\n")
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except OSError as e:  # this process still remembers them
        log.warning("%s not written: %s", path, e)


def fetch_host_key(host: str, port: int, timeout: float = 5.0) -> str:
    """The SSH server's host key, '<type> <base64>', read without logging in (first contact)."""
    import paramiko

    sock = socket.create_connection((host, port), timeout=timeout)
    t = paramiko.Transport(sock)
    try:
        t.banner_timeout = timeout
        t.start_client(timeout=timeout)
        key = t.get_remote_server_key()
        return f"{key.get_name()} {key.get_base64()}"
    finally:
        t.close()


def wait_for_ssh(transport, timeout: float) -> None:
    """Until the rental's sshd lets us in: a fresh machine's sshd starts after the provider says
    it runs. Backoff from 0.2 s; a TemporaryError after ``timeout`` (the next pass tries again)."""
    deadline = time.monotonic() + timeout
    delay = 0.2
    while True:
        try:
            r = transport.sh("true", timeout=min(10.0, timeout))
            if r.rc == 0:
                return
            error = f"exit {r.rc}: {r.err.strip()[:200]}"
        except PermanentError:
            raise
        except ReconcilerError as e:
            error = str(e)
        if time.monotonic() + delay > deadline:
            raise TemporaryError(f"SSH not ready on {transport.machine.name} after {timeout:g}s: {error}",
                                 retry_after=5.0)
        time.sleep(delay)
        delay = min(delay * 2, 3.0)
        close = getattr(transport, "close", None)
        if close is not None:
            close()  # a refused connection is not retried on the same client


GPU_QUERY = "nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits"


def verify_gpus(transport, want: dict) -> str:
    """Ask the machine's NVIDIA driver (nvidia-smi, NVML's own tool) what GPUs it has, and compare
    them with the offer: the model by name, the count, the memory within 10 %. Returns a summary;
    raises ``GpuMismatch`` when the machine is not what was paid for."""
    r = transport.sh(GPU_QUERY, timeout=30)
    if r.rc != 0:
        raise GpuMismatch(f"nvidia-smi failed (exit {r.rc}): {(r.err or r.out).strip()[:200]}")
    gpus = []
    for line in r.out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2:
            try:
                gpus.append((parts[0], float(parts[1])))
            except ValueError:
                continue
    count, gtype, mem = want.get("count") or 0, want.get("type"), want.get("memory_gb")
    seen = f"{len(gpus)} x {gpus[0][0]}" if gpus else "no GPU"
    if len(gpus) < count:
        raise GpuMismatch(f"offer promised {count} x {gtype or 'GPU'}, the machine has {seen}")
    model = next((t for t in gpu_tokens(gtype) if any(c.isdigit() for c in t)), gtype.lower()) if gtype else None
    if model and not all(model in gpu_tokens(name) or model in name.lower() for name, _ in gpus[:count]):
        raise GpuMismatch(f"offer promised {gtype}, the machine has {seen}")
    if mem:
        low = [m for _, m in gpus[:count] if m / 1024 < mem * 0.9]
        if low:
            raise GpuMismatch(f"offer promised {mem:g} GB per GPU, the machine has {low[0] / 1024:.0f} GB")
    return f"{seen} ({gpus[0][1] / 1024:.0f} GB)" if gpus else "no GPU"


class GpuMismatch(TemporaryError):
    """The rental is not the machine the offer promised; it is given back and another is rented."""


__all__ = ["Providers", "fetch_host_key", "wait_for_ssh", "verify_gpus", "GpuMismatch"]

"""Status files: the reconciler's record of what it saw and did, one YAML file per run.

Status is lenient on read (unknown keys from a newer reconciler are ignored, a broken file reads
as "no status") and deterministic on write (fixed key order, no timestamps that change unless the
status changed), so an unchanged status is byte-identical and makes no commit.

This module is also the one place that computes conditions: ``summarize`` turns a plan's change
and its outcome into the next status.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from ruamel.yaml import YAML

from reconciler.core.actions import Action
from reconciler.core.runstatus import (HISTORY_LIMIT, TERMINAL, Condition, Handle, RunStatus, Transition, cost_so_far,
                                        iso, parse_iso)
from reconciler.spec.models import DNS_LABEL, DNS_LABEL_MAX
from reconciler.core.yamlemit import Flow, pyyaml_dump
from reconciler.core.yamlemit import dump as emit_yaml

# ---------------------------------------------------------------- files

_ORDER = ["apiVersion", "kind", "name", "phase", "generation", "attempt", "message", "exit_code", "preemptions",
          "retry_at", "spec", "handle", "cost", "placement", "conditions", "progress", "loss_curve", "artifacts", "provenance", "history",
          "observed_at"]
CURVE_POINTS = 120


def extend_curve(curve: list, progress: dict[str, Any] | None) -> list:
    """The curve with the progress's (step, loss) added. A step at or before the last one (a run
    that restarted from scratch, or from an earlier checkpoint) first drops the points it replaces;
    a full curve keeps its first and last points and every other one between, so it stays bounded
    and still spans the whole run."""
    if not progress:
        return curve
    step, loss = progress.get("step"), progress.get("loss")
    if isinstance(step, bool) or not isinstance(step, int) or isinstance(loss, bool) or not isinstance(loss, (int, float)):
        return curve
    try:
        value = round(float(loss), 6)
    except OverflowError:  # an int beyond the float range: no point to draw
        return curve
    if curve and curve[-1][0] == step and curve[-1][1] == value:
        return curve
    out = [tuple(p) for p in curve if p[0] < step] + [(step, value)]
    if len(out) > CURVE_POINTS:
        out = [out[0]] + out[1:-1][1::2] + [out[-1]]
    return out


def _yaml() -> YAML:
    """The reader for status files libyaml refuses (or when PyYAML lacks libyaml)."""
    return YAML(typ="safe", pure=True)


# A status holds what machines and jobs said (messages, artifact names, progress keys), and
# anyone who can push can write one. Text is written out so that any of it can be written and
# read back: every character that is not printable, line breaks and tabs apart (controls, NUL,
# lone surrogates from a JSON "\ud800", which no UTF-8 writer takes, bidirectional overrides,
# zero-width characters), as ``\xNN``/``\uNNNN`` text, at most TEXT_LIMIT characters; keys at
# most KEY_LIMIT, because YAML writes a longer key as an explicit "? " key that the fast reader
# does not take; integers of thousands of digits as text (``>1e308``); nesting at most
# NEST_LIMIT deep. The same value always gives the same
# text, so an unchanged status stays byte-identical.
TEXT_LIMIT = 8192
KEY_LIMIT = 100
NEST_LIMIT = 24
_UNWRITABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u206f"
                         "\ud800-\udfff\ufeff\ufff9-\ufffb\ufffe\uffff]")


def _escaped(m: re.Match) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def writable_text(text: str, limit: int = TEXT_LIMIT) -> str:
    """``text`` as a status file can always hold it (see above)."""
    if len(text) > limit:
        text = text[: limit - 1] + "\u2026"
    if text.isascii() and text.isprintable():
        return text
    out = _UNWRITABLE.sub(_escaped, text)
    if not out.replace("\n", "").replace("\t", "").isprintable():  # unassigned code points and the like
        out = "".join(c if c.isprintable() or c in "\n\t" else _escaped_char(c) for c in out)
    return out if len(out) <= limit else out[: limit - 1] + "\u2026"


def _escaped_char(c: str) -> str:
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


_SCALARS = (float, bool, type(None))


def writable(value: Any, depth: int = 0) -> Any:
    """``value`` (a status's JSON data) with its text, keys and numbers as a status file can hold them."""
    t = type(value)
    if t is str:  # the common case first: plain short text is returned as it is
        return value if len(value) <= TEXT_LIMIT and value.isascii() and value.isprintable() else writable_text(value)
    if t in _SCALARS:
        return value
    if t is int:
        # Python refuses to print an int of more than 4,300 digits (sys.set_int_max_str_digits):
        # past ~3,900 (13,000 bits), the value as the ledger shows one beyond a float's range.
        return value if value.bit_length() <= 13_000 else (">1e308" if value > 0 else "<-1e308")
    if depth >= NEST_LIMIT:
        return "\u2026"
    if t is dict:
        return {(k if type(k) is str and len(k) <= KEY_LIMIT and k.isascii() and k.isprintable()
                 else writable_text(str(k), KEY_LIMIT)): writable(v, depth + 1) for k, v in value.items()}
    if t is list or t is tuple:
        if t is list and len(value) == 2 and type(value[0]) is int and type(value[1]) is float \
                and value[0].bit_length() <= 64:
            return value  # a loss curve's point, 120 of them a status: no call per number
        return [writable(v, depth + 1) for v in value]
    return writable_text(repr(value)[:TEXT_LIMIT])


def _plain(value: Any, depth: int = 0) -> Any:
    """A model as plain data, without pydantic's serializer (and its depth limit)."""
    if depth > NEST_LIMIT:
        return "\u2026"
    if isinstance(value, BaseModel):
        return {k: _plain(v, depth + 1) for k in type(value).model_fields
                if (v := getattr(value, k)) is not None}
    if isinstance(value, dict):
        return {k: _plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None  # as pydantic's JSON mode writes them
    return value


def ordered(status: RunStatus) -> dict[str, Any]:
    """The file's data: fixed key order, no empty fields, the loss curve's points as flow lists."""
    try:
        data = status.model_dump(mode="json", exclude_none=True)
    except ValueError:  # nesting deeper than pydantic serializes (a pushed status, say): cut by ``writable``
        data = _plain(status)
    data = writable(data)
    out: dict[str, Any] = {"apiVersion": "reconciler/v1", "kind": "RunStatus"}
    for key in _ORDER[2:]:
        if key in data and data[key] not in ([], {}, ""):
            out[key] = data[key]
    if "loss_curve" in out:
        out["loss_curve"] = [Flow(p) for p in out["loss_curve"]]
    return out


def dump(status: RunStatus) -> str:
    """The file text. Written by ``yamlemit`` (PyYAML's text, without PyYAML's cost per node, which
    matters when a first pass writes thousands of files), or by PyYAML for what that leaves to it."""
    data = ordered(status)
    text = emit_yaml(data)
    return ("# Written by the reconciler. Do not edit: it is rewritten on every change.\n"
            + (text if text is not None else pyyaml_dump(data)))


class StatusCache:
    """Parsed status files by (inode, size, mtime): a long-lived process re-reads only files that changed.

    Status files are replaced atomically (a new inode) by ``write_if_changed`` and rewritten by git
    on checkout, so the key changes whenever the content can have. The cached objects are shared:
    callers must not mutate them (``summarize`` works on a deep copy).
    """

    def __init__(self) -> None:
        self._items: dict[str, tuple[tuple[int, int, int], RunStatus | None]] = {}

    def forget(self, name: str) -> None:
        self._items.pop(f"{name}.yaml", None)

    def remember(self, status_dir: Path, st: RunStatus) -> None:
        """The status this process just wrote: the next pass need not parse the file again."""
        key = file_key(status_dir / f"{st.name}.yaml")
        if key is not None:
            self._items[f"{st.name}.yaml"] = (key, st)


def _parse_status(path: Path, y: YAML) -> RunStatus | None:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, ValueError):
        return None
    return parse_text(text, path.stem, y)


def parse_text(text: str, name: str, y: YAML | None = None) -> RunStatus | None:
    """A status file's text → its status, or None when it is not the status of run ``name``."""
    try:
        try:  # libyaml when available: a cold start over 10,000 status files in seconds, not minutes
            from reconciler.core.yamlsafe import fast_load

            data = fast_load(text)
        except Exception:  # noqa: BLE001 - anything unusual: the pure-Python reader decides
            data = (y or _yaml()).load(text)
        if isinstance(data, dict):
            st = RunStatus.model_validate(data)
            if st.name == name:
                return st
    except Exception:  # noqa: BLE001 - lenient on read: YAML and validation errors alike
        pass
    return None


def file_key(path: Path) -> tuple[int, int, int] | None:
    """What changes whenever a status file's content can have: inode, size, mtime."""
    try:
        s = path.stat()
    except OSError:
        return None
    return (s.st_ino, s.st_size, s.st_mtime_ns)


def load_all(status_dir: Path, cache: StatusCache | None = None,
             skip: dict[str, tuple[int, int, int]] | None = None,
             skipped: set[str] | None = None) -> dict[str, RunStatus]:
    """Every readable status file; a file that cannot be read counts as absent (and is rewritten).

    ``skip`` maps run names to the file key they had when the caller last saw them settled; such a
    file, if unchanged, is neither parsed nor returned nor kept in the cache.
    """
    out: dict[str, RunStatus] = {}
    if not status_dir.is_dir():
        return out
    y = _yaml()
    seen: dict[str, tuple[tuple[int, int, int], RunStatus | None]] = {}
    with os.scandir(status_dir) as entries:
        files = sorted((e.name, e) for e in entries if e.name.endswith(".yaml") and not e.name.startswith("."))
    for name, entry in files:
        if cache is None and not skip:
            st = _parse_status(Path(entry.path), y)
        else:
            try:
                s = entry.stat()
            except OSError:
                continue
            key = (s.st_ino, s.st_size, s.st_mtime_ns)
            if skip and skip.get(name[:-5]) == key:
                if skipped is not None:
                    skipped.add(name[:-5])
                continue
            hit = cache._items.get(name) if cache is not None else None
            if hit is not None and hit[0] == key:
                st = hit[1]
            else:
                if cache is not None:
                    cache._items.pop(name, None)  # let the stale copy go before parsing the new one
                st = _parse_status(Path(entry.path), y)
            seen[name] = (key, st)
        if st is not None:
            out[st.name] = st
    if cache is not None:
        cache._items = seen
    return out


_KEY_LINES = re.compile(r"^(phase|generation|attempt): (\S+)$", re.MULTILINE)


def head_key(text: str | None) -> tuple[str, int, int] | None:
    """(phase, generation, attempt) of a status file's text, from its top-level lines (``dump``
    writes them in a fixed order and form), without parsing the whole document."""
    if text is None:
        return None
    found = dict(_KEY_LINES.findall(text[:2048]))
    try:
        return found["phase"], int(found.get("generation", 0)), int(found.get("attempt", 0))
    except (KeyError, ValueError):  # not a status file as dump writes it: unknown, like an unreadable one
        return None


def load_one(status_dir: Path, name: str) -> RunStatus | None:
    if not _safe(name):
        return None
    return _parse_status(status_dir / f"{name}.yaml", _yaml())


# A run name as validation admits it (a DNS label): the only names a status path is built from.
SAFE_NAME = re.compile(DNS_LABEL)


def _safe(name: str) -> bool:
    return bool(SAFE_NAME.match(name)) and len(name) <= DNS_LABEL_MAX


class UnsafeName(ValueError):
    """A status file name that is not a DNS label: it could lead outside status/."""


def status_path(status_dir: Path, name: str) -> Path:
    """``status/<name>.yaml``, checked: only a DNS label (no '/', no '.') names it, so the path
    cannot leave ``status_dir``."""
    if not _safe(name):
        raise UnsafeName(f"{name!r} is not a valid run name; no status file is written for it")
    return status_dir / f"{name}.yaml"


def write_if_changed(status_dir: Path, status: RunStatus) -> bool:
    """Atomically write a status file; return whether its bytes changed."""
    path = status_path(status_dir, status.name)
    status_dir.mkdir(parents=True, exist_ok=True)
    return replace_if_changed(path, dump(status))


def replace_if_changed(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` unless it already holds exactly that; atomic (a temporary file
    renamed into place), so a reader never sees half a file. Returns whether it wrote."""
    data = text.encode("utf-8")
    try:
        with open(path, "rb") as fh:
            if fh.read() == data:
                return False
    except OSError:
        pass
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return True


# ---------------------------------------------------------------- conditions and transitions


def set_condition(st: RunStatus, type_: str, status: str, reason: str, message: str, now: float) -> None:
    """Set a condition; its last_transition moves only when its status flips."""
    cur = st.condition(type_)
    if cur is None:
        st.conditions.append(Condition(type=type_, status=status, reason=reason, message=message, last_transition=iso(now)))
        st.conditions.sort(key=lambda c: c.type)
        return
    if cur.status != status:
        cur.last_transition = iso(now)
    cur.status, cur.reason, cur.message = status, reason, message


def record(st: RunStatus, phase: str, reason: str, now: float) -> None:
    """Move to a phase; a history entry is added when phase, generation or attempt changes."""
    last = st.history[-1] if st.history else None
    if last is None or (last.phase, last.generation, last.attempt) != (phase, st.generation, st.attempt):
        st.history.append(Transition(time=iso(now), phase=phase, generation=st.generation, attempt=st.attempt,
                                     reason=reason[:200]))
        st.history = st.history[-HISTORY_LIMIT:]
    st.phase = phase


def same_ignoring_time(a: RunStatus | None, b: RunStatus) -> bool:
    if a is None:
        return False
    return a.model_dump(exclude={"observed_at"}) == b.model_dump(exclude={"observed_at"})


# ---------------------------------------------------------------- summarize


def records_new_spec(prev: RunStatus | None, change) -> bool:
    """Whether the status of ``change``'s run records another spec than ``prev`` did (a new spec
    digest or generation): then its spec commit is written anew."""
    return prev is None or prev.spec.digest != change.spec_digest or prev.generation != change.generation


def summarize(prev: RunStatus | None, change, outcome, obs, now: float, spec_commit: str | None) -> RunStatus:
    """The next status of one run, from its change, the change's outcome and what was observed.

    ``change`` is a plan.Change, ``outcome`` an apply.Outcome or None (nothing was done), ``obs`` the
    observed instance of the current identity or None. One reason per change: the change's.
    """
    if _steady(prev, change, outcome):
        return _refresh(prev, change, obs, now)
    st = prev.model_copy(deep=True) if prev is not None else RunStatus(name=change.name)
    new_spec = records_new_spec(st, change)
    st.generation, st.attempt = change.generation, change.attempt
    if change.spec_digest:
        if new_spec:
            st.spec.commit = spec_commit
        st.spec.digest, st.spec.path = change.spec_digest, change.spec_path

    failed = outcome is not None and not outcome.ok
    if failed:
        if outcome.permanent:
            st.exit_code = None
            record(st, "Failed", outcome.error, now)
            st.message = outcome.error
            set_condition(st, "Ready", "False",
                          "LaunchFailed" if change.action in (Action.LAUNCH, Action.RELAUNCH) else "Error",
                          outcome.error, now)
        else:
            phase = st.phase if change.action not in (Action.LAUNCH, Action.RELAUNCH) else "Pending"
            record(st, phase, f"{change.action} failed: {outcome.error}", now)
            st.message = f"{change.action} failed, will retry: {outcome.error}"
            set_condition(st, "Ready", "False", "RetryableError", outcome.error, now)
    elif change.phase is not None:
        if change.action in (Action.LAUNCH, Action.RELAUNCH, Action.ADOPT) and (outcome is None or outcome.ok):
            launched = outcome.launched if outcome is not None else None
            ws = (launched.workspace if launched else None) or change.workspace
            if change.action == Action.ADOPT or launched is not None:
                keep_time = st.handle is not None and st.handle.identity == change.identity and st.handle.launched_at
                st.handle = Handle(
                    backend=change.backend, machine=change.machine, identity=change.identity, workspace=ws,
                    pid=(launched.pid if launched else None) or (obs.pid if obs else None),
                    container=(launched.container if launched else None) or (obs.container if obs else None),
                    job=(launched.job if launched else None) or (obs.job if obs else None),
                    gpus=list(change.gpus), launched_at=st.handle.launched_at if keep_time else iso(now),
                    nodes=_nodes(change, obs),
                )
            st.exit_code = None
            st.retry_at = None
            if change.action in (Action.LAUNCH, Action.RELAUNCH) and launched is not None and not launched.adopted:
                st.progress = None  # the previous attempt's progress is not this one's
            if launched is not None and launched.adopted:
                reason = f"{change.reason} (found {change.identity} already running: adopted)"
            else:
                reason = change.reason
            record(st, change.phase, reason, now)
            st.message = reason
        elif change.action == Action.NONE:
            st.phase = change.phase
            if not st.history:
                record(st, change.phase, change.reason, now)
                st.message = change.reason
        else:
            record(st, change.phase, change.reason, now)
            st.message = change.reason
        if change.exit_code is not None or change.phase in ("Succeeded", "Failed"):
            st.exit_code = change.exit_code if change.exit_code is not None else st.exit_code
        st.retry_at = iso(now + change.retry_after) if change.code == "BackOff" and change.retry_after else None
        if obs is not None and change.identity == obs.identity and (
                st.handle is None or st.handle.identity != obs.identity):
            # The change is about an instance the status does not name yet (launched by a pass
            # whose status never reached git, then found ended): the handle must name it, or the
            # status would pin its end to another instance under this spec.
            st.handle = Handle(backend=change.backend, machine=obs.machine, identity=obs.identity,
                               workspace=obs.workspace, pid=obs.pid, container=obs.container, job=obs.job,
                               gpus=list(obs.gpus), nodes=_nodes(None, obs),
                               launched_at=iso(obs.started_at) if obs.started_at else None)
        if st.handle is not None and obs is not None and obs.pid and st.handle.identity == obs.identity:
            st.handle.pid = st.handle.pid or obs.pid
        if st.handle is not None and obs is not None and obs.job and st.handle.identity == obs.identity:
            st.handle.job = st.handle.job or obs.job
        _conditions(st, change, now)
    _rental_status(st, change, outcome, now)
    if change.code == "Preempted" and change.phase is not None and (outcome is None or outcome.ok) and (
            prev is None or prev.condition("Preempted") is None or prev.condition("Preempted").status != "True"):
        st.preemptions = (st.preemptions or 0) + 1
    if change.considered and change.phase is not None and (outcome is None or outcome.ok):
        # A plain string: the status file is YAML, and PyYAML's safe writer refuses the enum.
        st.placement = {"action": str(change.action), "code": change.code, "considered": list(change.considered[:20])}
    if outcome is not None and outcome.ok and outcome.manifest is not None:
        arts = outcome.manifest.get("artifacts", [])
        st.artifacts = [{"path": a["path"], "size": a["size"]} for a in arts[:30]]
        if len(arts) > 30:
            st.artifacts.append({"path": f"... {len(arts) - 30} more (see artifacts/manifest.json)", "size": 0})
        if outcome.manifest.get("provenance"):
            st.provenance = outcome.manifest["provenance"]
        # A collection that left entries out (links, FIFOs, over the limits) still counts; the
        # condition says what it left out, and goes back to True once one leaves nothing out.
        collection = outcome.manifest.get("collection")
        if collection and collection.get("note"):
            reason = "LimitReached" if collection.get("truncated") else "EntriesSkipped"
            set_condition(st, "ArtifactsComplete", "False", reason, str(collection["note"])[:1000], now)
        elif st.condition("ArtifactsComplete") is not None:
            set_condition(st, "ArtifactsComplete", "True", "Complete", "", now)
    if obs is not None and obs.progress:
        st.progress = obs.progress
        st.loss_curve = extend_curve(st.loss_curve, obs.progress)
    return st


RENTAL_WAITS = ("BudgetReached", "RentalLimit", "CostLimit", "ProviderUnavailable", "NoOffer", "NoProvider")


def _rental_status(st: RunStatus, change, outcome, now: float) -> None:
    """A rental's steps as conditions (Provisioned, SshReady, GpuVerified), its record in the
    handle, and what the run's machines cost. Cost is counted from the launch on a rental until
    the run leaves it (ends, or moves to another machine): ``since`` marks an open stretch, and
    ``so_far`` holds the closed ones, so a running run's status stays byte-identical."""
    rental = (outcome.rental if outcome is not None and outcome.rental else None) or change.rental
    ok = outcome is None or outcome.ok
    if change.action == Action.PROVISION and rental:
        if ok:
            st.handle = Handle(identity=change.identity, rental={k: rental.get(k) for k in
                                                                 ("provider", "id", "name", "offer", "price_per_hour")})
            set_condition(st, "Provisioned", "False", "Provisioning", f"asked {rental['provider']} for "
                          f"{rental['offer']} ({rental['name']})", now)
        else:
            set_condition(st, "Provisioned", "False", "ProvisionFailed", outcome.error, now)
    elif change.action == Action.WAIT and change.code == "Provisioning" and rental:
        if st.handle is None or st.handle.rental is None or st.handle.rental.get("id") != rental.get("id"):
            st.handle = Handle(identity=change.identity, rental={k: rental.get(k) for k in
                                                                 ("provider", "id", "name", "offer", "price_per_hour")})
        set_condition(st, "Provisioned", "False", "Provisioning", change.reason, now)
    elif change.action == Action.WAIT and change.code in RENTAL_WAITS:
        set_condition(st, "Provisioned", "False", change.code, change.reason, now)
    elif change.action in (Action.LAUNCH, Action.RELAUNCH) and rental:
        set_condition(st, "Provisioned", "True", "Running", f"{change.machine} ({rental.get('offer')})", now)
        step = outcome.rental_step if outcome is not None else None
        if ok or step == "gpus":
            set_condition(st, "SshReady", "True", "Connected", f"host key {_key_note(rental.get('host_key'))}", now)
        elif step == "ssh":
            set_condition(st, "SshReady", "False", "NotAnswering", outcome.error, now)
        if step == "gpus":
            set_condition(st, "GpuVerified", "False", "GpuMismatch", outcome.error, now)
        elif ok and outcome is not None:
            seen = outcome.gpus_seen
            set_condition(st, "GpuVerified", "True", "Verified" if seen else "NoGpu", seen or "the offer has no GPU", now)
        if ok and st.handle is not None and st.handle.machine == change.machine:
            st.handle.rental = {k: rental.get(k) for k in ("provider", "id", "name", "offer", "price_per_hour",
                                                           "host_key", "host", "port", "user", "identity_file",
                                                           "workspace_root") if rental.get(k) is not None}
            _close_cost(st, now)
            st.cost = dict(st.cost or {}, provider=rental.get("provider"), machine=change.machine,
                           price_per_hour=rental.get("price_per_hour"), since=iso(now))
            st.cost.setdefault("so_far", 0.0)
    if st.cost and st.cost.get("since") and (
            st.phase in TERMINAL or st.phase == "Pending"
            or (st.handle is not None and st.handle.machine != st.cost.get("machine"))):
        _close_cost(st, now)


def _close_cost(st: RunStatus, now: float) -> None:
    cost = st.cost or {}
    if parse_iso(cost.get("since")) is None:
        return
    total = cost_so_far(st, now)
    st.cost = {k: v for k, v in cost.items() if k not in ("since", "machine")}
    st.cost["so_far"] = round(total, 4)


def _nodes(change, obs) -> list[dict] | None:
    """The nodes of a run on several machines, for its handle: as launched, else as observed."""
    if change is not None and change.nodes:
        return [{"rank": k, "machine": n.machine, "identity": n.identity, "workspace": n.workspace}
                for k, n in enumerate(change.nodes)]
    if obs is not None and obs.nodes:
        from reconciler.core.identity import node_of

        return [{"rank": node_of(r.identity), "machine": r.machine, "identity": r.identity, "workspace": r.workspace}
                for r in obs.nodes]
    return None


def _key_note(key: str | None) -> str:
    return f"{key.split()[0]} …{key.split()[1][-12:]}" if key and len(key.split()) > 1 else "pinned"


def _steady(prev: RunStatus | None, change, outcome) -> bool:
    """Nothing happened to this run: same phase, generation, attempt and spec, no action taken."""
    if not (prev is not None and change.action == Action.NONE and outcome is None and prev.phase == change.phase
            and prev.generation == change.generation and prev.attempt == change.attempt
            and (change.spec_digest is None or prev.spec.digest == change.spec_digest) and bool(prev.history)):
        return False
    # A condition left over from a passing trouble (a machine that answers again) needs the full path.
    reach = prev.condition("MachineReachable")
    return reach is None or reach.status == "True"


def _refresh(prev: RunStatus, change, obs, now: float) -> RunStatus:
    """A steady run's status: only progress and the Stalled condition can move. Returns ``prev``
    itself when nothing did, so the common case costs no copy and no comparison."""
    progress = obs.progress if obs is not None and obs.progress else None
    stalled = change.stalled
    cur = prev.condition("Stalled")
    stall_moves = (stalled and (cur is None or cur.status != "True" or cur.message != stalled)) or (
        not stalled and cur is not None and cur.status == "True" and change.phase == "Running")
    pid_moves = prev.handle is not None and obs is not None and obs.pid and not prev.handle.pid
    if (progress is None or progress == prev.progress) and not stall_moves and not pid_moves:
        return prev
    st = prev.model_copy(deep=True)
    if progress is not None:
        st.progress = progress
        st.loss_curve = extend_curve(st.loss_curve, progress)
    if stalled:
        set_condition(st, "Stalled", "True", "NoProgress", stalled, now)
    elif stall_moves:
        set_condition(st, "Stalled", "False", "Progressing", "", now)
    if pid_moves:
        st.handle.pid = obs.pid
    return st


def _conditions(st: RunStatus, change, now: float) -> None:
    code = change.code
    if change.phase == "Invalid":
        set_condition(st, "SpecValid", "False", "ValidationFailed", change.reason, now)
        return
    set_condition(st, "SpecValid", "True", "Valid", "", now)
    if code == "MachineUnreachable":
        set_condition(st, "MachineReachable", "False", "Unreachable", change.reason, now)
    elif st.handle is not None and change.action != Action.WAIT:
        set_condition(st, "MachineReachable", "True", "Reachable", "", now)
    if code == "SecretMissing":
        set_condition(st, "SecretsAvailable", "False", "SecretMissing", change.reason, now)
    elif (st.condition("SecretsAvailable") is not None
          and change.action in (Action.LAUNCH, Action.RELAUNCH, Action.ADOPT)):
        set_condition(st, "SecretsAvailable", "True", "SecretsSet", "", now)
    if code == "Preempted":
        set_condition(st, "Preempted", "True", "Preempted", change.reason, now)
    elif st.condition("Preempted") is not None and change.action in (Action.LAUNCH, Action.RELAUNCH, Action.ADOPT):
        set_condition(st, "Preempted", "False", "Placed", "", now)
    if code == "NoCapacity" or code == "NoMachine":
        set_condition(st, "Scheduled", "False", code, change.reason, now)
    elif change.machine:
        set_condition(st, "Scheduled", "True", "Placed", f"on {change.machine}", now)
    phase = change.phase
    if phase == "Running":
        set_condition(st, "Ready", "True", "Running", "", now)
    elif phase == "Succeeded":
        set_condition(st, "Ready", "False", "Succeeded", "", now)
    elif phase in ("Failed", "Terminated", "Pending"):
        set_condition(st, "Ready", "False", code, change.reason, now)
    # spec.stall: the planner says whether a running instance made no progress; the condition lives here.
    stalled = change.stalled
    if stalled:
        set_condition(st, "Stalled", "True", "NoProgress", stalled, now)
    elif phase == "Running" and st.condition("Stalled") is not None and change.identity == (
            st.handle.identity if st.handle else None):
        set_condition(st, "Stalled", "False", "Progressing", "", now)

"""The trust boundary: everything a machine says is parsed here, bounded and validated, before the
control plane looks at it.

Machines are the untrusted half of the system. A rented machine, or the training job on it, can be
hostile or merely broken, and what its probe prints (or what the files a job controls say) must
never be able to crash a pass, exhaust the reconciler's memory, reach a path or a shell, or speak
for another machine's runs. So the bytes of a probe's answer go through this module only:

- ``loads``: the reply is decoded with hard limits (its size, its number of objects, arrays and
  strings, which bound what it decodes to; nesting too deep for the decoder is caught like any
  other undecodable reply);
  anything over them, or not JSON, is a ``BadReply`` and the machine's observation is bad for this
  pass (it reads as unreachable, with the reason), never an exception through the pass.
- ``parse_probe``: the decoded value is checked shape by shape with pydantic models that are
  lenient on unknown keys (a newer probe may say more) and strict on types and ranges. Machine
  fields (root, drain, foreign GPUs, error) that do not validate are dropped with a note; a
  ``runs`` that is not a mapping makes the whole reply bad.
- Each run entry is judged on its own. Its identity must be a run identity (``identity.py``),
  else the entry is dropped with a reason (it can be nobody's run). Fields the planner decides on
  (state, exit code, times, pid, container, workspace, GPUs, spec digest, gang layout) must all
  validate, else the entry becomes ``state: unknown`` with a message that says why: an invalid
  report is neither a death nor a failure, so it can never burn a retry, fence or relaunch
  anything; the planner waits (ObserveFailed), as it does for a docker that does not answer.
  Dropping it instead would read as "the workspace is gone" and declare the run lost.
  Descriptive fields (message, progress, checkpoints, heartbeat age, queue reason) are cleaned:
  control characters stripped, lengths bounded, NaN and infinities turned into None, checkpoint
  names that are not plain relative paths left out.

Pure: no network, no process, no git (the planner's layer may import it).
"""

from __future__ import annotations

import json
import math
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .identity import split
from .observed import ObservedRun
from .parse_reuse import ParseMemo
from .slurm_end import SlurmEnd
from .uploads import from_probe

# A probe reply for 1,000 runs, each with progress and 20 checkpoints, is 1.3 MB holding 54,000
# strings and 6,000 objects and arrays. The limits leave ten times that room or more, and keep
# what one machine's reply decodes to within ~8x its size plus ~60 bytes per string or container
# (a two-letter string or an empty array decodes to that much however small its text).
MAX_REPLY_BYTES = 16 << 20
MAX_CONTAINERS = 200_000
MAX_STRINGS = 500_000
MAX_RUNS = 20_000
MAX_MESSAGE = 500
MAX_PATH = 1024
MAX_GPUS = 64
MAX_GPU_INDEX = 1023
MAX_CHECKPOINTS = 200
MAX_GANG = 1024
MAX_STEP = 10**15
MAX_ABS_NUMBER = 1e30
MAX_TIME = 1e11  # unix seconds, year ~5000: beyond is garbage
INT32 = 2**31 - 1

RUN_STATES = ("running", "succeeded", "failed", "terminated", "lost", "staged", "unknown")
_COMPONENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+=-]{0,127}$")
_DIGEST = re.compile(r"^([a-z0-9]{1,16}:)?[0-9a-f]{8,128}$")
_CONTAINER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_MACHINE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@-]{0,252}$")
_ISO = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:?\d{2})?$")


class BadReply(ValueError):
    """A machine's reply that cannot be read at all (too large, not JSON, not an object)."""


# ---------------------------------------------------------------- scalars


def clean_text(value: Any, limit: int = MAX_MESSAGE) -> str:
    """Text from a machine as it may be shown: control, non-printable and bidirectional-override
    characters replaced by a space, at most ``limit`` characters. Anything but a string is no text
    at all (rendering a hostile structure could itself be the attack). Not printable, to Python:
    every control, format (bidirectional overrides, zero-width), separator other than the space
    (U+2028, U+2029), private, unassigned and lone surrogate code point."""
    if not isinstance(value, str):
        return ""
    value = value[: limit * 4]
    if not value.isprintable():
        value = "".join(c if c.isprintable() else " " for c in value)
    return value.strip()[:limit]


def finite(value: Any, bound: float = MAX_ABS_NUMBER) -> float | None:
    """A finite number within ±bound, else None (never NaN or an infinity; bools are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        f = float(value)
    except (OverflowError, ValueError):  # an int too large for a float
        return None
    return f if math.isfinite(f) and abs(f) <= bound else None


def bounded_int(value: Any, lo: int, hi: int) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if lo <= value <= hi else None


def absolute_path(value: Any) -> str | None:
    """A plain absolute path (``/srv/runs``): printable, at most MAX_PATH characters, without
    ``.``, ``..`` or doubled slashes (normalised as it stands); else None."""
    if (isinstance(value, str) and value.startswith("/") and len(value) <= MAX_PATH and value.isprintable()
            and posixpath.normpath(value) == value):
        return value
    return None


def relative_name(value: Any) -> str | None:
    """A workspace-relative path made of plain components (``artifacts/output/v0-x/checkpoint-50``):
    no ``..``, no ``.``, not absolute, no backslash or control character; else None."""
    if not isinstance(value, str) or not value or len(value) > MAX_PATH:
        return None
    parts = value.split("/")
    if len(parts) > 8 or not all(_COMPONENT.fullmatch(p) for p in parts):
        return None
    return value


# ---------------------------------------------------------------- decoding


def loads(data: bytes | str, limit: int = MAX_REPLY_BYTES) -> Any:
    """Decode a machine's JSON reply within limits; ``BadReply`` says why it cannot be."""
    if len(data) > limit:
        raise BadReply(f"the reply is {len(data)} bytes, over the limit of {limit}")
    raw = data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass")
    # Counted on the bytes (brackets inside strings count too: that only errs on the safe side).
    containers = raw.count(b"{") + raw.count(b"[")
    if containers > MAX_CONTAINERS:
        raise BadReply(f"the reply holds {containers} objects or arrays, over the limit of {MAX_CONTAINERS}")
    strings = raw.count(b'"') // 2
    if strings > MAX_STRINGS:
        raise BadReply(f"the reply holds {strings} strings, over the limit of {MAX_STRINGS}")
    try:
        return json.loads(raw.decode("utf-8", "replace"))
    except (ValueError, RecursionError) as e:  # ValueError: also a number over the int-digits limit
        raise BadReply(f"the reply is not JSON: {clean_text(str(e), 200)}") from None




# ---------------------------------------------------------------- models


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=False)


class Gang(_Lenient):
    rank: int = Field(ge=0, lt=MAX_GANG)
    of: int = Field(ge=1, le=MAX_GANG)
    machines: list[str] = Field(default_factory=list, max_length=MAX_GANG)

    @field_validator("machines")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        for name in v:
            if not _MACHINE.fullmatch(name):
                raise ValueError("a machine name in the gang layout is not a machine name")
        return v


class RunCore(_Lenient):
    """The fields the planner decides on: all valid, or the entry is ``unknown``."""

    state: Literal["running", "succeeded", "failed", "terminated", "lost", "staged", "unknown"]
    exit_code: int | None = Field(None, ge=-INT32 - 1, le=INT32)
    finished_at: float | None = Field(None, ge=0, le=MAX_TIME, allow_inf_nan=False)
    started_at: float | None = Field(None, ge=0, le=MAX_TIME, allow_inf_nan=False)
    pid: int | None = Field(None, ge=1, le=INT32)
    container: str | None = Field(None, pattern=_CONTAINER.pattern)
    workspace: str | None = Field(None, min_length=1, max_length=MAX_PATH)
    gpus: list[int] = Field(default_factory=list, max_length=MAX_GPUS)
    collected: bool = False
    permanent: bool = False
    scope: Any = None  # "machine": a permanent end that is the machine's (planner/ruled_out.py); else ignored
    spec_digest: str | None = Field(None, pattern=_DIGEST.pattern)
    slurm_job: str | None = Field(None, pattern=r"^[0-9A-Za-z_.+-]{1,64}$")
    slurm_end: SlurmEnd | None = None
    gang: Gang | None = None

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: list[int]) -> list[int]:
        if any(not 0 <= g <= MAX_GPU_INDEX for g in v):
            raise ValueError(f"a GPU index is out of 0..{MAX_GPU_INDEX}")
        return v

    @field_validator("workspace")
    @classmethod
    def _workspace(cls, v: str | None) -> str | None:
        if v is not None and (not v.startswith("/") or not v.isprintable()
                              or "/../" in v + "/" or "/./" in v + "/"):
            raise ValueError("not a plain absolute path")
        return v


# A validated run entry is an ObservedRun whose machine is filled in once the report is bound to
# the machine that made it (engine/observe.py).
RunReport = ObservedRun


@dataclass
class ProbeReply:
    """A machine's validated answer: its own fields, its runs, and what was refused and why."""

    root: str | None = None
    error: str = ""
    draining: str | None = None
    foreign_gpus: list[int] = field(default_factory=list)
    gpu_error: str | None = None  # why the GPUs' processes are not known (foreign_gpus: avoid then fails closed)
    runs: dict[str, RunReport] = field(default_factory=dict)
    rejected: list[str] = field(default_factory=list)  # "<what>: <why>", one per refused item
    # Its runs are those of the same machine's reply to the observation before (heartbeat ages and
    # live counts aside), and were taken whole from their parse then (parse_reuse.py's same_runs).
    same_runs: bool = False


PROGRESS_INTS = ("step", "max_steps")
PROGRESS_FLOATS = ("loss", "learning_rate", "epoch")


def clean_progress(value: Any) -> dict[str, Any] | None:
    """The progress keys the control plane knows, each a bounded finite number (or None), and
    ``updated_at`` an ISO time; anything else is left out. None when nothing usable is left."""
    if not isinstance(value, dict):
        return None
    out: dict[str, Any] = {}
    for k in PROGRESS_INTS:
        v = value.get(k)
        out[k] = bounded_int(v, 0, MAX_STEP)
    for k in PROGRESS_FLOATS:
        out[k] = finite(value.get(k))
    at = value.get("updated_at")
    out["updated_at"] = at if isinstance(at, str) and len(at) <= 40 and _ISO.fullmatch(at) else None
    if all(v is None for v in out.values()):
        return None
    return out


MAX_CURVE = 64  # points of the loss curve one report may carry (the probe sends at most 32)


def clean_curve(value: Any) -> list[tuple[int, float]]:
    """[(step, loss), ...]: at most MAX_CURVE pairs of a bounded step and a finite loss, steps
    rising; anything else in the list is dropped, a list that is not one is empty."""
    out: list[tuple[int, float]] = []
    for item in value[:MAX_CURVE] if isinstance(value, list) else ():
        if not isinstance(item, list) or len(item) != 2:
            continue
        step, loss = bounded_int(item[0], 0, MAX_STEP), finite(item[1])
        if step is not None and loss is not None and (not out or step > out[-1][0]):
            out.append((step, loss))
    return out


def _why(e: ValidationError) -> str:
    first = e.errors(include_url=False)[0]
    where = ".".join(str(p) for p in first["loc"]) or "entry"
    return clean_text(f"{where}: {first['msg']}", 200)


def parse_run(identity: str, raw: Any) -> RunReport:
    """One run entry → a RunReport; an invalid entry → state ``unknown`` with the reason."""
    return _parse_entry(identity, raw)[0]


def _heartbeat(value: Any) -> float | None:
    return finite(value, MAX_TIME)


def _live(value: Any) -> int:
    # live: the processes of the identity still alive, in any session (a bounded count).
    return bounded_int(value, 0, 1 << 20) or 0


def _refresh(report: RunReport, raw: dict) -> None:
    """A valid entry's fields that move between passes, read afresh into a reused parse of it
    (parse_reuse.py): the same checks as ``_parse_entry``'s."""
    report.heartbeat_age = _heartbeat(raw.get("heartbeat_age"))
    report.live = _live(raw.get("live"))


def _parse_entry(identity: str, raw: Any) -> tuple[RunReport, bool]:
    """``parse_run``, and whether the report holds the entry's volatile fields, its heartbeat and
    live count (only a valid one does; parse_reuse.py reads them afresh into a reused parse)."""
    if not isinstance(raw, dict):
        return RunReport(identity, "", "unknown", message=f"the machine's report of {identity} is not an object"), False
    try:
        core = RunCore.model_validate(raw)
    except ValidationError as e:
        # Its workspace is kept when it is itself valid: it still says which machine's root holds it.
        try:
            ws = RunCore.model_validate({"state": "unknown", "workspace": raw.get("workspace")}).workspace
        except ValidationError:
            ws = None
        return RunReport(identity, "", "unknown", workspace=ws,
                         message=f"the machine's report of {identity} is invalid ({_why(e)})"), False
    gang = core.gang
    if gang is not None:
        node = split(identity)[1]
        if node is None or node != gang.rank or gang.rank >= gang.of or len(gang.machines) not in (0, gang.of):
            return RunReport(identity, "", "unknown",
                             message=f"the machine's report of {identity} has an inconsistent gang layout"), False
    checkpoints: list[str] = []
    listed = raw.get("checkpoints")
    for c in listed if isinstance(listed, list) else ():
        name = relative_name(c)
        if name is not None:
            checkpoints.append(name)
        if len(checkpoints) >= MAX_CHECKPOINTS:
            break
    heartbeat = _heartbeat(raw.get("heartbeat_age"))
    queued = raw.get("queued")
    uploads, uploads_error = from_probe(raw)  # runtime/uploads.json: its own boundary (core/uploads.py)
    return RunReport(
        identity=identity, machine="", state=core.state, exit_code=core.exit_code, finished_at=core.finished_at,
        started_at=core.started_at, pid=core.pid, container=core.container, workspace=core.workspace,
        gpus=list(core.gpus), collected=core.collected, message=clean_text(raw.get("message") or ""),
        progress=clean_progress(raw.get("progress")), curve=clean_curve(raw.get("curve")),
        permanent=core.permanent, scope="machine" if core.permanent and core.scope == "machine" else None, spec_digest=core.spec_digest,
        checkpoints=checkpoints, queued=clean_text(queued, 200) if queued is not None else None,
        job=core.slurm_job, heartbeat_age=heartbeat, slurm_end=core.slurm_end.record() if core.slurm_end else None,
        gang=gang.model_dump() if gang is not None else None,
        live=_live(raw.get("live")), uploads=uploads, uploads_error=uploads_error), True


def parse_probe(report: Any, memo: ParseMemo | None = None, source: str = "") -> ProbeReply:
    """A decoded probe reply → ProbeReply. ``BadReply`` only when the reply as a whole is unusable
    (not an object, or its runs not a mapping); every smaller fault is dropped or made unknown.
    ``memo``: earlier parses, reused for runs identical to them (parse_reuse.py); ``source``: the
    machine that sent the reply (its whole runs are compared with its last reply's)."""
    if not isinstance(report, dict):
        raise BadReply(f"the reply is a JSON {type(report).__name__}, not an object")
    runs = report.get("runs", {})
    if not isinstance(runs, dict):
        raise BadReply(f"'runs' is a JSON {type(runs).__name__}, not an object")
    if len(runs) > MAX_RUNS:
        raise BadReply(f"the reply lists {len(runs)} runs, over the limit of {MAX_RUNS}")
    out = ProbeReply()
    root = report.get("root")
    out.root = absolute_path(root)
    if out.root is None and root is not None:
        out.rejected.append("root: not a plain absolute path")
    if report.get("error"):
        out.error = clean_text(report["error"])
    drain = report.get("drain")
    if isinstance(drain, dict):
        out.draining = clean_text(drain.get("reason") or "", 200) or "drained from the machine"
    elif drain is not None:
        out.rejected.append("drain: not an object")
    out.foreign_gpus, out.gpu_error = foreign_gpus(report.get("foreign_gpus"))
    key, kept = memo.same_runs(source, runs, _refresh) if memo is not None and source else (None, None)
    if kept is not None:  # the same runs as this machine's last reply, the volatile fields aside
        out.runs, refused = kept
        out.rejected.extend(refused)
        out.same_runs = True
        return out
    before = len(out.rejected)
    templates: dict[str, tuple[RunReport, bool]] = {}
    _parse_runs(runs, out, memo, templates)
    if key is not None:
        memo.keep_runs(source, key, out.runs, out.rejected[before:], templates)
    return out


def _parse_runs(runs: dict, out: ProbeReply, memo: ParseMemo | None, templates: dict) -> None:
    """Each run entry of a reply into ``out``: parsed (or its identical earlier parse reused), or
    refused when its key is no run identity."""
    for ident, raw in runs.items():
        if not isinstance(ident, str) or len(ident) > 100 or split(ident)[0] is None:
            out.rejected.append(f"{clean_text(ident, 80)!r}: not a run identity")
            continue
        if memo is not None:
            out.runs[ident] = memo.parse(ident, raw, _parse_entry, _refresh, templates)
        else:
            out.runs[ident] = parse_run(ident, raw)


def foreign_gpus(value: Any) -> tuple[list[int], str | None]:
    """The probe's ``foreign_gpus`` → (GPUs used outside the reconciler, why they are unknown): all
    short of a clean list is a reason, never an empty list (``foreign_gpus: avoid`` fails closed)."""
    if not isinstance(value, dict):
        return [], "the GPUs' processes: " + ("not listed" if value is None else "not an object")
    if value.get("error"):
        return [], clean_text(value["error"], 300) or "the GPUs' processes could not be read"
    gpus = value.get("gpus")
    if not isinstance(gpus, list) or len(gpus) > MAX_GPUS or any(bounded_int(g, 0, MAX_GPU_INDEX) is None
                                                                 for g in gpus):
        return [], "the GPUs' processes: not a list of GPU indices"
    return sorted(set(gpus)), None


def parse_stop(answer: Any) -> dict[str, Any]:
    """A machine's answer to stopping or finishing a run, as the few values the control plane
    reads: whether it was alive, was killed, was removed, and its error (clean text), if any."""
    if not isinstance(answer, dict):
        return {"error": "the machine's answer is not an object"}
    out: dict[str, Any] = {k: answer.get(k) is True for k in ("was_alive", "killed", "removed")}
    if answer.get("error"):
        out["error"] = clean_text(answer["error"], 300) or "an error the machine could not say"
    return out


# ---------------------------------------------------------------- who may report what


def may_report(machine: str, report: RunReport, handle: Any, expected_workspace: str | None) -> str | None:
    """Whether ``machine`` may report on ``report.identity``: None when it may, else why not.

    A machine speaks only for what it hosts. When the run's status records a handle for this very
    attempt, that handle names the machine (or, for a run on several machines, each node's
    machine): a report from anywhere else is refused, so a machine cannot fail, fence or relaunch
    another machine's run. An attempt no status records yet (launched by a pass that died before
    writing it, or a leftover of an earlier attempt) may be reported by the machine whose own
    workspace root holds it: its workspace must be exactly ``<root>/<identity>`` there. A node's
    gang layout must put that node on the reporting machine, and agree with the recorded nodes.
    ``handle``: the run's recorded status handle (duck-typed: machine, identity, nodes), or None.
    """
    ident = report.identity
    gang = report.gang
    if gang is not None and gang["machines"] and gang["machines"][gang["rank"]] != machine:
        return f"{ident}: its gang layout puts node n{gang['rank']} on {gang['machines'][gang['rank']]}"
    recorded = getattr(handle, "identity", None) if handle is not None else None
    # The common case, a status naming this very identity, is decided without parsing either.
    if recorded and (recorded == ident or split(recorded)[0] == split(ident)[0]):
        nodes = [n for n in (getattr(handle, "nodes", None) or []) if isinstance(n, dict)]
        if nodes:
            # The recorded nodes, by rank (all of them after a launch; those seen, after an adoption).
            recorded_at = {(n["rank"] if isinstance(n.get("rank"), int) else k): n.get("machine")
                           for k, n in enumerate(nodes)}
            layout = gang["machines"] if gang is not None else []
            for k, where in recorded_at.items():
                if 0 <= k < len(layout) and layout[k] != where:
                    return f"{ident}: its gang layout puts node n{k} on {layout[k]}, recorded on {where}"
            mine = [n.get("machine") for n in nodes if n.get("identity") == ident]
            if mine:
                allowed = set(mine)
            elif layout:  # a node not recorded, placed here by a layout that agrees with the record
                allowed = {machine}
            else:
                allowed = set(recorded_at.values()) | {getattr(handle, "machine", None)}
        else:
            allowed = {getattr(handle, "machine", None)}
        allowed.discard(None)
        if allowed:
            if machine not in allowed:
                return f"{ident} is recorded on {', '.join(sorted(map(str, allowed)))}"
            return None
    if expected_workspace is None:
        return f"{ident}: no status records it, and the machine's workspace root is not known"
    if report.workspace != expected_workspace:
        return f"{ident}: its workspace {clean_text(report.workspace or '', 200)!r} is not {expected_workspace!r}"
    return None


__all__ = ["may_report", "parse_stop", "BadReply", "ProbeReply", "RunReport", "clean_progress", "clean_text", "finite", "loads",
           "parse_probe", "parse_run", "absolute_path", "relative_name", "MAX_REPLY_BYTES"]

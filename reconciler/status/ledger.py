"""The ledger: ``status/README.md`` and ``status/<run>.svg``, written with the status files.

The repository is the product's user interface, and GitHub renders a folder's README.md under its
file list: so the runs' table lives there, regenerated in the same commit as the status files it
summarises. One row per run (phase, progress, a text sparkline of its loss, machine, when its
phase last changed, message), grouped by phase, newest first. Nothing in it depends on the time
it is written (times are absolute, never "3 minutes ago"), so a pass that changes no status
leaves it byte-identical and makes no commit.

A run that reports training progress also gets ``status/<run>.svg``, its loss curve drawn from the
status's ``loss_curve`` (bounded to ``summarize.CURVE_POINTS`` points, so the file stays a few KB).
While the run trains it is rewritten at most every ``SVG_INTERVAL`` seconds, to keep commits few;
once the run has ended it is written one last time.

Rows are kept between passes, so a pass re-renders only the runs it wrote: the thousands of
settled runs a long-lived reconciler never re-reads keep their rows.

Every value in a row came from a machine, or from a status file anyone with push access can
edit: text goes through ``display.md`` (no link, image, mention or HTML renders from a message),
numbers through ``display.finite``/``display.number`` (NaN and the infinities are shown as
"nan"/"inf" and left out of the sparkline and the curve), so no value can make a pass raise here
and stop every status commit after it.
"""

from __future__ import annotations

import html
import os
import re
from dataclasses import dataclass
from pathlib import Path

from reconciler.core import display
from reconciler.core.runstatus import TERMINAL, RunStatus
from .store import replace_if_changed

README = "README.md"
_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
SVG_INTERVAL = 300.0
SPARK = "▁▂▃▄▅▆▇█"
SPARK_POINTS = 16
# Groups in the order a reader wants them: what needs attention first.
PHASE_ORDER = ("Running", "Starting", "Provisioning", "Pending", "Unknown", "Failed", "Invalid", "Succeeded",
               "Terminated")


@dataclass(frozen=True)
class Row:
    name: str
    phase: str
    since: str  # when the phase last changed (ISO), for ordering and display
    generation: int
    attempt: int
    progress: str
    spark: str
    loss: str
    machine: str
    message: str
    svg: bool
    price: str = ""  # per hour, for rented machines (status.cost)
    cost: str = ""  # so far
    outputs: str = ""  # the run's outputs URI in its Storage (status.outputs.uri)
    checkpoint: str = ""  # the newest checkpoint uploaded there


def row(st: RunStatus) -> Row:
    since = st.history[-1].time if st.history else (st.observed_at or "")
    p = st.progress if isinstance(st.progress, dict) else {}
    progress = progress_text(p)
    points = curve_points(st.loss_curve)
    loss = p.get("loss") if isinstance(p.get("loss"), (int, float)) else (st.loss_curve[-1][1] if st.loss_curve else None)
    outputs, newest = outputs_of(st)
    return Row(name=st.name, phase=st.phase, since=since, generation=st.generation, attempt=st.attempt,
               progress=progress, spark=sparkline([v for _, v in points]), loss=display.number(loss) if loss is not None else "",
               machine=(st.handle.machine if st.handle and st.handle.machine else ""),
               message=st.message or "", svg=len(points) >= 2,
               price=_money((st.cost or {}).get("price_per_hour"), "/h"), cost=_money((st.cost or {}).get("so_far")),
               outputs=outputs, checkpoint=newest)


def outputs_of(st: RunStatus) -> tuple[str, str]:
    """(outputs URI, newest checkpoint's name) of a run with a Storage, else empty strings: what the
    ledger and the live page link to (``reconcile artifacts NAME`` lists and fetches them)."""
    rec = st.outputs
    if not isinstance(rec, dict) or not isinstance(rec.get("uri"), str):
        return "", ""
    ckpts = rec.get("checkpoints")
    newest = ckpts[0].get("name") if isinstance(ckpts, list) and ckpts and isinstance(ckpts[0], dict) else None
    return rec["uri"], newest if isinstance(newest, str) else ""


def _money(value, unit: str = "") -> str:
    v = display.finite(value)
    return f"{v:.2f}{unit}" if v is not None else ""


def progress_text(p: dict) -> str:
    """"step/max_steps" (or "step"), whatever types the machine reported them as."""
    step, total = p.get("step"), p.get("max_steps")
    if step is None:
        return ""
    return f"{display.number(step)}/{display.number(total)}" if total else display.number(step)


def curve_points(curve) -> list[tuple[float, float]]:
    """The (step, loss) points a chart can place: pairs of finite numbers; the rest left out."""
    out = []
    for pt in curve or ():
        try:
            s, v = display.finite(pt[0]), display.finite(pt[1])
        except (TypeError, IndexError, KeyError):
            continue
        if s is not None and v is not None:
            out.append((s, v))
    return out


def curve_losses(curve) -> list[float]:
    return [v for _, v in curve_points(curve)]


def _frac(v: float, lo: float, hi: float) -> float:
    """Where ``v`` sits between ``lo`` and ``hi``, from 0 to 1, without overflowing: halving all
    three keeps ``hi - lo`` finite even when they are ±1e308."""
    span = hi / 2 - lo / 2
    return min(1.0, max(0.0, (v / 2 - lo / 2) / span)) if span > 0 else 0.5


def sparkline(values: list[float], width: int = SPARK_POINTS) -> str:
    values = [f for f in map(display.finite, values) if f is not None]  # NaN and the infinities: not drawn
    if len(values) < 2:
        return ""
    if len(values) > width:  # evenly spaced picks, the last value always among them
        values = [values[round(i * (len(values) - 1) / (width - 1))] for i in range(width)]
    lo, hi = min(values), max(values)
    if hi == lo:
        return SPARK[0] * len(values)
    return "".join(SPARK[min(len(SPARK) - 1, int(_frac(v, lo, hi) * (len(SPARK) - 1) + 0.5))] for v in values)


def _cell(text, limit: int = 100) -> str:
    return display.md(text, limit)


def render(rows: dict[str, Row]) -> str:
    counts: dict[str, int] = {}
    for r in rows.values():
        counts[r.phase] = counts.get(r.phase, 0) + 1
    order = {p: i for i, p in enumerate(PHASE_ORDER)}
    phases = sorted(counts, key=lambda p: (order.get(p, len(order)), p))
    out = ["# Runs", "",
           "Written by the reconciler with each status commit; do not edit. One file per run beside this one.", ""]
    if not rows:
        return "\n".join(out + ["No runs yet.", ""])
    out += [" · ".join(f"**{counts[p]}** {p}" for p in phases), ""]
    money = any(r.price or r.cost for r in rows.values())  # columns only where some run rents
    stored = any(r.outputs for r in rows.values())  # a column only where some run has a Storage
    for phase in phases:
        group = sorted((r for r in rows.values() if r.phase == phase), key=lambda r: (r.since, r.name), reverse=True)
        out += [f"## {phase} ({len(group)})", "",
                "| run | gen/att | progress | loss | machine | " + ("price | cost | " if money else "")
                + ("outputs | " if stored else "") + "since | message |",
                "|---|---|---|---|---|" + ("---|---|" if money else "") + ("---|" if stored else "") + "---|---|"]
        for r in group:
            # Status files are named by run (a DNS label); a name that is not one (a hand-made
            # file) is shown as text, not made into a link.
            name = f"[{r.name}]({r.name}.yaml)" if _LABEL.match(r.name) else _cell(r.name)
            loss = f"{r.spark} {r.loss}".strip()
            if r.svg and _LABEL.match(r.name):
                loss = f"[{loss}]({r.name}.svg)"
            priced = f"| {r.price} | {r.cost} " if money else ""
            if stored:
                priced += f"| {_cell(r.outputs, 300)}" + (f" (newest: {_cell(r.checkpoint)}) " if r.checkpoint else " ")
            out.append(f"| {name} | {r.generation}/{r.attempt} | {_cell(r.progress)} | {loss} | {_cell(r.machine)} "
                       f"{priced}| {_cell(r.since.replace('T', ' ').replace('Z', ''), 40)} | {_cell(r.message)} |")
        out.append("")
    return "\n".join(out)


def svg(name: str, curve: list, width: int = 480, height: int = 160) -> str:
    """The loss curve as a standalone SVG (no script, no external reference). Points that are not
    two finite numbers (a diverged run's NaN, an overflow's Infinity) are left out of the line."""
    pad = 36
    points = curve_points(curve)
    steps = [p[0] for p in points] or [0.0]
    losses = [p[1] for p in points] or [0.0]
    s0, s1 = min(steps), max(steps)
    l0, l1 = min(losses), max(losses)
    w, h = width - 2 * pad, height - 2 * pad
    pts = " ".join(f"{pad + _frac(s, s0, s1) * w:.1f},{height - pad - _frac(v, l0, l1) * h:.1f}" for s, v in points)
    name = display.clean(name, 80)
    title = html.escape(f"{name}: loss by step", quote=True)
    return "\n".join([
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{title}">',
        f"<title>{title}</title>",
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="#888"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="#888"/>',
        f'<polyline fill="none" stroke="#0969da" stroke-width="2" points="{pts}"/>',
        f'<text x="{pad}" y="{pad - 10}" font-family="sans-serif" font-size="12">{html.escape(name)}: loss</text>',
        f'<text x="4" y="{pad + 4}" font-family="sans-serif" font-size="10">{html.escape(display.number(l1))}</text>',
        f'<text x="4" y="{height - pad}" font-family="sans-serif" font-size="10">{html.escape(display.number(l0))}</text>',
        f'<text x="{pad}" y="{height - pad + 16}" font-family="sans-serif" font-size="10">step {html.escape(display.number(s0, 8))}</text>',
        f'<text x="{width - pad}" y="{height - pad + 16}" font-family="sans-serif" font-size="10" '
        f'text-anchor="end">step {html.escape(display.number(s1, 8))}</text>',
        "</svg>", ""])


def _key(path: Path) -> tuple | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class Ledger:
    """The rows of every run with a status file, kept across passes."""

    def __init__(self, svg_interval: float = SVG_INTERVAL):
        self.rows: dict[str, Row] = {}
        self.svg_interval = svg_interval
        self._key: tuple | None = None  # the README as last written (inode, size, mtime)
        # The status each row was made from. Loaded statuses are shared and never changed in
        # place (status/store.py's cache), so the same object next pass makes the same row: a
        # steady pass over thousands of runs rebuilds none. Only this pass's are kept, so a run
        # that settles (its status let go) is not held here.
        self._made_from: dict[str, RunStatus] = {}

    def refresh(self, status_dir: Path, loaded: dict[str, RunStatus], written: dict[str, RunStatus],
                now: float, present: frozenset[str] | None = None) -> list[str]:
        """Update rows (runs first seen in ``loaded``, and every run ``written`` this pass), drop
        runs whose status file is gone, and write the README and due SVGs. Returns what was written.
        ``present``: the names of the status files before this pass wrote, when the caller knows
        them (the status cache's watched listing); else the folder is listed."""
        changed = False
        # Loaded: the runs this pass read (the settled ones it did not are kept as they were);
        # a status file rewritten from outside (the daemon's reset to its remote) is read again.
        made_from = self._made_from
        for source in (loaded, written):
            for name, st in source.items():
                if made_from.get(name) is st and name in self.rows:
                    continue
                new = row(st)
                if self.rows.get(name) != new:
                    self.rows[name] = new
                    changed = True
        self._made_from = {**loaded, **written}
        if present is None:
            try:
                present = {e.name[:-5] for e in os.scandir(status_dir) if e.name.endswith(".yaml")}
            except FileNotFoundError:
                present = set()
        for name in [n for n in self.rows if n not in present and n not in written]:
            del self.rows[name]
            changed = True
        out = []
        # Rendered only when a row moved, or when the file is not the one last written (removed,
        # reset to the remote's, edited by hand): a pass over unchanged runs rebuilds nothing.
        readme = status_dir / README
        if (changed or _key(readme) != self._key) and (self.rows or readme.exists()):
            status_dir.mkdir(parents=True, exist_ok=True)
            if replace_if_changed(readme, render(self.rows)):
                out.append(README)
            self._key = _key(readme)
        for name, st in written.items():
            if len(curve_points(st.loss_curve)) < 2:
                continue
            path = status_dir / f"{name}.svg"
            try:  # the file's own time: the throttle holds across processes (--once from cron)
                due = st.phase in TERMINAL or now - path.stat().st_mtime >= self.svg_interval
            except FileNotFoundError:
                due = True
            if due and replace_if_changed(path, svg(name, st.loss_curve)):
                out.append(path.name)
        return out

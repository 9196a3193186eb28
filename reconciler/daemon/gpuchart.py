"""The live page's GPU charts: utilisation and memory of each GPU over time, from the NVML audit.

The GPU sampler beside each run (runtime/gpu_sampler.py) appends one JSON line per interval to the
run's ``artifacts/nvml-audit.jsonl``; nothing else records whether the GPUs were busy. The page
draws the tail of that file: two small SVG charts (utilisation %, memory used %), one line per
GPU, thinned to a bounded number of points so a week-long run draws as fast as a minute-long one.

The file was written on a machine and is read as untrusted input: each line is parsed on its own
(a broken line is skipped), only ``sample`` events with numbers in range are kept, at most
``MAX_GPUS`` devices, and the SVG holds only numbers and fixed strings.
"""

from __future__ import annotations

import html
import json
import math

MAX_GPUS = 16
MAX_POINTS = 240  # per GPU, after thinning
WIDTH, HEIGHT, PAD = 640, 140, 30
# Line colours by GPU index (SVG presentation attributes: the page's CSP allows no inline style).
COLOURS = ("#0969da", "#1a7f37", "#cf222e", "#9a6700", "#8250df", "#bf3989", "#1b7c83", "#57606a")


def _pct(value, total=None) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    if total is not None:
        if isinstance(total, bool) or not isinstance(total, (int, float)) or not math.isfinite(total) or total <= 0:
            return None
        value = 100.0 * value / total
    return value if 0 <= value <= 100 else None


def samples(text: str) -> tuple[dict[int, list[tuple[float, float | None, float | None]]], str | None]:
    """Per GPU index: (time, utilisation %, memory used %) of each sample, oldest first; and why
    there are none when the sampler said so (no NVML on the machine)."""
    out: dict[int, list[tuple[float, float | None, float | None]]] = {}
    why = None
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not isinstance(rec, dict):
            continue
        if rec.get("event") == "nvml_unavailable" and isinstance(rec.get("reason"), str):
            why = rec["reason"][:200]
        ts = rec.get("ts")
        if rec.get("event") != "sample" or isinstance(ts, bool) or not isinstance(ts, (int, float)) \
                or not math.isfinite(ts) or not isinstance(rec.get("devices"), list):
            continue
        for d in rec["devices"][:MAX_GPUS]:
            idx = d.get("index") if isinstance(d, dict) else None
            if isinstance(idx, bool) or not isinstance(idx, int) or not 0 <= idx < 1024:
                continue
            if len(out) >= MAX_GPUS and idx not in out:
                continue
            out.setdefault(idx, []).append((float(ts), _pct(d.get("util_gpu_pct")),
                                            _pct(d.get("mem_used_mib"), d.get("mem_total_mib"))))
    return {k: _thin(v) for k, v in sorted(out.items())}, why


def _thin(points: list) -> list:
    if len(points) <= MAX_POINTS:
        return points
    step = len(points) / MAX_POINTS
    return [points[int(i * step)] for i in range(MAX_POINTS - 1)] + [points[-1]]


def _chart(title: str, series: dict[int, list[tuple[float, float | None]]], t0: float, t1: float) -> str:
    span = max(t1 - t0, 1e-9)
    w, h = WIDTH - 2 * PAD, HEIGHT - 2 * PAD
    parts = [f"<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" role=img "
             f"aria-label=\"{title}\"><text x=\"{PAD}\" y=\"16\" font-size=\"12\">{title}</text>",
             f"<rect x=\"{PAD}\" y=\"{PAD}\" width=\"{w}\" height=\"{h}\" fill=\"none\" stroke=\"#d0d7de\"/>",
             f"<text x=\"2\" y=\"{PAD + 4}\" font-size=\"10\">100</text>",
             f"<text x=\"10\" y=\"{PAD + h}\" font-size=\"10\">0</text>"]
    for k, (idx, pts) in enumerate(series.items()):
        xy = [f"{PAD + w * (t - t0) / span:.1f},{PAD + h * (1 - v / 100):.1f}" for t, v in pts if v is not None]
        if xy:
            colour = COLOURS[idx % len(COLOURS)]
            parts.append(f"<polyline class=gpu{idx} fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" "
                         f"points=\"{' '.join(xy)}\"/>")
            parts.append(f"<text x=\"{PAD + 4 + 44 * k}\" y=\"{HEIGHT - 8}\" font-size=\"10\" "
                         f"fill=\"{colour}\">GPU {idx}</text>")
    parts.append(f"<text x=\"{WIDTH - PAD - 90}\" y=\"{HEIGHT - 8}\" font-size=\"10\">last {_span(span)}</text></svg>")
    return "".join(parts)


def _span(seconds: float) -> str:
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def charts(text: str) -> str:
    """The two charts as HTML, or a line that says why there are none."""
    per_gpu, why = samples(text)
    if not per_gpu:
        return f"<p>No GPU telemetry: {html.escape(why)}.</p>" if why else "<p>No GPU telemetry yet.</p>"
    times = [t for pts in per_gpu.values() for t, _, _ in pts]
    t0, t1 = min(times), max(times)
    util = {i: [(t, u) for t, u, _ in pts] for i, pts in per_gpu.items()}
    mem = {i: [(t, m) for t, _, m in pts] for i, pts in per_gpu.items()}
    return _chart("GPU utilisation %", util, t0, t1) + _chart("GPU memory used %", mem, t0, t1)

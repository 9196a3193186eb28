"""The GPU charts read a machine's NVML audit as untrusted input: only samples in range are drawn."""

from __future__ import annotations

import json

from reconciler.daemon import gpuchart


def _sample(ts, devices) -> str:
    return json.dumps({"ts": ts, "event": "sample", "devices": devices}) + "\n"


def test_bad_lines_and_values_are_skipped_and_the_rest_drawn():
    text = (_sample(1, [{"index": 0, "util_gpu_pct": 40, "mem_used_mib": 10, "mem_total_mib": 100}])
            + "{broken\n" + json.dumps([1, 2]) + "\n"
            + _sample(2, [{"index": 0, "util_gpu_pct": 1e308, "mem_used_mib": 10, "mem_total_mib": 0},
                          {"index": True, "util_gpu_pct": 5}, {"index": -1}, "gpu"])
            + '{"ts": 3, "event": "sample", "devices": [{"index": 0, "util_gpu_pct": NaN}]}\n'
            + _sample(4, [{"index": 0, "util_gpu_pct": 60, "mem_used_mib": 50, "mem_total_mib": 100}]))
    per_gpu, why = gpuchart.samples(text)
    assert why is None and list(per_gpu) == [0]
    assert per_gpu[0] == [(1.0, 40, 10.0), (2.0, None, None), (3.0, None, None), (4.0, 60, 50.0)]
    html = gpuchart.charts(text)
    assert html.count("<svg") == 2 and html.count("<polyline") == 2


def test_many_gpus_and_samples_stay_bounded():
    lines = "".join(_sample(t, [{"index": i, "util_gpu_pct": 50, "mem_used_mib": 1, "mem_total_mib": 2}
                                for i in range(40)]) for t in range(2000))
    per_gpu, _ = gpuchart.samples(lines)
    assert len(per_gpu) == gpuchart.MAX_GPUS and all(len(v) == gpuchart.MAX_POINTS for v in per_gpu.values())


def test_no_nvml_says_why_escaped():
    text = json.dumps({"ts": 1, "event": "nvml_unavailable", "reason": "NVML <b>Not Found</b>"}) + "\n"
    assert gpuchart.charts(text) == "<p>No GPU telemetry: NVML &lt;b&gt;Not Found&lt;/b&gt;.</p>"
    assert gpuchart.charts("") == "<p>No GPU telemetry yet.</p>"

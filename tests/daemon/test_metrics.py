"""/metrics of a real daemon over HTTP on 127.0.0.1: every series the daemon has always exported,
under its name and labels, present at zero before its first event; the reachability of each
machine the last pass observed; build_info and the process metrics prometheus-client adds; the
format read back by prometheus-client's own parser and by the strict reader of test_daemon.py, and
OpenMetrics when the scraper asks for it."""

from __future__ import annotations

import socket
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from reconciler import __version__
from reconciler.daemon.metrics import ACTIONS, KINDS
from reconciler.core.runstatus import PHASES

from .conftest import http, wait_for
from .test_daemon import parse_exposition
from .test_health import sample

# Every family and its label sets, as dashboards and alerts know them (docs/deploy.md).
ZERO_AT_START = {
    "reconciler_passes_total": [{"result": "error"}],
    "reconciler_pushes_total": [{"result": "ok"}, {"result": "error"}],
    "reconciler_fetches_total": [{"result": "error"}],
    "reconciler_webhooks_total": [{"result": r} for r in ("accepted", "refused", "ignored")],
    "reconciler_actions_total": [{"action": a} for a in ACTIONS],
    "reconciler_action_errors_total": [{"action": a} for a in ACTIONS],
    "reconciler_push_retries_total": [{}],
    "reconciler_rebase_resets_total": [{}],
    "reconciler_consecutive_failures": [{"kind": k} for k in KINDS],
    "reconciler_failures_total": [{"kind": k} for k in KINDS],
    "reconciler_last_failure_timestamp_seconds": [{"kind": k} for k in KINDS],
    "reconciler_runs": [{"phase": p} for p in PHASES],
}
TYPES = {
    "reconciler_passes_total": "counter", "reconciler_pass_duration_seconds": "histogram", "reconciler_runs": "gauge",
    "reconciler_actions_total": "counter", "reconciler_action_errors_total": "counter",
    "reconciler_push_retries_total": "counter", "reconciler_pushes_total": "counter",
    "reconciler_fetches_total": "counter", "reconciler_webhooks_total": "counter",
    "reconciler_rebase_resets_total": "counter", "reconciler_last_good_pass_timestamp_seconds": "gauge",
    "reconciler_consecutive_failures": "gauge", "reconciler_failures_total": "counter",
    "reconciler_last_success_timestamp_seconds": "gauge", "reconciler_last_failure_timestamp_seconds": "gauge",
    "reconciler_healthy": "gauge", "reconciler_machine_reachable": "gauge", "reconciler_build_info": "gauge",
}


def scrape(d, accept: str | None = None) -> tuple[str, str]:
    req = urllib.request.Request(d.url + "/metrics", headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read().decode(), r.headers["Content-Type"]


def closed_port() -> int:
    """A loopback port nothing listens on: connections are refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_every_series_is_there_at_zero_from_the_start(world):
    d = world.start(world.clone("daemon"))
    d.wait_ready()
    wait_for(lambda: sample(parse_exposition(scrape(d)[0]), "reconciler_passes_total", result="ok"), timeout=20,
             what="a first pass")
    text, ctype = scrape(d)
    assert ctype == "text/plain; version=0.0.4; charset=utf-8"
    fams = parse_exposition(text)  # the strict reader: every line a comment or a valid sample
    for name, kind in TYPES.items():
        assert fams.get(name, {}).get("type") == kind, (name, fams.get(name))
    for name, label_sets in ZERO_AT_START.items():
        for labels in label_sets:
            assert sample(fams, name, **labels) == 0, (name, labels)
    assert sample(fams, "reconciler_passes_total", result="ok") >= 1
    assert sample(fams, "reconciler_fetches_total", result="ok") >= 1
    assert sample(fams, "reconciler_healthy") == 1
    assert sample(fams, "reconciler_build_info", version=__version__) == 1
    assert sample(fams, "reconciler_machine_reachable", machine="local") == 1
    # What prometheus-client adds for free: the process and the interpreter.
    assert sample(fams, "process_resident_memory_bytes") > 0
    assert sample(fams, "process_start_time_seconds") > 0
    assert fams["python_info"]["samples"]
    assert not [n for n in fams if n.endswith("_created")]

    # prometheus-client's own parser reads the same text back.
    parsed = {f.name: f for f in text_string_to_metric_families(text)}
    assert parsed["reconciler_passes"].type == "counter"  # the parser names counters without _total
    assert parsed["reconciler_pass_duration_seconds"].type == "histogram"
    assert {s.labels["phase"] for s in parsed["reconciler_runs"].samples} == set(PHASES)


def test_openmetrics_when_asked_and_head(world):
    d = world.start(world.clone("daemon"))
    d.wait_ready()
    # What Prometheus sends.
    accept = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
              "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
    text, ctype = scrape(d, accept)
    assert ctype.startswith("application/openmetrics-text; version=1.0.0")
    assert text.endswith("# EOF\n")
    assert "# TYPE reconciler_passes counter" in text and 'reconciler_passes_total{result="ok"}' in text
    code, body = http("HEAD", d.url + "/metrics")
    assert code == 200 and body == b""


def test_machine_reachability_from_the_last_pass(world):
    world.add_unanswering_machine("gone-box", closed_port())
    d = world.start(world.clone("daemon"), RECONCILER_SSH_CONNECT_TIMEOUT="2")
    d.wait_ready()

    def observed():
        fams = parse_exposition(scrape(d)[0])
        return fams if sample(fams, "reconciler_machine_reachable", machine="gone-box") is not None else None

    fams = wait_for(observed, timeout=30, what="the fleet machine in reconciler_machine_reachable")
    assert sample(fams, "reconciler_machine_reachable", machine="gone-box") == 0
    assert sample(fams, "reconciler_machine_reachable", machine="local") == 1
    assert fams["reconciler_machine_reachable"]["type"] == "gauge"

    # The machine leaves the fleet: it leaves the metric with the next pass.
    (world.user / "specs" / "fleets" / "lab.yaml").unlink()
    world.user_commit("no fleet")
    wait_for(lambda: sample(parse_exposition(scrape(d)[0]), "reconciler_machine_reachable", machine="gone-box")
             is None, timeout=30, what="gone-box to leave the metric")

"""/healthz and the failure metrics of a real daemon: its remote goes away (the bare repository is
moved, so every fetch and push fails as with a host that is gone) and comes back; its passes stop
(the last good pass grows older than health_max_pass_age). Real git, real HTTP on 127.0.0.1."""

from __future__ import annotations

import json

from .conftest import http, run_spec, wait_for
from .test_daemon import parse_exposition


def sample(fams: dict, name: str, **labels: str) -> float | None:
    for n, lab, v in fams.get(name, {}).get("samples", []):
        if n == name and lab == labels:
            return v
    return None


def health(d) -> tuple[int, dict]:
    code, body = http("GET", d.url + "/healthz")
    return code, json.loads(body)


def metrics(d) -> dict:
    return parse_exposition(http("GET", d.url + "/metrics")[1].decode())


def test_unreachable_remote_goes_unhealthy_after_the_threshold_and_healthy_when_back(world):
    clone = world.clone("daemon")
    d = world.start(clone, RECONCILER_POLL_INTERVAL="0.3", RECONCILER_HEALTH_MAX_FAILURES="3")
    d.wait_ready()
    wait_for(lambda: health(d)[0] == 200, timeout=20, what="a healthy daemon")
    fams = metrics(d)
    assert sample(fams, "reconciler_healthy") == 1
    assert sample(fams, "reconciler_last_success_timestamp_seconds", kind="fetch") > 0

    away = world.tmp / "origin-away.git"
    world.origin.rename(away)
    # A spec written in the daemon's own checkout: it launches the run and commits a status that it
    # cannot push while the remote is gone.
    (clone / "specs" / "runs" / "offline.yaml").write_text(run_spec("offline"))

    def unhealthy():
        code, h = health(d)
        return h if code == 503 and h["failing"] == ["fetch", "push"] else None

    h = wait_for(unhealthy, timeout=30, what="503 naming fetch and push")
    assert h["ok"] is False and h["health_max_failures"] == 3
    fetch = h["checks"]["fetch"]
    assert fetch["ok"] is False and fetch["consecutive_failures"] >= 3
    assert "origin.git" in fetch["last_error"] and fetch["last_success_at"] and fetch["last_failure_at"]
    assert h["checks"]["push"]["consecutive_failures"] >= 3
    assert h["checks"]["pass"]["ok"] is True and h["checks"]["pass"]["consecutive_failures"] == 0
    assert any(p.startswith("fetch: failed ") and "in a row" in p for p in h["problems"]), h["problems"]
    assert world.workspaces() == ["offline-g1-a1"], "passes go on while the remote is away"

    fams = metrics(d)
    assert sample(fams, "reconciler_consecutive_failures", kind="fetch") >= 3
    assert sample(fams, "reconciler_consecutive_failures", kind="push") >= 3
    assert sample(fams, "reconciler_consecutive_failures", kind="pass") == 0
    assert sample(fams, "reconciler_failures_total", kind="fetch") >= 3
    assert sample(fams, "reconciler_fetches_total", result="error") >= 3
    assert sample(fams, "reconciler_pushes_total", result="error") >= 3
    assert sample(fams, "reconciler_last_failure_timestamp_seconds", kind="fetch") > 0
    assert sample(fams, "reconciler_healthy") == 0
    assert fams["reconciler_consecutive_failures"]["type"] == "gauge"
    assert fams["reconciler_failures_total"]["type"] == "counter"
    failures_while_away = sample(fams, "reconciler_failures_total", kind="fetch")
    assert d.logged("unhealthy"), "the start of the outage is logged"
    wait_for(lambda: any(e["failing"] == ["fetch", "push"] for e in d.logged("unhealthy") + d.logged("still unhealthy")),
             timeout=5, what="what fails to be logged")

    away.rename(world.origin)
    code, h = wait_for(lambda: (lambda r: r if r[0] == 200 else None)(health(d)), timeout=30,
                       what="200 once the remote is back")
    assert h["ok"] is True and h["failing"] == [] and h["problems"] == []
    assert all(h["checks"][k]["consecutive_failures"] == 0 for k in ("fetch", "push", "pass"))
    st = wait_for(lambda: world.remote_status("offline"), timeout=20, what="the held-back status on the remote")
    assert st["handle"]["identity"] == "offline-g1-a1"
    fams = metrics(d)
    assert sample(fams, "reconciler_consecutive_failures", kind="fetch") == 0
    assert sample(fams, "reconciler_consecutive_failures", kind="push") == 0
    assert sample(fams, "reconciler_failures_total", kind="fetch") >= failures_while_away  # a counter
    assert sample(fams, "reconciler_healthy") == 1
    assert d.logged("healthy again")


def test_healthz_503_when_the_last_good_pass_is_too_old(world):
    clone = world.clone("daemon")
    # Nothing asks for a pass after the first one for 300 s, but a good pass may be at most 1 s old.
    d = world.start(clone, RECONCILER_POLL_INTERVAL="300", RECONCILER_RESYNC_INTERVAL="300",
                    RECONCILER_HEALTH_MAX_PASS_AGE="1")
    d.wait_ready()
    wait_for(lambda: health(d)[1]["last_good_pass_at"], timeout=20, what="a first pass")

    def stale():
        code, h = health(d)
        return h if code == 503 else None

    h = wait_for(stale, timeout=20, what="503 once the last good pass is older than 1 s")
    assert h["failing"] == ["pass"] and h["checks"]["pass"]["consecutive_failures"] == 0
    assert h["problems"][0].startswith("pass: the last good pass ended "), h["problems"]
    assert 1 <= h["checks"]["pass"]["max_age_seconds"] < 2
    # A local change asks for a pass: healthy again, for a second.
    (clone / "specs" / "runs" / "fresh.yaml").write_text(run_spec("fresh"))
    wait_for(lambda: world.workspaces() == ["fresh-g1-a1"], timeout=20, what="a pass for the local change")
    wait_for(lambda: health(d)[0] == 200, timeout=5, what="200 right after a good pass")

"""The daemon serves the live page on its own port when dashboard_listen is set, and only then."""

from __future__ import annotations

from .conftest import free_port, http, wait_for


def test_the_daemon_serves_the_live_page_read_only(world):
    port = free_port()
    d = world.start(world.clone("daemon"), RECONCILER_DASHBOARD_LISTEN=f"127.0.0.1:{port}")
    d.wait_ready()
    world.add_spec("shown")
    page = f"http://127.0.0.1:{port}"
    body = wait_for(lambda: (lambda r: r[1] if r[0] == 200 and b">shown<" in r[1] else None)(http("GET", page + "/")),
                    timeout=30, what="the run on the live page")
    assert b"<table id=runs data-live>" in body
    assert http("GET", page + "/runs/shown")[0] == 200
    assert http("POST", page + "/runs/shown", b"x")[0] == 405
    assert d.logged("dashboard listening")
    # /metrics stays on its own listener; the page is not there.
    assert http("GET", d.url + "/")[0] == 404

"""A long-lived reconciler keeps one SSH connection per machine from pass to pass, reconnects
when it dropped, and closes it when the machine leaves the fleet."""

from __future__ import annotations

from reconciler.core import config
from reconciler.engine.loop import Reconciler
from tests.world import World, fleet, machine


def test_connections_are_kept_reconnected_and_closed(tmp_path, sshd_factory) -> None:
    server = sshd_factory()
    w = World(tmp_path, [fleet([machine(server, "lab-1")])])
    try:
        rec = Reconciler(config.load(str(w.repo), flags=w.flags), keep_connections=True)
        rec.run_pass()
        t = rec.connections["lab-1"][1]
        first = t._client.get_transport()
        result = rec.run_pass()
        assert rec.connections["lab-1"][1] is t and t._client.get_transport() is first  # kept
        assert result.world.machines["lab-1"].round_trips == 1  # counted per pass, not in all
        server.stop()
        server.start()  # the connection dropped with the old sshd: the next pass reconnects
        result = rec.run_pass()
        assert result.world.machines["lab-1"].reachable and t._client.get_transport() is not first
        w.set_fleet(fleet([machine(server, "lab-2")]))  # lab-1 leaves the fleet
        rec.run_pass()
        assert "lab-1" not in rec.connections and t._client is None
        rec.close()
        assert rec.connections == {}
    finally:
        w.cleanup()

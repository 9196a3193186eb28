"""The room index names the machines that fit as a scan of every machine does, and a launch
counted through ``Quotas.launched`` leaves the usage and the note ``borrowing`` and ``add`` give."""

from __future__ import annotations

import random

import pytest

from reconciler.planner.capacity import RoomIndex, Slot
from reconciler.planner.quota import Quotas
from reconciler.spec.load import DesiredState
from reconciler.spec.models.policy import Policy


@pytest.mark.parametrize("seed", range(20))
def test_the_machines_that_fit_are_named_as_a_scan_names_them(seed) -> None:
    rng = random.Random(seed)
    slots = []
    for i in range(rng.randint(1, 40)):
        types = {g: rng.choice(["H100", "A100"]) for g in range(rng.choice([0, 1, 2, 4, 8]))}
        slots.append(Slot(f"m{rng.randrange(1000):03d}-{i}", "ssh", "f", rng.choice([None, 2, 4]), types))
    index = RoomIndex(slots)
    for _ in range(150):
        gtype, count = rng.choice([None, "h100", "A100"]), rng.choice([0, 1, 2, 4])
        want = sorted(s.name for s in slots if s.fits(count, gtype))
        assert index.fitting_names(gtype, count) == want, (gtype, count)
        assert index.fitting(gtype, count) == len(want)
        got = index.best(gtype, count)
        if got is not None and rng.random() < 0.7:
            got.take(count, gtype)
            index.changed(got)
        elif rng.random() < 0.2:
            slot = rng.choice(slots)
            slot.draining = None if slot.draining else "swap"
            index.changed(slot)


def test_a_launch_counted_at_once_is_borrowing_then_add() -> None:
    desired = DesiredState()
    desired.policy = Policy.model_validate({
        "apiVersion": "reconciler/v1", "kind": "Policy", "metadata": {"name": "p"},
        "spec": {"teams": [{"name": "a", "maxGpus": 4, "borrow": True}, {"name": "b", "maxGpus": 8}]}})
    for team, gpus in [("a", 2), ("a", 3), (None, 1), ("b", 4), ("c", 2), ("a", 0)]:
        one, other = Quotas(desired), Quotas(desired)
        for q in (one, other):
            q.usage["a"] = [3.0, 1.5]
        one._teams["r"] = other._teams["r"] = team
        note = other.borrowing("r", gpus)
        other.add("r", gpus, 0.0)
        assert one.launched(team, gpus) == note
        assert one.usage == other.usage and one.changed == other.changed

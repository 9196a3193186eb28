"""The bulk of a plan is built through shortcuts that must give the values the general code gives:
a Change built positionally, a first identity written out, the room index moving one machine
between buckets as room is taken and given back, and the reads of every run's spec done once."""

from __future__ import annotations

import random
from dataclasses import asdict, fields

import pytest

from reconciler.core.actions import Action
from reconciler.core.identity import make
from reconciler.core.plan import Change, Kill, bulk_change
from reconciler.planner import launch
from reconciler.planner.capacity import RoomIndex, Slot


def test_a_bulk_change_is_the_change_the_constructor_builds() -> None:
    base = {"generation": 3, "attempt": 2, "spec_digest": "sha256:abc", "spec_path": "specs/runs/a.yaml"}
    kill = [Kill("m1", "a-g3-a1", "/w")]
    got = bulk_change("a", Action.RELAUNCH, "Relaunch", "why", "Running", base, "a-g3-a2", "m2", "ssh_host_process",
                      [0, 1], kill, 15.0, "a-g3-a1", ["m2: chosen"])
    want = Change("a", Action.RELAUNCH, "Relaunch", "why", "Running", identity="a-g3-a2", machine="m2",
                  backend="ssh_host_process", gpus=[0, 1], kill=kill, retry_after=15.0, resume_from="a-g3-a1",
                  considered=["m2: chosen"], **base)
    assert got == want
    assert asdict(got) == asdict(want)
    # Every field is set (a field added to Change and not to bulk_change fails here), and the
    # defaults that are lists are the change's own.
    assert [f.name for f in fields(Change)] == list(asdict(got))
    other = bulk_change("b", Action.WAIT, "NoCapacity", "no capacity", "Pending", base, "b-g3-a2", None, None, [],
                        [], 30.0, None, [])
    got.cleanup.append(Kill("m", "x-g1-a1"))
    assert other.cleanup == [] and other.nodes == [] and other.collect_nodes == []


@pytest.mark.parametrize("name", ["a", "run-00001", "x-y-z9"])
def test_the_first_identity_written_out_is_identity_make(name) -> None:
    assert f"{name}-g1-a1" == make(name, 1, 1)
    source = launch.new_run.__code__.co_consts
    assert any(isinstance(c, str) and c == "-g1-a1" for c in source)  # the format new_run writes out


def _scan(slots: list[Slot], gtype: str | None, count: int) -> Slot | None:
    fit = [s for s in slots if s.fits(count, gtype)]
    if not fit:
        return None
    key = (lambda s: (s.free_count(gtype) - count, s.tasks, s.name)) if count else (lambda s: (s.tasks, s.name))
    return min(fit, key=key)


@pytest.mark.parametrize("seed", range(20))
def test_the_room_index_follows_room_taken_and_given_back(seed) -> None:
    """Machines move between buckets both ways (a stop gives room back, a machine drains): the
    index still picks what a scan of every machine picks, and counts the machines that fit."""
    rng = random.Random(seed)
    slots = []
    for i in range(rng.randint(1, 30)):
        types = {g: rng.choice(["H100", "A100"]) for g in range(rng.choice([0, 1, 2, 4, 8]))}
        slots.append(Slot(f"m{rng.randrange(1000):03d}-{i}", "ssh", "f", rng.choice([None, 2, 4]), types,
                          tasks=rng.randint(0, 2)))
    rng.shuffle(slots)  # the index ranks by name itself
    index = RoomIndex(slots)
    held: list[tuple[Slot, list[int]]] = []
    for _ in range(120):
        gtype, count = rng.choice([None, "h100", "A100"]), rng.choice([0, 1, 2, 4])
        assert index.best(gtype, count) is _scan(slots, gtype, count), (gtype, count)
        assert index.fitting(gtype, count) == sum(s.fits(count, gtype) for s in slots)
        move = rng.random()
        if move < 0.5:
            got = index.best(gtype, count)
            if got is not None:
                held.append((got, got.take(count, gtype)))
                index.changed(got)
        elif move < 0.8 and held:
            slot, gpus = held.pop(rng.randrange(len(held)))
            slot.give_back(gpus, type("R", (), {"cpu_count": 0, "memory_gb": 0.0})())
            index.changed(slot)
        else:
            slot = rng.choice(slots)
            slot.draining = None if slot.draining else "swap"
            index.changed(slot)

"""The boundary parser against generated hostile replies: it never raises anything but BadReply,
what it lets through has the promised types and bounds, and decoding a bounded reply takes
bounded memory. Plain ``random`` with a fixed seed: every failure reproduces."""

from __future__ import annotations

import json
import math
import random
import time
import tracemalloc

import pytest

from reconciler.core import boundary, replies
from reconciler.core.boundary import BadReply, RunReport, loads, may_report, parse_probe
from reconciler.core.identity import split
from reconciler.core.observed import ObservedMachine, ObservedRun, ObservedWorld

SEED = 20251125
KEYS = ["state", "exit_code", "finished_at", "started_at", "pid", "container", "workspace", "gpus", "collected",
        "message", "progress", "permanent", "spec_digest", "checkpoints", "queued", "slurm_job", "heartbeat_age",
        "gang", "rank", "of", "machines", "step", "max_steps", "loss", "learning_rate", "epoch", "updated_at",
        "root", "drain", "foreign_gpus", "error", "runs", "reason", "gpus", "__proto__", ""]
GOOD = {"state": "running", "exit_code": 0, "finished_at": 1.7e9, "started_at": 1.7e9, "pid": 1234,
        "container": "r-g1-a1", "workspace": "/ws/r-g1-a1", "gpus": [0, 1], "collected": False,
        "message": "ok", "progress": {"step": 3, "max_steps": 10, "loss": 0.5, "learning_rate": 1e-4,
                                      "epoch": 0.3, "updated_at": "2025-01-01T00:00:00Z"},
        "permanent": False, "spec_digest": "sha256:" + "ab" * 32,
        "checkpoints": ["artifacts/output/v0-20250101-000000/checkpoint-50"], "heartbeat_age": 1.5,
        "gang": {"rank": 1, "of": 2, "machines": ["lab-1", "lab-2"]}}


SCALARS = [
    None, True, False, 0, -1, 2**31, -(2**63), 10**300, 10**4000, 123456,
    float("nan"), float("inf"), float("-inf"), 1e308, -0.0, 5e-324, 0.25,
    "", "running", "failed", "../../etc/passwd", "/abs/path", "a" * 20_000, "a" * 300,
    "\x1b[31mred\x1b[0m\n\r\t\x00", "\u202eevil\u2066", "\ud800lone", "soft\u00adhyphen", "checkpoint-1/../../x", "ünïcödé", "💥" * 100,
    "2025-01-01T00:00:00Z", "sha256:" + "0" * 64, "lab-1", "r-g1-a1", "r-g1-a1-n1",
]


def hostile_scalar(rng: random.Random):
    return rng.choice(SCALARS)


def hostile_value(rng: random.Random, depth: int = 0):
    roll = rng.random()
    if depth > 5 or roll < 0.45 + 0.1 * depth:  # containers thin out with depth: trees stay small
        return hostile_scalar(rng)
    if roll < 0.75:
        return [hostile_value(rng, depth + 1) for _ in range(rng.randint(0, 5))]
    if roll < 0.8:  # deep nesting
        v: object = hostile_scalar(rng)
        for _ in range(rng.randint(10, 400)):
            v = [v] if rng.random() < 0.5 else {"k": v}
        return v
    return {rng.choice(KEYS): hostile_value(rng, depth + 1) for _ in range(rng.randint(0, 5))}


def hostile_run(rng: random.Random):
    if rng.random() < 0.15:
        return hostile_value(rng)
    run = dict(GOOD)
    for _ in range(rng.randint(0, 5)):  # mutate some keys, with any type at any key
        run[rng.choice(list(GOOD) + KEYS)] = hostile_value(rng, 1)
    for _ in range(rng.randint(0, 2)):
        run.pop(rng.choice(list(GOOD)), None)
    return run


def hostile_reply(rng: random.Random):
    roll = rng.random()
    if roll < 0.1:
        return hostile_value(rng)
    ident = lambda: rng.choice(["r-g1-a1", "r-g1-a1-n0", "r-g1-a1-n1", "x-g2-a3", "Bad Name", "a" * 200, "",
                                "r-g" + "9" * 50 + "-a1", "r-g1-a1-n99999"])  # noqa: E731
    runs = {ident(): hostile_run(rng) for _ in range(rng.randint(0, 6))}
    reply = {"root": hostile_scalar(rng) if rng.random() < 0.3 else "/ws", "runs": runs}
    for k in ("drain", "foreign_gpus", "error", "now", "host"):
        if rng.random() < 0.4:
            reply[k] = hostile_value(rng, 1)
    if rng.random() < 0.1:
        reply["runs"] = hostile_value(rng, 1)
    return reply


def check_reply(reply) -> None:
    """Everything the boundary lets through keeps its promises."""
    assert isinstance(reply.error, str) and len(reply.error) <= 2 * boundary.MAX_MESSAGE + 2
    assert reply.root is None or (reply.root.startswith("/") and reply.root.isprintable())
    assert all(isinstance(g, int) and 0 <= g <= boundary.MAX_GPU_INDEX for g in reply.foreign_gpus)
    for ident, r in reply.runs.items():
        assert isinstance(r, RunReport) and r.identity == ident and split(ident)[0] is not None
        assert r.state in boundary.RUN_STATES
        for t in (r.finished_at, r.started_at, r.heartbeat_age):
            assert t is None or (isinstance(t, float) and math.isfinite(t))
        assert r.exit_code is None or (isinstance(r.exit_code, int) and abs(r.exit_code) <= 2**31)
        assert r.pid is None or (isinstance(r.pid, int) and 0 < r.pid < 2**31)
        assert isinstance(r.message, str) and len(r.message) <= boundary.MAX_MESSAGE
        assert r.message.isprintable()
        assert r.queued is None or r.queued.isprintable()
        assert all(isinstance(g, int) and 0 <= g <= boundary.MAX_GPU_INDEX for g in r.gpus)
        assert r.workspace is None or (r.workspace.startswith("/") and "/../" not in r.workspace + "/")
        for c in r.checkpoints:
            assert not c.startswith("/") and ".." not in c.split("/") and c.isprintable()
        if r.progress is not None:
            assert set(r.progress) <= {"step", "max_steps", "loss", "learning_rate", "epoch", "updated_at"}
            for k, v in r.progress.items():
                assert v is None or isinstance(v, str) or (isinstance(v, (int, float)) and math.isfinite(v)
                                                           and not isinstance(v, bool))
        if r.gang is not None:
            assert 0 <= r.gang["rank"] < r.gang["of"] <= boundary.MAX_GANG
            assert split(ident)[1] == r.gang["rank"]
        json.dumps(r.__dict__, allow_nan=False)  # nothing non-finite reaches the ledger or a status


def test_parse_probe_never_raises_but_bad_reply():
    rng = random.Random(SEED)
    t0 = time.monotonic()
    bad = good = 0
    for _ in range(3000):
        value = hostile_reply(rng)
        stop = boundary.parse_stop(value.get("runs") if isinstance(value, dict) else value)
        assert all(isinstance(stop[k], bool) for k in ("was_alive", "killed", "removed") if k in stop)
        assert "error" not in stop or (isinstance(stop["error"], str) and 0 < len(stop["error"]) <= 300
                                       and stop["error"].isprintable())
        try:
            reply = parse_probe(value)
        except BadReply:
            bad += 1
            continue
        good += 1
        check_reply(reply)
    assert good > 1000 and bad > 50  # both kinds were generated
    assert time.monotonic() - t0 < 15


def test_loads_never_raises_but_bad_reply():
    rng = random.Random(SEED + 1)
    texts = [b"", b"{", b"[" * 100_000, b"{\"a\":" * 10_000, b'{"a": ' + b"1" * 5000 + b"}", b"\xff\xfe\x00",
             b'{"runs": {"r-g1-a1": {"state": "running"}}}', b"NaN", b"-Infinity", b'"\\ud800"',
             b"[" + b"{}," * 300_000 + b"{}]"]
    for _ in range(1500):
        value = hostile_reply(rng)
        try:
            text = json.dumps(value).encode()
        except (ValueError, RecursionError):
            continue
        if rng.random() < 0.3 and text:  # damaged in transit, or by the machine on purpose
            cut = rng.randrange(len(text))
            text = text[:cut] + bytes([rng.randrange(256)]) + text[cut + 1:]
        texts.append(text)
    decoded = 0
    for text in texts:
        try:
            value = loads(text)
        except BadReply:
            continue
        decoded += 1
        try:
            check_reply(parse_probe(value))
        except BadReply:
            pass
    assert decoded > 500


def test_size_and_container_bounds():
    with pytest.raises(BadReply, match="over the limit"):
        loads(b" " * 2048, limit=1024)
    with pytest.raises(BadReply, match="objects or arrays"):
        loads(b"[" + b"[]," * (boundary.MAX_CONTAINERS + 1) + b"[]]")
    with pytest.raises(BadReply, match="runs"):
        parse_probe({"runs": {f"r-g1-a{i}": {} for i in range(boundary.MAX_RUNS + 1)}})


def test_names_and_paths_are_whole_matches():
    """A trailing newline (which "$" lets through) makes no identity, checkpoint or machine name."""
    reply = parse_probe({"runs": {"r-g1-a1\n": {"state": "running"}, "r-g1-a1": {
        "state": "running", "checkpoints": ["artifacts/checkpoint-1\n", "artifacts/checkpoint-2"],
        "progress": {"step": 1, "updated_at": "2025-01-01T00:00:00Z\n"}}}})
    assert list(reply.runs) == ["r-g1-a1"] and any("not a run identity" in r for r in reply.rejected)
    assert reply.runs["r-g1-a1"].checkpoints == ["artifacts/checkpoint-2"]
    assert reply.runs["r-g1-a1"].progress == {"step": 1, "max_steps": None, "loss": None, "learning_rate": None,
                                              "epoch": None, "updated_at": None}
    node = boundary.parse_run("r-g1-a1-n0", {"state": "running", "gang": {"rank": 0, "of": 1, "machines": ["a\n"]}})
    assert node.state == "unknown" and node.gang is None


def test_decoding_a_bounded_reply_takes_bounded_memory():
    """The worst shapes a reply within the limits can take decode to at most ~8x its size (numbers),
    plus what the capped counts of containers and strings cost (~60 bytes each): measured on 4 MiB
    of each shape (tracemalloc counts every Python allocation)."""
    size = 4 << 20
    shapes = {
        "tiny containers": b"[" + b"[]," * (size // 3 - 1) + b"[]]",  # refused: too many containers
        "short strings": b'["' + b'ab","' * (size // 5 - 1) + b'ab"]',  # refused: too many strings
        "floats": b"[" + b"1.5," * (size // 4 - 1) + b"1.5]",
        "ints": b"[" + b"123456," * (size // 7 - 1) + b"1]",
        "containers at the cap": b"[" + b"[]," * (boundary.MAX_CONTAINERS - 2) + b"[]]",
        "strings at the cap": b"[" + b",".join([b'"abc"'] * (boundary.MAX_STRINGS - 1)) + b"]",
        "one long string": b'{"runs": {"r-g1-a1": {"state": "running", "message": "' + b"x" * size + b'"}}}',
    }
    refused = set()
    for name, text in shapes.items():
        assert len(text) <= size + 1024, name
        tracemalloc.start()
        try:
            try:
                parse_probe(loads(text))
            except BadReply:
                refused.add(name)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 10 * size + 40 * 2**20, f"{name}: peak {peak / 2**20:.0f} MiB for {size / 2**20:.0f} MiB"
    assert {"tiny containers", "short strings"} <= refused


def test_binding_fuzz_a_machine_never_speaks_for_a_recorded_other():
    """Whatever a machine reports about an attempt whose status records other machines, it is
    refused; and a gang report cannot move a recorded node."""
    rng = random.Random(SEED + 2)

    class Handle:
        def __init__(self, machine, identity, nodes=None):
            self.machine, self.identity, self.nodes = machine, identity, nodes

    machines = ["lab-1", "lab-2", "lab-3"]
    for _ in range(2000):
        owner = rng.choice(machines)
        reporter = rng.choice(machines)
        gang = rng.random() < 0.5
        nodes = [{"machine": owner, "identity": "r-g1-a1-n0"}, {"machine": "lab-3", "identity": "r-g1-a1-n1"}]
        handle = Handle(owner, "r-g1-a1", nodes if gang else None)
        ident = rng.choice(["r-g1-a1", "r-g1-a1-n0", "r-g1-a1-n1"])
        raw = hostile_run(rng)
        if isinstance(raw, dict) and rng.random() < 0.5:
            raw["gang"] = {"rank": split(ident)[1] or 0, "of": 2, "machines": rng.sample(machines, 2)}
        report = boundary.parse_run(ident, raw)
        why = may_report(reporter, report, handle, f"/ws/{ident}")
        if gang:
            allowed = {n["machine"] for n in nodes if n["identity"] == ident} or {owner, "lab-3"}
        else:
            allowed = {owner}
        if reporter not in allowed:
            assert why is not None and "recorded on" in why or "gang layout" in (why or "")
        if why is None and report.gang is not None and report.gang["machines"]:
            assert report.gang["machines"][report.gang["rank"]] == reporter
            if gang:
                assert report.gang["machines"] == [n["machine"] for n in nodes]


def test_a_bounded_gang_cannot_blow_up_folding():
    """A node's gang size is bounded at the boundary, so folding a forged gang stays small."""
    r = boundary.parse_run("r-g1-a1-n0", {"state": "running", "gang": {"rank": 0, "of": 10**9, "machines": []}})
    assert r.state == "unknown" and r.gang is None
    w = ObservedWorld()
    m = w.machines["lab-1"] = ObservedMachine("lab-1")
    ok = boundary.parse_run("r-g1-a1-n0", {"state": "running",
                                           "gang": {"rank": 0, "of": boundary.MAX_GANG, "machines": []}})
    m.runs[ok.identity] = ObservedRun(ok.identity, "lab-1", ok.state, gang=ok.gang)
    folded = w.find("r-g1-a1")
    assert folded is not None and folded.state == "lost"


def test_the_decoding_budget_lets_replies_wait_their_turn():
    """Replies that together exceed the budget are decoded one after another: each keeps its
    share while its decoded value is in use (the scope), the next waits; one larger than the
    whole budget, or one that waits too long, is a BadReply; nothing stays held."""
    import threading

    from tests.repo_helpers import wait_for

    budget = replies.ReplyBudget(100)
    reply = json.dumps({"runs": {}, "pad": "x" * 22}).encode()  # 45 bytes: two fit, three do not
    assert 2 * len(reply) <= 100 < 3 * len(reply)
    go = [threading.Event() for _ in range(5)]
    decoded: list[int] = []

    def probe(i: int) -> None:
        with budget.scope():
            budget.decode(reply, timeout=30)
            decoded.append(i)
            go[i].wait(30)

    threads = [threading.Thread(target=probe, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    wait_for(lambda: len(decoded) == 2, timeout=10, what="two replies decoded")
    assert len(decoded) == 2 and budget.used == 2 * len(reply)
    for n in range(3, 6):
        go[decoded[n - 3]].set()  # one holder is done with its value: the next reply decodes
        wait_for(lambda: len(decoded) == min(n, 5), timeout=10, what=f"{n} replies decoded")
        assert budget.used <= 2 * len(reply)
    for e in go:
        e.set()
    for t in threads:
        t.join(10)
    assert budget.used == 0 and budget.peak == 2 * len(reply)
    with pytest.raises(BadReply, match="over the whole decoding budget"):
        budget.decode(b"[" + b"1," * 60 + b"1]")
    with budget.scope():
        budget.decode(reply)
        budget.decode(reply)  # a second decode in one scope replaces the first
        assert budget.used == len(reply)
        with pytest.raises(BadReply, match="no room to decode"):
            outcome: list = []

            def late() -> None:
                try:
                    budget.decode(json.dumps("y" * 58).encode(), timeout=0.2)
                except BadReply as e:
                    outcome.append(e)

            t = threading.Thread(target=late)
            t.start()
            t.join(10)
            raise outcome[0]
    assert budget.used == 0
    with pytest.raises(BadReply, match="not JSON"):
        budget.decode(b"{")
    assert budget.used == 0


def test_the_probe_bounds_agree_with_the_boundary():
    """The probe runs on the machine and cannot import the package, so it keeps its own copies of
    the bounds; the control plane checks again whatever it says. The copies must not be looser:
    a value the probe passes on and the boundary refuses would turn a sane run's entry unknown."""
    from reconciler.runtime import readings

    assert readings.MAX_TIME == boundary.MAX_TIME
    assert readings.MAX_NUMBER == boundary.MAX_ABS_NUMBER


def test_absolute_path():
    for good in ("/", "/srv/runs", "/home/u/.reconciler/w", "//x"):
        assert boundary.absolute_path(good) == good
    for bad in (None, 1, "", "rel/ative", "/a/../b", "/a/./b", "/a/", "/a//b", "/x\nrm", "/\u202ex",
                "/" + "a" * boundary.MAX_PATH):
        assert boundary.absolute_path(bad) is None, bad


def test_a_scope_within_a_scope_leaves_nothing_held():
    budget = replies.ReplyBudget(1000)
    reply = json.dumps("x" * 98).encode()
    with budget.scope():
        budget.decode(reply)
        with budget.scope():
            budget.decode(reply)  # replaces the first, held until the outer scope ends
        assert budget.used == len(reply)
    assert budget.used == 0

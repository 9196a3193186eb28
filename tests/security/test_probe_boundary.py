"""Hostile machines against the probe boundary, over real sshd servers and real processes.

A machine (or the job on it) is the attacker here: it reports another machine's runs as failed,
writes garbage into its own runtime files, or answers the probe with the wrong shape, far too
much, or nothing at all. Each test shows that the damage stays on the machine that did it: the
other machines' runs keep running, untouched, and the bad machine carries the reason.

The hostile machines log in as their own users (``rcprobe*``), so what is planted in one's home
(its staged probe) concerns no other test. A probe is replaced the way a machine's owner could:
by writing the file the reconciler stages its probe to and later runs by path.
"""

from __future__ import annotations

import json
import pwd
import shutil
import time
from pathlib import Path

import pytest

from reconciler.machines.base import MachineInfo
from reconciler.machines.remote_agent import agent_hash
from reconciler.machines.ssh import SshTransport
from reconciler.core.errors import TemporaryError
from reconciler.spec.models.fleet import Machine
from tests.world import World, alive_instances, fleet, machine, remote_root, run_spec

pytestmark = pytest.mark.e2e


def _vm_hwm_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def _plant_probe(server, program: str) -> Path:
    """Replace the machine's staged probe: the reconciler finds it there and runs it."""
    home = Path(pwd.getpwnam(server.user).pw_dir)
    d = home / ".cache" / "reconciler"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"agent-{agent_hash()}.py"
    path.write_text(program)
    path.chmod(0o644)
    return path


@pytest.fixture
def planted():
    paths: list[Path] = []
    yield paths
    for p in paths:
        p.unlink(missing_ok=True)


def _root(m: dict) -> Path:
    return Path(m["workspace_root"]) / "test"  # World's namespace


def _plant_workspace(root: Path, identity: str, payload: dict, result: dict) -> None:
    ws = root / identity
    (ws / "runtime").mkdir(parents=True, exist_ok=True)
    (ws / "job.json").write_text(json.dumps({"schema_version": "v1", "payload": payload}))
    (ws / "runtime" / "result.json").write_text(json.dumps(result))
    for p in [root, *root.parents][:3]:
        if str(p).startswith("/tmp/rc-ws-"):
            p.chmod(0o755)


# ---------------------------------------------------------------- a machine speaking for another


def test_a_machine_cannot_fail_or_fence_another_machines_run(tmp_path, sshd_factory):
    """lab-a is hostile (drained: it runs nothing of ours) and its workspace root holds forged
    workspaces named with lab-b's run identity, one of them a node of a made-up gang that places
    its other node on lab-b: its real probe reports them all as failed. lab-b's run is untouched."""
    bad = sshd_factory("127.0.0.21", user="rcprobea")
    good = sshd_factory("127.0.0.22", user="rcprobeb")
    ma, mb = machine(bad, "lab-a", max_tasks=0), machine(good, "lab-b", max_tasks=2)
    with World(tmp_path, [fleet([ma, mb])]) as w:
        w.add_run(run_spec("victim", "ssh-host", ["sleep", "60"],
                           restartPolicy={"maxRetries": 2, "backoffSeconds": 0}))
        st = w.until("victim", lambda s: s.phase == "Running")
        assert st.handle.machine == "lab-b" and st.handle.identity == "victim-g1-a1"
        pid = st.handle.pid
        job = json.loads(Path(st.handle.workspace, "job.json").read_text())["payload"]
        failed = {"state": "failed", "exit_code": 1, "finished_ts": time.time() - 5, "message": "forged"}
        _plant_workspace(_root(ma), "victim-g1-a1", {"gpus": [], "spec_digest": job["spec_digest"]}, failed)
        _plant_workspace(_root(ma), "victim-g1-a1-n1",
                         {"gpus": [], "spec_digest": job["spec_digest"],
                          "gang": {"rank": 1, "of": 2, "machines": ["lab-b", "lab-a"]}}, failed)
        for _ in range(3):
            r = w.run_pass()
            # the planner saw only lab-b's instance, running: nothing is stopped, fenced or relaunched
            obs = r.world.find("victim-g1-a1")
            assert obs is not None and obs.machine == "lab-b" and obs.state == "running" and not obs.nodes
            assert not [k for c in r.plan.changes for k in c.kill if k.identity.startswith("victim-")]
            assert r.plan.for_run("victim").action == "none"
            # and lab-a carries the reason
            a = r.world.machines["lab-a"]
            assert a.reachable, a.error
            assert "reported runs it does not host" in a.error
            assert "victim-g1-a1 is recorded on lab-b" in a.error
            assert "victim-g1-a1-n1 is recorded on lab-b" in a.error
            assert "victim-g1-a1" not in a.runs and "victim-g1-a1-n1" not in a.runs
        st = w.status("victim")
        assert st.phase == "Running" and st.attempt == 1 and st.handle.machine == "lab-b"
        assert st.handle.pid == pid and not any("forged" in h.reason for h in st.history)
        assert alive_instances(_root(mb), "victim") == ["victim-g1-a1"]


def test_a_machine_cannot_bring_back_a_settled_run(tmp_path, sshd_factory):
    """A finished run settles (its status is no longer read every pass); a hostile machine then
    shows a workspace of its identity that looks just launched. The status is read for the check,
    the report refused, and the run stays Succeeded on the machine that ran it."""
    bad = sshd_factory("127.0.0.31", user="rcprobek")
    good = sshd_factory("127.0.0.32", user="rcprobel")
    ma, mb = machine(bad, "lab-a", max_tasks=0), machine(good, "lab-b", max_tasks=2)
    with World(tmp_path, [fleet([ma, mb])]) as w:
        w.add_run(run_spec("done", "ssh-host", ["true"]))
        rec = w.reconciler()
        deadline = time.monotonic() + 30
        while "done" not in rec.settled and time.monotonic() < deadline:
            rec.run_pass()
            time.sleep(0.1)
        assert "done" in rec.settled and w.status("done").phase == "Succeeded"
        ws = _root(ma) / "done-g1-a1"
        (ws / "runtime").mkdir(parents=True)
        (ws / "runtime" / "launched_at").write_text(str(int(time.time())))  # "just launched": running
        _plant_workspace(_root(ma), "done-g1-a1", {"gpus": []}, {})
        (ws / "runtime" / "result.json").unlink()
        r = rec.run_pass()
        st = w.status("done")
        assert st.phase == "Succeeded" and st.handle.machine == "lab-b", st.message
        assert not r.world.instances("done")
        assert "done-g1-a1 is recorded on lab-b" in r.world.machines["lab-a"].error


def test_an_unrecorded_attempt_is_taken_only_from_its_own_workspace_root(tmp_path, sshd_factory, planted):
    """A machine whose probe forges a report of a run nobody has recorded yet, with a workspace
    outside its own root, is refused too; its own leftovers in its root are still seen."""
    bad = sshd_factory("127.0.0.23", user="rcprobec")
    ma = machine(bad, "lab-a", max_tasks=0)
    root = str(_root(ma))
    forged = {"root": root, "runs": {
        "ghost-g1-a1": {"state": "running", "workspace": "/home/elsewhere/ghost-g1-a1", "collected": False},
        "mine-g1-a1": {"state": "failed", "exit_code": 2, "workspace": f"{root}/mine-g1-a1", "collected": False},
    }}
    planted.append(_plant_probe(bad, f"import json\nprint(json.dumps({forged!r}))\n"))
    with World(tmp_path, [fleet([ma])]) as w:
        r = w.run_pass()
        a = r.world.machines["lab-a"]
        assert a.reachable and "ghost-g1-a1: its workspace '/home/elsewhere/ghost-g1-a1' is not" in a.error
        assert "ghost-g1-a1" not in a.runs
        assert a.runs["mine-g1-a1"].state == "failed" and a.runs["mine-g1-a1"].exit_code == 2


# ---------------------------------------------------------------- a job attacking its own probe


DIGITS = "9" * 5000


def test_a_job_writing_garbage_fails_only_itself(tmp_path, sshd_factory):
    """The rogue job writes a 5,000-digit step into its logging.jsonl (twice: inside a string and
    as a bare number), then ``[]`` into its runtime/result.json. The probe reports it, with its
    reason, and the steady run on the same machine stays Running, pass after pass."""
    server = sshd_factory("127.0.0.24", user="rcprobed")
    m = machine(server, "lab-1", max_tasks=2)
    script = (
        "mkdir -p artifacts/output/v0-x && "
        "printf '%s\\n' '{\"loss\": 1.5, \"step\": 1}' "
        f"'{{\"loss\": 1.25, \"global_step/max_steps\": \"{DIGITS}/10\"}}' "
        f"'{{\"loss\": 1.0, \"step\": {DIGITS}}}' > artifacts/output/v0-x/logging.jsonl && "
        "printf '[]' > runtime/result.json && sleep 20"
    )
    # remote_cleanup never: the rogue's workspace stays, so the world's clean-up finds and ends its
    # process group (its job still sleeps: its bogus result made it Failed while alive)
    with World(tmp_path, [fleet([m])], remote_cleanup="never") as w:
        w.add_run(run_spec("steady", "ssh-host", ["sleep", "60"]))
        w.until("steady", lambda s: s.phase == "Running")
        w.add_run(run_spec("rogue", "ssh-host", ["sh", "-c", script], restartPolicy={"maxRetries": 0}))
        rogue = w.until("rogue", lambda s: s.phase == "Failed")
        assert "runtime/result.json is not a JSON object" in rogue.message
        for _ in range(3):
            r = w.run_pass()
            assert r.world.machines["lab-1"].reachable, r.world.machines["lab-1"].error
            st = w.status("steady")
            assert st.phase == "Running" and st.attempt == 1
            cond = st.condition("MachineReachable")
            assert cond is None or cond.status == "True"
        assert alive_instances(_root(m), "steady") == ["steady-g1-a1"]


def test_the_probe_survives_each_hostile_workspace_file(tmp_path):
    """The stdlib probe itself, on files a job controls: each bad workspace yields its own entry
    (failed with a reason, or unknown), never an exception, and the healthy one beside it is read."""
    from reconciler.runtime import probe

    root = tmp_path / "root"

    def ws(ident: str, files: dict[str, str | bytes]) -> None:
        for rel, text in files.items():
            p = root / ident / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(text if isinstance(text, bytes) else text.encode())

    ws("list-g1-a1", {"runtime/result.json": "[]"})
    ws("deep-g1-a1", {"runtime/result.json": "[" * 100_000})
    ws("state-g1-a1", {"runtime/result.json": '{"state": {"x": 1}, "exit_code": 1e999, "finished_ts": NaN}'})
    ws("pid-g1-a1", {"runtime/pid": DIGITS, "runtime/launched_at": "1", "runtime/started_at": DIGITS})
    ws("job-g1-a1", {"job.json": '{"payload": {"gang": {"machines": 5}, "gpus": "all"}}', "runtime/pid": "1"})
    ws("log-g1-a1", {"runtime/launched_at": str(time.time()),
                     "artifacts/output/logging.jsonl": '{"loss": NaN, "global_step/max_steps": "²/³"}\n'
                     + '{"loss": 1, "step": ' + "[" * 50_000 + "\n"})
    ws("ok-g1-a1", {"runtime/result.json": '{"state": "succeeded", "exit_code": 0, "finished_ts": 1700000000}'})
    report = probe.probe(str(root), ["list", "deep", "state", "pid", "job", "log", "ok"])
    runs = report["runs"]
    assert runs["ok-g1-a1"]["state"] == "succeeded" and runs["ok-g1-a1"]["exit_code"] == 0
    assert runs["list-g1-a1"]["state"] == "failed" and "not a JSON object" in runs["list-g1-a1"]["message"]
    assert runs["deep-g1-a1"]["state"] == "failed" and "not valid JSON" in runs["deep-g1-a1"]["message"]
    assert runs["state-g1-a1"]["state"] == "failed" and runs["state-g1-a1"]["exit_code"] is None
    assert runs["state-g1-a1"]["finished_at"] is None
    assert "pid" not in runs["pid-g1-a1"] and runs["pid-g1-a1"]["state"] == "lost"
    assert "started_at" not in runs["pid-g1-a1"]
    assert runs["job-g1-a1"]["gpus"] == [] and runs["job-g1-a1"]["gang"]["machines"] == []
    assert runs["log-g1-a1"]["state"] == "running"
    assert "progress" not in runs["log-g1-a1"] or runs["log-g1-a1"]["progress"]["loss"] is None
    json.dumps(report, allow_nan=False)  # nothing non-finite leaves the probe


# ---------------------------------------------------------------- malformed, huge and silent answers


WRONG_SHAPE = 'print(\'{"runs": []}\')\n'
HUGE = ("import sys\nchunk = '{\"runs\": {' + ' ' * (1 << 20)\n"
        "try:\n    for _ in range(300):\n        sys.stdout.write(chunk)\nexcept Exception:\n    pass\n")
# Never answers; ends once the reconciler gave up on it (its session, its parent, is gone), so no
# process outlives the test.
SILENT = ("import os, time\nparent = os.getppid()\nfor _ in range(300):\n"
          "    if os.getppid() != parent:\n        break\n    time.sleep(0.1)\n")


def test_bad_answers_mark_only_their_machine(tmp_path, sshd_factory, planted):
    """Three hostile machines answer with the wrong shape, with 300 MB, and not at all. Each pass
    finishes within the probe timeout (not the command timeout), the honest machine's run is
    observed and stays Running, each bad machine is unreachable with its reason, and the
    reconciler's memory does not follow the 300 MB."""
    ok = sshd_factory("127.0.0.25", user="rcprobee")
    shape = sshd_factory("127.0.0.26", user="rcprobef")
    huge = sshd_factory("127.0.0.27", user="rcprobeg")
    silent = sshd_factory("127.0.0.28", user="rcprobeh")
    machines = [machine(ok, "lab-ok"), machine(shape, "lab-shape", max_tasks=0),
                machine(huge, "lab-huge", max_tasks=0), machine(silent, "lab-silent", max_tasks=0)]
    for server, program in ((shape, WRONG_SHAPE), (huge, HUGE), (silent, SILENT)):
        planted.append(_plant_probe(server, program))
    probe_timeout = 3.0
    # A fresh reconciler holds a new run while a machine it never heard from may hold an unrecorded
    # launch of it (planner/fence.py), for the unreachable grace: a short one here.
    with World(tmp_path, [fleet(machines)], ssh_command_timeout=60.0, ssh_probe_timeout=probe_timeout,
               unreachable_grace=2.0) as w:
        w.add_run(run_spec("steady", "ssh-host", ["sleep", "60"]))
        st = w.until("steady", lambda s: s.phase == "Running", timeout=40)
        assert st.handle.machine == "lab-ok"
        before = _vm_hwm_kb()
        for _ in range(2):
            t0 = time.monotonic()
            r = w.run_pass()
            assert time.monotonic() - t0 < probe_timeout + 10
            seen = r.world.machines
            assert seen["lab-ok"].reachable and seen["lab-ok"].runs["steady-g1-a1"].state == "running"
            assert not seen["lab-shape"].reachable and "'runs' is a JSON list" in seen["lab-shape"].error
            assert not seen["lab-huge"].reachable and "exceeded" in seen["lab-huge"].error
            assert not seen["lab-silent"].reachable and "exit 124" in seen["lab-silent"].error
            st = w.status("steady")
            assert st.phase == "Running" and st.attempt == 1
        grown_mb = (_vm_hwm_kb() - before) / 1024
        assert grown_mb < 150, f"peak memory grew by {grown_mb:.0f} MB"
        assert alive_instances(_root(machines[0]), "steady") == ["steady-g1-a1"]


def _transport(server, root: str, **kw) -> SshTransport:
    endpoint = {"host": server.host, "port": server.port, "user": server.user,
                "identity_file": str(server.identity_file), "host_key": server.host_key}
    m = Machine.model_validate({"name": "lab-1", "ssh": endpoint, "workspace_root": root})
    return SshTransport(MachineInfo("lab-1", root, fleet_machine=m), **kw)


@pytest.fixture
def root():
    r = remote_root()
    yield r
    shutil.rmtree(r, ignore_errors=True)


def test_the_reply_size_is_bounded_at_the_read(sshd_factory, root, planted):
    server = sshd_factory("127.0.0.29", user="rcprobei")
    planted.append(_plant_probe(server, HUGE))
    t = _transport(server, root, probe_timeout=20.0, max_reply_bytes=1 << 20)
    try:
        t0 = time.monotonic()
        with pytest.raises(TemporaryError, match=r"exceeded 1048576 bytes"):
            t.agent({"op": "probe", "names": []})
        assert time.monotonic() - t0 < 10
        # the connection is still good for the next command
        assert t.sh("echo fine").out == "fine\n"
    finally:
        t.close()


def test_a_resident_helper_that_stalls_or_floods_fails_the_probe_in_time(sshd_factory, root, planted):
    """A long-lived reconciler's probe goes to a helper kept running on the machine: one that never
    answers fails the probe after the probe timeout once (no second wait the usual way), and one
    that answers too much is cut off at the bound."""
    server = sshd_factory("127.0.0.30", user="rcprobej")
    # reads the request and never answers; ends when the reconciler closes its channel (stdin)
    path = _plant_probe(server, "import sys\nsys.stdin.readline()\nsys.stdin.read()\n")
    planted.append(path)
    t = _transport(server, root, probe_timeout=1.5, command_timeout=60.0, max_reply_bytes=1 << 20)
    t.kept, t._staged = True, True
    try:
        t0 = time.monotonic()
        with pytest.raises(TemporaryError, match="did not answer within 1.5s"):
            t.agent({"op": "probe", "names": []})
        assert 1.4 < time.monotonic() - t0 < 5
        path.write_text("import sys\nsys.stdin.readline()\nsys.stdout.write('x' * (3 << 20))\nsys.stdout.flush()\n")
        with pytest.raises(TemporaryError, match="exceeded 1048576 bytes"):
            t.agent({"op": "probe", "names": []})
        path.write_text('import sys\nsys.stdin.readline()\nprint(\'{"runs": {}, "root": "/x\\\\nrm"}\')\n'
                        "sys.stdout.flush()\nsys.stdin.readline()\n")
        assert t.agent({"op": "probe", "names": []})["runs"] == {}
        assert t._root == root  # a root that is not a plain absolute path is not learnt
    finally:
        t.close()


# ---------------------------------------------------------------- many large replies at once

# A valid reply of ~6 MiB: 5,000 run entries, each with a long message, the planner's fields valid.
LARGE = ("import json, sys\n"
         "runs = {f'r{i}-g1-a1': {'state': 'running', 'message': 'm' * 1200} for i in range(5000)}\n"
         "sys.stdout.write(json.dumps({'runs': runs}) + '\\n')\nsys.stdout.flush()\n")


def test_parallel_large_replies_stay_within_the_decoding_budget(sshd_factory, root, planted):
    """Eight machines answer ~6 MiB each at once, with a budget for two: the replies wait their
    turn, every machine is observed, the budget is never exceeded, and the memory the decoded
    replies hold at once stays near two replies' worth; a reply larger than the whole budget
    fails its machine only."""
    import tracemalloc

    from reconciler.core import replies
    from reconciler.engine import observe

    server = sshd_factory("127.0.0.31", user="rcprobek")
    planted.append(_plant_probe(server, LARGE))
    names = [f"lab-{i}" for i in range(8)]
    transports = {n: _transport(server, root, probe_timeout=60.0) for n in names}
    one = transports[names[0]]
    size = len(json.dumps(one.agent({"op": "probe", "names": []})).encode())
    assert 5 << 20 < size < 8 << 20, size
    budget = replies.REPLY_BUDGET
    saved = budget.total
    try:
        budget.resize(2 * size + (1 << 20))
        budget.peak = 0
        tracemalloc.start()
        world = observe.observe(names, transports.__getitem__, [], {}, time.time(), parallel=8)
        _, traced_peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert all(world.machines[n].reachable and len(world.machines[n].runs) == 0 for n in names), \
            {n: world.machines[n].error for n in names}  # runs nobody recorded are not bound: none kept
        assert budget.used == 0 and size < budget.peak <= budget.total, (budget.peak, budget.total)
        # Loosely, what Python allocated at its peak: the eight raw replies (read before their
        # turn), two decoded at a time (~2x their size each here), the eight checked results
        # the pass keeps, and paramiko's buffers; far from eight decoded replies at 16 MiB.
        assert traced_peak < 16 * size + (32 << 20), traced_peak / 2 ** 20

        budget.resize(size // 2)  # smaller than one reply: each machine fails, with the reason
        world = observe.observe(names[:2], transports.__getitem__, [], {}, time.time(), parallel=2)
        for n in names[:2]:
            m = world.machines[n]
            assert not m.reachable and "over the whole decoding budget" in m.error, m.error
        assert budget.used == 0
    finally:
        budget.resize(saved)
        for t in transports.values():
            t.close()

"""Benchmark: one observe pass over 20 Fleet machines reached over SSH on loopback.

Starts its own sshd servers (tests/infra/sshd.py: one per loopback address 127.0.0.2 ... , user
rctest; needs root), gives each machine several run workspaces (some finished with a result, some
with a live ``sleep`` process group), and measures with the reconciler's own code:

- the observe pass time (connect to every machine, one agent call each, parse), over several passes
  each with fresh connections as in the real loop;
- the round trips per machine (``Transport.round_trips``) of an observe pass;
- submitted → running on an idle machine: from the start of ``run_pass`` (a new Run spec committed)
  until the job's process exists on the machine.

Targets: 1 round trip per machine, at most 2 s per pass, at most 2 s submitted → running.

    sudo python benchmarks/observe_bench.py [--machines 20] [--runs 6] [--passes 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from reconciler.core import config  # noqa: E402
from reconciler.engine.loop import Reconciler  # noqa: E402
from reconciler.engine.observe import names_to_watch, observe  # noqa: E402
from reconciler.runtime import readings  # noqa: E402
from reconciler.spec.load import load_tree  # noqa: E402
from reconciler.machines.pool import TransportPool  # noqa: E402
from tests.infra.sshd import SshServer  # noqa: E402


def machine_doc(server: SshServer, name: str, root: str) -> dict:
    return {"name": name, "max_tasks": 100, "workspace_root": root,
            "ssh": {"host": server.host, "port": server.port, "user": server.user,
                    "identity_file": str(server.identity_file), "host_key": server.host_key}}


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def _as_rctest() -> None:
    import pwd

    pw = pwd.getpwnam("rctest")
    os.setgid(pw.pw_gid)
    os.setuid(pw.pw_uid)


def make_workspaces(root: Path, machine: int, runs: int, procs: list[subprocess.Popen]) -> list[str]:
    """Half the runs finished (result.json), half alive (a sleep in its own process group)."""
    names = []
    for j in range(runs):
        name = f"bench-{machine:02d}-{j:02d}"
        ident = f"{name}-g1-a1"
        names.append(name)
        ws = root / ident
        (ws / "runtime").mkdir(parents=True)
        (ws / "artifacts").mkdir()
        (ws / "job.json").write_text('{"schema_version": "v1", "payload": {"gpus": []}}\n')
        (ws / "runtime" / "started_at").write_text(f"{int(time.time())}\n")
        if j % 2 == 0:
            (ws / "runtime" / "result.json").write_text(
                '{"state": "succeeded", "exit_code": 0, "finished_ts": %d}\n' % int(time.time()))
        else:
            # The identity in the group leader's command line, as the launch wrapper has it.
            p = subprocess.Popen(["sh", "-c", "sleep 600; :", ident], start_new_session=True, preexec_fn=_as_rctest,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(p)
            (ws / "runtime" / "pid").write_text(f"{p.pid}\n")
            (ws / "runtime" / "heartbeat").write_text(f"{int(time.time())}\n")
    return names


def run_doc(name: str, argv: list[str], target: str | None = None) -> dict:
    spec = {"template": "ssh-host", "task": {"type": "command", "argv": argv}}
    if target:
        spec["overrides"] = {"target": target}
    return {"apiVersion": "reconciler/v1", "kind": "Run", "metadata": {"name": name}, "spec": spec}


def process_with(needle: str) -> bool:
    """Whether a live process carries ``needle`` (the agent's own /proc scan and test)."""
    groups = readings._process_groups()
    return any(readings.group_alive(pgid, needle, groups) for pgid in groups)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machines", type=int, default=20)
    ap.add_argument("--runs", type=int, default=6, help="run workspaces per machine")
    ap.add_argument("--passes", type=int, default=5)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("observe_bench: needs root (it starts sshd servers and the rctest user)", file=sys.stderr)
        return 2

    scratch = Path(tempfile.mkdtemp(prefix="rc-obench-"))
    remote = Path(tempfile.mkdtemp(prefix="rc-obench-ws-", dir="/tmp"))
    remote.chmod(0o1777)
    servers: list[SshServer] = []
    procs: list[subprocess.Popen] = []
    try:
        t0 = time.perf_counter()
        for i in range(args.machines + 1):  # the last one stays idle for the latency measurement
            servers.append(SshServer(scratch / f"sshd-{i}", host=f"127.0.0.{i + 2}").start())
        started = time.perf_counter() - t0
        repo = scratch / "repo"
        for d in ("specs/fleets", "specs/runs", "execution_templates"):
            (repo / d).mkdir(parents=True)
        (repo / ".gitignore").write_text(".reconciler/\n")
        (repo / "execution_templates" / "ssh-host.yaml").write_text(yaml.safe_dump({
            "apiVersion": "reconciler/v1", "kind": "ExecutionTemplate", "id": "ssh-host",
            "placement": {"kind": "ssh"}, "launch_mode": {"kind": "host_process"},
            "defaults": {"target": "bench"}, "allow_overrides": ["target"]}))
        machines, names = [], []
        for i, server in enumerate(servers):
            name = f"m{i:02d}" if i < args.machines else "idle"
            root = remote / name
            machines.append(machine_doc(server, name, str(root)))
            if i < args.machines:
                names += make_workspaces(root / "bench", i, args.runs, procs)
        for m in machines:
            for p in Path(m["workspace_root"]).rglob("*"):
                shutil.chown(p, user="rctest") if not p.is_symlink() else None
            if Path(m["workspace_root"]).exists():
                shutil.chown(m["workspace_root"], user="rctest")
        for name in names:  # desired, so a full pass adopts the live ones instead of fencing them
            (repo / "specs" / "runs" / f"{name}.yaml").write_text(
                yaml.safe_dump(run_doc(name, ["sleep", "600"], target=f"m{int(name.split('-')[1]):02d}")))
        (repo / "specs" / "fleets" / "bench.yaml").write_text(yaml.safe_dump({
            "apiVersion": "reconciler/v1", "kind": "Fleet", "metadata": {"name": "bench"},
            "spec": {"machines": machines}}))
        git(repo, "init", "-q", "-b", "main")
        git(repo, "-c", "user.name=b", "-c", "user.email=b@x", "add", "-A")
        git(repo, "-c", "user.name=b", "-c", "user.email=b@x", "commit", "-q", "-m", "fleet")

        cfg = config.load(str(repo), flags={"workspace_root": str(scratch / "local"), "namespace": "bench",
                                            "push": False, "parallel_machines": 32})
        desired = load_tree(repo)
        watch = sorted(set(names) | set(names_to_watch(desired, {})))
        fleet_names = [m["name"] for m in machines if m["name"] != "idle"]
        times, trips, seen = [], [], 0
        for _ in range(args.passes):
            pool = TransportPool(cfg, desired)
            t1 = time.perf_counter()
            world = observe(fleet_names, pool.get, watch, {}, time.time(), cfg.parallel_machines)
            times.append(time.perf_counter() - t1)
            pool.close()
            bad = [m.name + ": " + m.error for m in world.machines.values() if not m.reachable]
            if bad:
                print("unreachable:", bad, file=sys.stderr)
                return 1
            trips.append(max(m.round_trips for m in world.machines.values()))
            seen = sum(len(m.runs) for m in world.machines.values())
            alive = sum(1 for m in world.machines.values() for r in m.runs.values() if r.alive)

        # A full pass (load, observe 21 machines + local, plan, dry run) for scale.
        rec = Reconciler(cfg)
        t1 = time.perf_counter()
        rec.run_pass(dry_run=True)
        full = time.perf_counter() - t1
        # Reach the steady state: adopt the live runs, collect the finished ones, commit.
        t1 = time.perf_counter()
        rec.run_pass()
        warm_time = time.perf_counter() - t1
        t1 = time.perf_counter()
        steady = rec.run_pass()
        steady_time = time.perf_counter() - t1

        # Submitted → running on the idle machine.
        (repo / "specs" / "runs" / "fresh.yaml").write_text(
            yaml.safe_dump(run_doc("fresh", ["sh", "-c", "sleep 30"], target="idle")))
        git(repo, "-c", "user.name=b", "-c", "user.email=b@x", "add", "-A")
        git(repo, "-c", "user.name=b", "-c", "user.email=b@x", "commit", "-q", "-m", "fresh")
        found: list[float] = []
        stop = threading.Event()

        def watch_proc(t_start: float) -> None:
            while not stop.is_set():
                if process_with("fresh-g1-a1"):
                    found.append(time.perf_counter() - t_start)
                    return
                time.sleep(0.005)

        t1 = time.perf_counter()
        th = threading.Thread(target=watch_proc, args=(t1,), daemon=True)
        th.start()
        result = rec.run_pass()
        pass_time = time.perf_counter() - t1
        th.join(timeout=5)
        stop.set()
        latency = found[0] if found else float("nan")
        phase = next((c.phase for c in result.plan.changes if c.name == "fresh"), None)

        print(f"machines: {args.machines} over SSH on 127.0.0.2..127.0.0.{args.machines + 1} "
              f"(sshd start-up {started:.1f}s), {args.runs} workspaces each ({seen} seen, {alive} alive)")
        print(f"observe pass: median {statistics.median(times):.3f}s, min {min(times):.3f}s, max {max(times):.3f}s "
              f"over {len(times)} passes (fresh connections each)   target <= 2 s")
        print(f"round trips per machine per observe pass: {max(trips)}   target 1")
        print(f"full dry-run pass (load + observe {args.machines + 2} machines incl. local + plan): {full:.3f}s")
        print(f"first real pass (adopt {alive}, collect {seen - alive}, commit): {warm_time:.3f}s; "
              f"next pass (nothing to do, {len(steady.written)} written): {steady_time:.3f}s")
        print(f"submitted -> running on an idle machine: {latency:.3f}s (process seen), "
              f"pass {pass_time:.3f}s, phase {phase}   target <= 2 s")
        ok = max(trips) == 1 and statistics.median(times) <= 2.0 and latency <= 2.0
        return 0 if ok else 1
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, 9)
            except ProcessLookupError:
                pass
            p.wait()
        # the launched run: its group leader carries the identity
        for pid_file in remote.glob("idle/bench/*/runtime/pid"):
            try:
                os.killpg(int(pid_file.read_text()), 9)
            except (ValueError, ProcessLookupError, OSError):
                pass
        for s in servers:
            s.close()
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(remote, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

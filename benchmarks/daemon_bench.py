"""Benchmark: the daemon's reaction times, against a floor, and its memory with a large tree.

Starts the real daemon (``python -m reconciler --repo CLONE``) on a clone of a bare repository in a
scratch folder, and prints:

1. local change → process start, against its floor. A spec file is written into the daemon's
   checkout (atomically) until the run's wrapper has written its pid. The floor is a bare watcher
   in a process of its own: watchfiles with the daemon's own filter and step
   (reconciler/daemon/watch.py) on a tree of the same layout, that starts, for each spec file
   that appears, a process that writes its pid the way the launch wrapper does (new session,
   ``mkdir -p runtime artifacts``, pid written and renamed into place). The two alternate, R
   rounds, one trial each per round, the daemon left idle (its status pushed) before each trial;
   medians and p90 of both, their ratio, the CPU time each used, the load average, the cost of
   one file creation in the scratch folder before and after the trials and how many files and
   folders each makes before its pid (docs/benchmarks.md, "File creation"). The daemon runs
   with ``allow_dirty`` (a file written into its checkout is uncommitted: without it the run waits
   for a commit, see docs/loop.md);
2. a burst: B spec files written within a few milliseconds (as a ``git pull`` would) → the number
   of passes it took and when the first and the last process started;
3. push → webhook → process start: a user clone pushes a spec commit to the bare remote and POSTs a
   signed webhook; until the pid exists; median over R trials (target ≤ 2 s);
4. with S specs in the tree (default 10,000, ``desiredState: Stopped`` so nothing is launched):
   the first pass (writes and pushes S status files), then the steady pass duration (nothing
   changed), a local change → start latency in that tree, and the daemon's VmRSS/VmHWM (target
   ≤ 150 MB).

    python benchmarks/daemon_bench.py [--rounds 10] [--burst 50] [--specs 10000] [--skip-large]

Every process started here is killed at the end (the daemons and the floor by pid, the runs by
process group).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import hmac
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from tests import repo_helpers  # noqa: E402
from tests.infra._proc import free_port  # noqa: E402

import specgen  # noqa: E402
from specgen import TEMPLATE  # noqa: E402

SECRET = "bench-secret"
# The floor's process: what the launch wrapper does before its pid is there (scripts/launch.sh).
FLOOR_SH = 'cd "$1" && mkdir -p runtime artifacts && echo "$$" > runtime/pid.tmp && mv runtime/pid.tmp runtime/pid'


def run_spec(name: str, desired: str = "Running", i: int = 0) -> str:
    return specgen.run_spec(name, i, '[sh, -c, "echo hi; sleep 120"]', {"STEP": f'"{i}"'},
                            middle=f"  desiredState: {desired}\n", max_retries=1, backoff=5)


def git(cwd: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="Bench", GIT_AUTHOR_EMAIL="b@example.invalid",
               GIT_COMMITTER_NAME="Bench", GIT_COMMITTER_EMAIL="b@example.invalid")
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env, check=True).stdout.strip()


# Latencies are measured by polling: a short interval keeps the measurement error at ~2 ms.
wait_for = functools.partial(repo_helpers.wait_for, interval=0.002)


class Bench:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.ws = tmp / "ws"
        self.procs: list[subprocess.Popen] = []

    def setup(self, name: str, specs: int = 0) -> tuple[Path, Path, Path]:
        origin, user = self.tmp / f"{name}.git", self.tmp / f"{name}-user"
        git(self.tmp, "init", "-q", "--bare", "-b", "main", str(origin))
        git(self.tmp, "clone", "-q", str(origin), str(user))
        (user / "execution_templates").mkdir()
        (user / "execution_templates" / "local-host.yaml").write_text(TEMPLATE)
        runs = user / "specs" / "runs"
        runs.mkdir(parents=True)
        (runs / ".keep").write_text("")
        for i in range(specs):
            (runs / f"old-{i:05d}.yaml").write_text(run_spec(f"old-{i:05d}", "Stopped", i))
        (user / ".gitignore").write_text(".reconciler/\n")
        git(user, "add", "-A")
        git(user, "commit", "-q", "-m", "init")
        git(user, "push", "-q", "origin", "HEAD:main")
        clone = self.tmp / f"{name}-daemon"
        git(self.tmp, "clone", "-q", str(origin), str(clone))
        return origin, user, clone

    def start(self, clone: Path, port: int, log: Path, **env: str) -> subprocess.Popen:
        full = {k: v for k, v in os.environ.items() if not k.startswith("RECONCILER_") or k == "RECONCILER_LOG_LEVEL"}
        full.update(RECONCILER_WORKSPACE_ROOT=str(self.ws), RECONCILER_NAMESPACE="bench",
                    RECONCILER_LISTEN=f"127.0.0.1:{port}", RECONCILER_WEBHOOK_SECRET=SECRET,
                    RECONCILER_POLL_INTERVAL="300", RECONCILER_RESYNC_INTERVAL="300", RECONCILER_LOG_FORMAT="json",
                    RECONCILER_LOCAL_GPUS="0", RECONCILER_ALLOW_DIRTY="true", PYTHONPATH=str(ROOT))
        full.update(env)
        fh = open(log, "wb")
        p = subprocess.Popen([sys.executable, "-m", "reconciler", "--repo", str(clone)], cwd=ROOT, env=full,
                             stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        fh.close()
        self.procs.append(p)
        url = f"http://127.0.0.1:{port}/healthz"

        def healthy():
            if p.poll() is not None:
                raise RuntimeError(f"daemon exited: {log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_for(healthy, timeout=600, interval=0.1)
        return p

    def start_floor(self, root: Path, ws: Path) -> subprocess.Popen:
        for d in ("specs/runs", "execution_templates"):
            (root / d).mkdir(parents=True, exist_ok=True)
        p = subprocess.Popen([sys.executable, __file__, "--floor-watcher", str(root), str(ws)], cwd=ROOT,
                             stdin=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        self.procs.append(p)
        return p

    def pid_file(self, identity: str) -> Path:
        return self.ws / "bench" / identity / "runtime" / "pid"

    def started(self, identity: str) -> bool:
        return _has_pid(self.pid_file(identity))

    def cleanup(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        self.cleanup_root(self.ws / "bench")

    @staticmethod
    def cleanup_root(root: Path) -> None:
        if root.is_dir():
            for ws in root.iterdir():
                try:
                    os.killpg(int((ws / "runtime" / "pid").read_text()), signal.SIGKILL)
                except (OSError, ValueError):
                    pass


def _has_pid(path: Path) -> bool:
    try:
        return path.read_text().strip().isdigit()
    except OSError:
        return False


def floor_watcher(root: str, ws: str) -> int:
    """The floor: watchfiles with the daemon's filter and step, and one process per new spec file."""
    from watchfiles import watch

    from reconciler.daemon.watch import Filter, settings

    spec = Filter(root)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}
    children: list[subprocess.Popen] = []
    for changes in watch(root, watch_filter=spec, **settings(0.2)):
        for _, path in changes:
            dest = Path(ws) / Path(path).stem
            if not path.endswith(".yaml") or not os.path.isfile(path) or dest.exists():
                continue
            dest.mkdir(parents=True)
            children.append(subprocess.Popen(["sh", "-c", FLOOR_SH, "floor", str(dest)], env=env,
                                             start_new_session=True, stdin=subprocess.DEVNULL,
                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        children = [c for c in children if c.poll() is None]
    return 0


def warm(write, started, patience: float = 2.0) -> int:
    """Write spec files until the watcher behind them starts one (within ``patience`` seconds
    each); the number of the one it started."""
    for k in range(60):
        write(k)
        try:
            wait_for(lambda: started(k), timeout=patience, interval=0.01)
            return k
        except AssertionError:
            continue
    raise RuntimeError("the watcher never answered")


def _write_spec(root: Path, name: str) -> None:
    write_atomically(root / "specs" / "runs" / f"{name}.yaml", run_spec(name))


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def pushed(origin: Path, name: str) -> bool:
    return subprocess.run(["git", "--git-dir", str(origin), "cat-file", "-e", f"main:status/{name}.yaml"],
                          stderr=subprocess.DEVNULL).returncode == 0


def daemon_trial(b: Bench, clone: Path, origin: Path, name: str, i: int) -> float:
    t0 = time.perf_counter()
    write_atomically(clone / "specs" / "runs" / f"{name}.yaml", run_spec(name, i=i))
    wait_for(lambda: b.started(f"{name}-g1-a1"), timeout=120)
    took = time.perf_counter() - t0
    # Idle again before the next trial: the pass is over once its status reached the remote.
    wait_for(lambda: pushed(origin, name), timeout=60, interval=0.01)
    return took


def floor_trial(floor_root: Path, floor_ws: Path, name: str, i: int) -> float:
    t0 = time.perf_counter()
    write_atomically(floor_root / "specs" / "runs" / f"{name}.yaml", run_spec(name, i=i))
    wait_for(lambda: _has_pid(floor_ws / name / "runtime" / "pid"), timeout=120)
    return time.perf_counter() - t0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def machine() -> str:
    model = "?"
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{os.cpu_count()} x {model}"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def against_floor(b: Bench, rounds: int) -> tuple[Path, Path, Path, int]:
    """Section 1: the daemon and the floor, alternated; returns the daemon's repository and port."""
    origin, user, clone = b.setup("small")
    port = free_port()
    daemon = b.start(clone, port, b.tmp / "small.log")
    floor_root, floor_ws = b.tmp / "floor", b.tmp / "floor-ws"
    floor = b.start_floor(floor_root, floor_ws)
    # A first trial each, not counted: a watcher is up once it answered (a file written before it
    # watched is never seen, so write another until one is).
    warm(lambda k: _write_spec(floor_root, f"warm{k}"),
         lambda k: _has_pid(floor_ws / f"warm{k}" / "runtime" / "pid"))
    # Twice: a fresh clone holds new identities for one launch TTL after its first pass once the
    # repository has statuses (docs/loop.md, "Identities"); the second warm-up waits that out.
    for prefix in ("warm", "warmer"):
        k = warm(lambda k: _write_spec(clone, f"{prefix}{k}"), lambda k: b.started(f"{prefix}{k}-g1-a1"), 40.0)
        wait_for(lambda: pushed(origin, f"{prefix}{k}"), timeout=60, interval=0.01)
    print(f"machine: {machine()}; load average before: {load()}")
    made = creation_cost(b.tmp / "made-before")
    cpu0 = cpu_seconds(daemon.pid), cpu_seconds(floor.pid)
    lat: dict[str, list[float]] = {"daemon": [], "floor": []}
    for r in range(rounds):
        order = ("daemon", "floor") if r % 2 == 0 else ("floor", "daemon")
        for who in order:
            name = f"local{r}"
            if who == "daemon":
                lat[who].append(daemon_trial(b, clone, origin, name, r + 1))
            else:
                lat[who].append(floor_trial(floor_root, floor_ws, name, r + 1))
    cpu = cpu_seconds(daemon.pid) - cpu0[0], cpu_seconds(floor.pid) - cpu0[1]
    waited = [e["waited"] for e in _events(b.tmp / "small.log", "pass")
              if e.get("waited") is not None and "local change" in (e.get("why") or "")]
    print(f"local spec change → process start, {rounds} rounds alternated (load average after: {load()})")
    print(f"  daemon: {fmt(lat['daemon'])}  (target ≤ 1000 ms)")
    print(f"  floor:  {fmt(lat['floor'])}  (watchfiles, same filter and step, + one process)")
    print(f"  ratio daemon/floor: median {statistics.median(lat['daemon']) / statistics.median(lat['floor']):.2f}x, "
          f"p90 {p90(lat['daemon']) / p90(lat['floor']):.2f}x  (target ≤ 1.5x)")
    print(f"  CPU: daemon {cpu[0] / rounds * 1000:.0f} ms per change (the whole pass: launch, status, commit, "
          f"push), floor {cpu[1] / rounds * 1000:.0f} ms")
    if waited:
        print(f"  the daemon's request → pass start: median {statistics.median(waited) * 1000:.1f} ms "
              f"(max {max(waited) * 1000:.1f} ms, n={len(waited)})")
    ws = b.ws / "bench" / f"local{rounds - 1}-g1-a1"
    print(f"  file creation in the scratch folder: {made:.3f} ms per file before the trials, "
          f"{creation_cost(b.tmp / 'made-after'):.3f} ms after; files and folders on the way to the pid: "
          f"daemon {on_the_way(ws)}, floor 4 (docs/benchmarks.md, \"File creation\")")
    return origin, user, clone, port


def creation_cost(folder: Path, n: int = 32) -> float:
    """Median milliseconds to create and write one small file in ``folder`` (new). On ext4
    without a journal it grows with the files deleted nearby in the last minutes (the kernel's
    ``recently_deleted`` in fs/ext4/ialloc.c), so a ratio is read beside it. The files are left
    for the scratch folder's removal: deleting them here would raise the cost it measures."""
    folder.mkdir()
    took = []
    for i in range(n):
        t0 = time.perf_counter()
        fd = os.open(folder / f"f{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, b"x" * 512)
        os.close(fd)
        took.append(time.perf_counter() - t0)
    return statistics.median(took) * 1000


def on_the_way(ws: Path) -> int:
    """Files and folders of a launched workspace that exist before its pid does: the bundle, the
    launch's records and the workspace's claim beside it (what the wrapper writes after its pid:
    started_at, child.pid, runtime.log and the job's logs, left out)."""
    after = {"started_at", "child.pid", "runtime.log", "stdout.log", "stderr.log", "logs.index", "nvml-audit.jsonl"}
    if not ws.is_dir():
        return 0
    inside = sum(1 for p in ws.rglob("*") if p.name not in after)
    return 1 + inside + (ws.parent / f".{ws.name}.claim").exists()


def burst(b: Bench, clone: Path, origin: Path, port: int, n: int) -> None:
    """Section 2: n spec files written as fast as possible; how many passes, when they started."""
    before = metrics(port)["reconciler_pass_duration_seconds_count"]
    names = [f"burst{i:03d}" for i in range(n)]
    t0 = time.perf_counter()
    for i, name in enumerate(names):
        write_atomically(clone / "specs" / "runs" / f"{name}.yaml", run_spec(name, i=i))
    wrote = time.perf_counter() - t0
    first = None
    left = set(names)
    while left:
        left = {x for x in left if not b.started(f"{x}-g1-a1")}
        if first is None and len(left) < n:
            first = time.perf_counter() - t0
        if time.perf_counter() - t0 > 300:
            raise AssertionError(f"{len(left)} burst runs never started")
        time.sleep(0.002)
    last = time.perf_counter() - t0
    wait_for(lambda: all(pushed(origin, x) for x in names[-1:]), timeout=120, interval=0.05)
    time.sleep(1.0)  # a second pass, if one were coming, would have started by now
    passes = metrics(port)["reconciler_pass_duration_seconds_count"] - before
    print(f"burst of {n} spec files written in {wrote * 1000:.0f} ms: {int(passes)} pass(es); first process "
          f"after {first * 1000:.0f} ms, the last after {last * 1000:.0f} ms")


def _events(log: Path, msg: str) -> list[dict]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("msg") == msg:
            out.append(e)
    return out


def webhook_latency(b: Bench, origin: Path, user: Path, port: int, trials: int) -> list[float]:
    out = []
    for i in range(trials):
        name = f"hook{i}"
        git(user, "pull", "-q", "--rebase", "origin", "main")  # the daemon pushed status meanwhile
        (user / "specs" / "runs" / f"{name}.yaml").write_text(run_spec(name, i=i))
        git(user, "add", "-A")
        git(user, "commit", "-q", "-m", f"add {name}")
        for _ in range(10):  # a status push may land between the pull and the push: pull again
            t0 = time.perf_counter()
            if subprocess.run(["git", "push", "-q", "origin", "HEAD:main"], cwd=user, capture_output=True).returncode == 0:
                break
            git(user, "pull", "-q", "--rebase", "origin", "main")
        # Each delivery has its own id and body, as GitHub's do (the daemon refuses replays).
        body = json.dumps({"ref": "refs/heads/main", "after": git(user, "rev-parse", "HEAD")}).encode()
        sig = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/hooks/git", data=body, method="POST",
                                     headers={"X-Hub-Signature-256": sig, "X-GitHub-Event": "push",
                                              "X-GitHub-Delivery": str(uuid.uuid4())})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 202
        wait_for(lambda: b.started(f"{name}-g1-a1"), timeout=120)
        out.append(time.perf_counter() - t0)
        # Let the status push land before the next trial, so the user's next push is not rejected.
        wait_for(lambda: pushed(origin, name), timeout=60, interval=0.02)
    return out


def metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            out[k] = float(v.replace("+Inf", "inf"))
    return out


def mem(pid: int) -> dict[str, float]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            k, v = line.split(":")
            out[k] = int(v.split()[0]) / 1024
    return out


def p90(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.9 * (len(xs) - 1))))]


def fmt(xs: list[float]) -> str:
    return (f"median {statistics.median(xs) * 1000:.0f} ms, p90 {p90(xs) * 1000:.0f} ms, "
            f"max {max(xs) * 1000:.0f} ms (n={len(xs)})")


def large(b: Bench, specs: int) -> None:
    t0 = time.perf_counter()
    origin, user, clone = b.setup("large", specs)
    print(f"\n{specs} specs generated and pushed in {time.perf_counter() - t0:.1f} s")
    port = free_port()
    t0 = time.perf_counter()
    p = b.start(clone, port, b.tmp / "large.log", RECONCILER_RESYNC_INTERVAL="1")
    m = metrics(port)
    print(f"daemon start → first good pass (writes {specs} status files): "
          f"{time.perf_counter() - t0:.1f} s (pass {m['reconciler_pass_duration_seconds_sum']:.1f} s)")
    # The second pass may rewrite every status once more (see the report); measure after it.
    n = m["reconciler_pass_duration_seconds_count"]
    wait_for(lambda: metrics(port)["reconciler_pass_duration_seconds_count"] >= n + 1, timeout=300, interval=0.2)
    m = metrics(port)
    first = (m["reconciler_pass_duration_seconds_sum"], m["reconciler_pass_duration_seconds_count"])
    wait_for(lambda: metrics(port)["reconciler_pass_duration_seconds_count"] >= first[1] + 5, timeout=300,
             interval=0.2)
    m = metrics(port)
    steady = (m["reconciler_pass_duration_seconds_sum"] - first[0]) / \
        (m["reconciler_pass_duration_seconds_count"] - first[1])
    print(f"steady pass over {specs} unchanged specs: {steady * 1000:.0f} ms (mean of "
          f"{int(m['reconciler_pass_duration_seconds_count'] - first[1])})")
    lat = []
    for i in range(5):
        lat.append(daemon_trial(b, clone, origin, f"big{i}", i))
    print(f"local spec change → process start with {specs} specs: {fmt(lat)}")
    info = mem(p.pid)
    print(f"daemon memory with {specs} specs: VmRSS {info['VmRSS']:.0f} MB, peak VmHWM "
          f"{info['VmHWM']:.0f} MB  (target ≤ 150 MB)")


# The pass's steps timed by --phases, in the order a launching pass reaches them: (module, attribute, label).
STEPS = (("reconciler.engine.loop", "load_tree", "load specs"),
         ("reconciler.engine.uncommitted", "Uncommitted.prefetch", "git status -- specs: its start"),
         ("reconciler.engine.loop", "Reconciler._observe_world", "observe"),
         ("reconciler.engine.loop", "make_plan", "plan"),
         ("reconciler.engine.uncommitted", "Uncommitted.specs", "git status -- specs: its answer"),
         ("reconciler.engine.guards", "before_apply", "launch holds"),
         ("reconciler.engine.inflight", "Journal.issue", "launch journal: issue"),
         ("reconciler.artifacts.bundle", "build", "bundle build"),
         ("reconciler.machines.local_launch", "start_host", "launch (in-process)"),
         ("reconciler.machines.local_launch", "wait_for_pid", "  of which: the wrapper until its pid"),
         ("reconciler.engine.inflight", "Journal.answered", "launch journal: answered"),
         ("reconciler.engine.guards", "after_apply", "after the launches: journal, full look"),
         ("reconciler.engine.loop", "Reconciler._write_statuses", "status files"),
         ("reconciler.engine.loop", "Reconciler._commit", "commit"))


def phases(tmp: Path, n: int) -> None:
    """Section 5 (--phases N): where a change-driven pass spends its time, in-process: a
    ``Reconciler`` as the daemon keeps it, N spec files added one per pass, each step timed by
    wrapping it (a step renamed since is left out and said so)."""
    import importlib

    origin, _, clone = Bench(tmp).setup("phases")
    os.environ.update(RECONCILER_WORKSPACE_ROOT=str(tmp / "ws-phases"), RECONCILER_NAMESPACE="bench",
                      RECONCILER_LOCAL_GPUS="0", RECONCILER_LAUNCH_TTL="2")
    from reconciler.core import config as configs
    from reconciler.engine.loop import Reconciler

    spans: dict[str, list[tuple[float, float]]] = {}
    for mod, attr, label in STEPS:
        owner = importlib.import_module(mod)
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        if not hasattr(owner, name):
            print(f"  (not timed: {mod}.{attr} is gone)")
            continue
        setattr(owner, name, _timed(getattr(owner, name), spans.setdefault(label, [])))
    cfg = configs.load(str(clone), None, {"allow_dirty": True, "commit": True})
    rec = Reconciler(cfg, keep_connections=True)
    _write_spec(clone, "first")
    rec.run_pass()
    # Past the fresh process's hold of new identities (launch_ttl, set short here, and its margin).
    time.sleep(getattr(cfg, "launch_ttl", 0) + getattr(cfg, "launch_clock_margin", 0) + 0.5)
    for s in spans.values():
        s.clear()
    started: list[tuple[float, str]] = []
    _count_processes(started)
    passes = []
    for i in range(n):
        _write_spec(clone, f"phase{i}")
        t0, c0 = time.perf_counter(), time.process_time()
        rec.run_pass()
        passes.append((t0, time.perf_counter(), time.process_time() - c0))
    print(f"\none change-driven pass, in-process, median of {n} (load average {load()}):")
    print(f"  {'':40s} {'wall':>9s} {'CPU':>9s}")
    launch = spans.get("launch (in-process)") or []
    if len(launch) == n:
        print(f"  {'pass start → launch begins':40s} {statistics.median(l[0] - p[0] for l, p in zip(launch, passes)) * 1000:6.1f} ms")
        before = [[w for t, w in started if p[0] <= t < l[0]] for l, p in zip(launch, passes)]
        after = [[w for t, w in started if l[0] <= t < p[1]] for l, p in zip(launch, passes)]
        print(f"  processes started before the launch: {statistics.median(len(b) for b in before)} "
              f"({'; '.join(before[-1]) or 'none'}), by the launch and after it: "
              f"{statistics.median(len(a) for a in after)} ({'; '.join(after[-1])})")
    for label, s in spans.items():
        if s:
            print(f"  {label:40s} {statistics.median(x[1] - x[0] for x in s) * 1000:6.1f} ms "
                  f"{statistics.median(x[2] for x in s) * 1000:6.1f} ms  (n={len(s)})")
    print(f"  {'the whole pass':40s} {statistics.median(x[1] - x[0] for x in passes) * 1000:6.1f} ms "
          f"{statistics.median(x[2] for x in passes) * 1000:6.1f} ms")
    Bench(tmp).cleanup_root(tmp / "ws-phases" / "bench")


def _timed(fn, out: list):
    @functools.wraps(fn)
    def timed(*args, **kwargs):
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            out.append((t0, time.perf_counter(), time.process_time() - c0))
    return timed


def _count_processes(out: list) -> None:
    """Record every process this one starts (when, and its first words): each fork and exec
    competes for the cores on the way to the launch."""
    real = subprocess.Popen._execute_child

    @functools.wraps(real)
    def counted(self, args, *rest, **kw):
        out.append((time.perf_counter(), " ".join(str(a) for a in list(args)[:4])))
        return real(self, args, *rest, **kw)
    subprocess.Popen._execute_child = counted


def main() -> int:
    if sys.argv[1:2] == ["--floor-watcher"]:
        return floor_watcher(sys.argv[2], sys.argv[3])
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", "--trials", type=int, default=10, help="trials of each kind")
    ap.add_argument("--burst", type=int, default=50, help="spec files in the burst (0: none)")
    ap.add_argument("--specs", type=int, default=10_000)
    ap.add_argument("--skip-large", action="store_true")
    ap.add_argument("--skip-small", action="store_true")
    ap.add_argument("--phases", type=int, default=0, help="time the steps of N change-driven passes in-process")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="daemon-bench-"))
    b = Bench(tmp)
    try:
        if not args.skip_small:
            origin, user, clone, port = against_floor(b, args.rounds)
            if args.burst:
                burst(b, clone, origin, port, args.burst)
            hook = webhook_latency(b, origin, user, port, args.rounds)
            print(f"push → webhook → process start: {fmt(hook)}  (target ≤ 2000 ms)")
            b.cleanup()
            b.procs.clear()
        if args.phases:
            phases(tmp, args.phases)
        if not args.skip_large:
            large(b, args.specs)
        return 0
    finally:
        b.cleanup()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp}")


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Rental soak: the real daemon renting machines while rentals die, providers fail and limits move.

    python benchmarks/rental_soak.py --seconds 600 --seed 1 [--workdir DIR] [--keep] [--json]

Why: docs/rentals.md promises that no rental outlives the need for it, that one run identity is
never on two rentals, and that a run never has two attempts alive, whatever happens to the
machines, the providers and the reconciler. Tests check each case once; this script checks them
together, for minutes, with the faults landing at moments nobody chose.

The set-up (one scratch folder; git talks to a bare repository on disk, every server listens on
loopback only):

- ``origin.git`` and ``user/``: the remote and the clone where the script plays the ML team
  (each change a commit pushed after rebasing on the daemon's status commits);
- the daemon: the real command (``python -m reconciler --repo CHECKOUT``), short intervals,
  JSON logs in ``logs/``, restarted after each kill in the same checkout or on a fresh clone;
- provider ``local``: the embedded provider, each rental a real sshd on 127.0.0.1 under a unix
  user of its own (``rcl…``), its records in ``local-provider/``; a few provisionings fail;
- provider ``lambda``: a FAKE of Lambda Cloud's API (tests/fakes/lambdacloud.py, run in this
  process; no real provider can be reached from here) whose instances are real sshd servers,
  each on a loopback address of its own in 127.(70 + seed).0.0/16, logging in as ``rcsoakl``;
- the runs: ``sh -c 'sleep N; exit K'`` with N in 3-15 s, ``maxRetries`` 0-2, one in three on
  the fake Lambda, the rest on the local provider.

Faults, picked by a seeded RNG (one seed gives the same sequence of choices; the moments they
land on are the machine's own):

- ``kill_daemon``: ``kill -9`` of the daemon, restarted 0.2-2 s later, half the time on a fresh
  clone (its ``.reconciler/`` state, the adapters' name books included, left behind);
- ``dead_listed``: a running rental's sshd and every process of the machine killed while the
  provider still lists it running (a machine that died; only the grace can tell);
- ``evaporate``: a running rental dropped from the provider's listing with everything on it;
- ``api_5xx``, ``api_429``, ``api_timeout``, ``lost_create``: the fake answers the next calls
  with 500/502/503, or 429 (with or without ``Retry-After``), or closes the connection without
  an answer, or carries out the next launch and loses its answer (a 502 or a dropped connection);
- ``edit``, ``add``, ``remove``: a run's command changed (a new generation), a run added, removed;
- ``limits``, ``max_cost``, ``idle``: a provider's ``maxMachines``, ``maxPricePerHour`` or
  ``budget`` set low or lifted, a run's ``maxCost`` set to 0 or lifted, a provider's ``idle`` 0
  or a few seconds (warm rentals reused by the next run).

The referee, two processes of its own at real-time priority (in the soak's process, behind the
fake API, git and the faults, it sampled late; each sleeps between samples):

- the rental sampler reads both providers' live rentals every ``RENTAL_EVERY`` s (the local
  provider's records on disk, the fake's instance table as it publishes it after each change):
  ``two_rentals`` when one run identity has two live rentals (provisioning or running) at one
  sample;
- the attempts sampler of benchmarks/soak.py (every process's ``RECONCILER_IDENTITY``, every
  40 ms here, under the rentals' workspaces): ``two_attempts`` when two attempts of one run are
  alive at once, for any time at all;
- at the end the faults stop, every limit is lifted, and the daemon must converge (each run
  Succeeded, Failed or Terminated for its current spec, no rental left at either provider):
  ``leaked`` counts the rentals still there after ``CONVERGE_TIMEOUT``, ``not_converged`` the
  runs not done; ``daemon_crash`` a daemon that exited by itself.

Exit status: 0 with no violation, 1 with violations, 2 when the harness itself failed. Everything
it started is ended at the end (rentals through the providers, servers, the daemon). The scratch
folder is removed unless ``--workdir`` or ``--keep`` was given, or a violation was found.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import soak  # noqa: E402  (re-executes under .venv when needed)
import yaml  # noqa: E402
from soak import ROOT, AttemptsSampler, Git, HarnessError, LogTail, bind_reconciler  # noqa: E402

# ---------------------------------------------------------------- settings

POLL_INTERVAL, RESYNC_INTERVAL, TERMINATE_GRACE = 0.5, 1.0, 2.0
UNREACHABLE_GRACE = 6.0  # a dead-but-listed rental's run is lost after this
ORPHAN_GRACE = 20.0  # provider orphanGrace: an unclaimed rental of ours goes back after this
PROVISION_TIMEOUT = 30.0
RENTAL_EVERY = 0.025  # the rental sampler's period: well inside 50 ms, on a loaded machine too
# The attempts sampler of benchmarks/soak.py, at 40 ms rather than its 20: two soaks share two cores
# here with the daemons they referee, and a sampler that takes the daemon's CPU changes what it sees.
soak.ATTEMPTS_EVERY = 0.04
CONVERGE_TIMEOUT = 240.0
LIVE = ("provisioning", "running")
LAMBDA_USER = "rcsoakl"  # the fake Lambda machines' login: an account of its own
LAMBDA_KEY = "soak-lambda-key"

FAULTS = {"kill_daemon": 0.6, "dead_listed": 0.7, "evaporate": 0.7, "api_5xx": 0.5, "api_429": 0.5,
          "api_timeout": 0.4, "lost_create": 0.5, "edit": 1.0, "add": 1.2, "remove": 0.5, "limits": 1.0,
          "max_cost": 0.4, "idle": 0.3}
VIOLATIONS = ("two_rentals", "two_attempts", "leaked", "not_converged", "daemon_crash")

TEMPLATE = """\
apiVersion: reconciler/v1
kind: ExecutionTemplate
id: rental-{provider}
description: A rental from the {provider} provider, host processes (the rental soak's runs).
placement: {{kind: rental}}
launch_mode: {{kind: host_process}}
defaults:
  target: {provider}
  runtime_env: {{RECONCILER_GPU_SAMPLER: "0"}}
allow_overrides: [resources, runtime_env]
"""


def pctl(values: list[float], q: float) -> float:
    v = sorted(values) or [0.0]
    return v[int(q * (len(v) - 1))]


def identity_of(full_name: str | None) -> str | None:
    """The run identity in a rental's full name ``rc-<ns>--<identity>-x<n>``."""
    if not full_name or "--" not in full_name:
        return None
    ident, _, n = full_name.split("--", 1)[1].rpartition("-x")
    return ident if ident and n.isdigit() else None


# ---------------------------------------------------------------- the fake Lambda


def fake_lambda(scratch: Path, seed: int):
    """Lambda's API as a FAKE (tests/fakes/lambdacloud.py): instances on addresses of their own,
    in a /16 of the seed's (two soaks side by side never hand out the same address)."""
    net = f"127.{70 + seed % 100}"
    from tests.fakes.lambdacloud import FakeLambda
    from tests.infra._proc import free_port
    from tests.infra.sshd import ensure_test_user

    class SoakLambda(FakeLambda):
        table = scratch / "table.json"  # what the referee (another process) reads of the instances
        table_lock = threading.Lock()

        def next_ip(self) -> str:
            n = self.ip_seq
            self.ip_seq += 1
            return f"{net}.{(n // 250) % 250}.{n % 250 + 1}"

        def route(self, method, path, query, body):
            try:
                return super().route(method, path, query, body)
            finally:
                self.publish()

        def evaporate(self, machine_id: str) -> None:
            try:
                super().evaporate(machine_id)
            finally:
                self.publish()

        def publish(self) -> None:
            """The instance table as the referee sees it, written whole (a rename) after each change."""
            with self.table_lock:
                rows = []
                for r in list(self.machines.values()):
                    tags = {t.get("key"): t.get("value") for t in r.get("tags") or []}
                    rows.append([r["id"], tags.get("rc-rental"), r["status"]])
                tmp = self.table.with_suffix(".tmp")
                tmp.write_text(json.dumps(rows))
                os.replace(tmp, self.table)

    ensure_test_user(LAMBDA_USER)
    scratch.mkdir(parents=True, exist_ok=True)
    fake = SoakLambda(scratch, token=LAMBDA_KEY, delay=0.5, ssh_port=free_port(f"{net}.0.1"), rate_limits=False)
    fake.ip_seq = 0
    fake.ssh_user = LAMBDA_USER
    fake.publish()
    return fake.start()


def machine_pids(uid: int | None = None, ssh_ip: str | None = None) -> list[int]:
    """Processes of one machine: those of its own login (``uid``), or those started through its
    sshd (``SSH_CONNECTION`` names its address: the fake Lambda's machines share one login)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            owner = os.stat(f"/proc/{entry}").st_uid
            if uid is not None and owner == uid:
                out.append(int(entry))
            elif ssh_ip is not None and owner == pwd.getpwnam(LAMBDA_USER).pw_uid:
                env = Path(f"/proc/{entry}/environ").read_bytes()
                for item in env.split(b"\0"):
                    if item.startswith(b"SSH_CONNECTION=") and item.split()[2:3] == [ssh_ip.encode()]:
                        out.append(int(entry))
        except (OSError, KeyError):
            continue
    return out


def kill_pids(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


# ---------------------------------------------------------------- the referee


def lambda_state(status: str) -> str:
    return {"booting": "provisioning", "active": "running"}.get(status, status)


def local_rentals(state: Path) -> list[tuple[str, str, str | None, str]]:
    """(provider, id, full name, state) of the local provider's rentals, from its records."""
    out = []
    for d in state.glob("lr-*"):
        try:
            m = json.loads((d / "meta.json").read_text())
            out.append(("local", m["id"], m.get("name"), m.get("state", "")))
        except (OSError, ValueError, KeyError):
            continue
    return out


def table_rentals(table: Path) -> list[tuple[str, str, str | None, str]]:
    """The same of the fake Lambda's instances, from the table it publishes."""
    try:
        return [("lambda", i, name, lambda_state(status)) for i, name, status in json.loads(table.read_text())]
    except (OSError, ValueError, TypeError):
        return []


class RentalSampler(threading.Thread):
    """Every ``RENTAL_EVERY`` s: the live rentals of both providers, by run identity; one identity
    with two live rentals at one sample is a violation (``two_rentals``)."""

    def __init__(self, rentals, report):
        super().__init__(name="rental-sampler", daemon=True)
        self.rentals, self.report = rentals, report
        self.halt = threading.Event()
        self.samples = 0
        self.gaps: list[float] = []
        self.seen: dict[str, set[str]] = {"local": set(), "lambda": set()}
        self.max_live = 0
        self.open: dict[str, float] = {}
        self.episodes: list[dict] = []

    def run(self) -> None:
        last = None
        while not self.halt.is_set():
            t = time.time()
            by_ident: dict[str, set[str]] = {}
            for provider, rid, name, state in self.rentals():
                self.seen[provider].add(rid)
                ident = identity_of(name)
                if state in LIVE and ident:
                    by_ident.setdefault(ident, set()).add(f"{provider}/{rid}")
            now = time.time()
            if last is not None:
                self.gaps.append(now - last)
            last = now
            self.samples += 1
            self.max_live = max(self.max_live, sum(len(v) for v in by_ident.values()))
            for ident, ids in by_ident.items():
                if len(ids) > 1 and ident not in self.open:
                    self.open[ident] = now
                    self.report("two_rentals", f"{ident} on {sorted(ids)}")
            for ident in [i for i in self.open if len(by_ident.get(i, ())) < 2]:
                self.episodes.append({"identity": ident, "seconds": round(now - self.open.pop(ident), 3)})
            self.halt.wait(max(0.0, RENTAL_EVERY - (time.time() - t)))

    def figures(self) -> dict:
        return {"samples": self.samples, "period_p50_ms": round(1000 * statistics.median(self.gaps or [0]), 1),
                "period_p99_ms": round(1000 * pctl(self.gaps, 0.99), 1),
                "period_max_ms": round(1000 * max(self.gaps or [0]), 1), "max_live_rentals": self.max_live,
                "rentals_local": len(self.seen["local"]), "rentals_lambda": len(self.seen["lambda"]),
                "two_rental_episodes": len(self.episodes) + len(self.open)}


def referee(config: Path, part: str) -> int:
    """One sampler of the referee in a process of its own (``part``: rentals or attempts), at a
    higher priority than the rest. The soak's process serves the fake API, drives git and kills
    machines, and a sampler sharing its interpreter lock, or a loaded machine's run queue, would
    sample when it can rather than when it should. It runs until SIGTERM, then writes what it saw."""
    cfg = json.loads(config.read_text())
    violations: list[list] = []
    try:
        # A real-time task wakes on time on a machine whose run queue is long; it sleeps between
        # samples (a few small files, or one scan of /proc), and the kernel's real-time throttling
        # keeps even a runaway one to 95 % of a core (sched_rt_runtime_us).
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except (OSError, AttributeError):
        pass

    def report(kind: str, detail: str) -> None:
        violations.append([round(time.time() - cfg["t0"], 1), kind, detail])
        print(f"rental-soak referee: VIOLATION {kind}: {detail}", file=sys.stderr, flush=True)

    if part == "rentals":
        local, table = Path(cfg["local_state"]), Path(cfg["lambda_table"])
        sampler = RentalSampler(lambda: local_rentals(local) + table_rentals(table), report)
    else:
        sampler = AttemptsSampler(cfg["roots"], lambda ident: not ident.startswith(cfg["prefix"]), lambda: False,
                                  lambda ep: report("two_attempts", f"{ep['run']}: {ep['identities']} for "
                                                                    f"{ep['end'] - ep['start']:.3f}s"))
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    sampler.start()
    out = Path(cfg["out"] + f".{part}")
    Path(f"{out}.ready").touch()
    while not done.wait(0.2):
        pass
    sampler.halt.set()
    sampler.join(5)
    out.write_text(json.dumps({"figures": sampler.figures(), "violations": violations}))
    return 0


# ---------------------------------------------------------------- the soak


class RentalSoak:
    def __init__(self, seconds: float, seed: int, workdir: Path | None, progress: bool = True):
        bind_reconciler(ROOT)
        self.seconds, self.seed, self.progress = seconds, seed, progress
        self.rng = random.Random(seed)
        # Names of the seed's own: two soaks side by side never take each other's runs for theirs.
        self.prefix, self.namespace = f"rs{seed}-", f"rsoak{seed}"
        self.work = Path(workdir or tempfile.mkdtemp(prefix="rental-soak-")).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.origin, self.user, self.logs = self.work / "origin.git", self.work / "user", self.work / "logs"
        self.local_state = self.work / "local-provider"
        (self.work / "home").mkdir(exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        self.git = Git(self.work / "home")
        self.lock = threading.Lock()
        self.t0 = time.time()
        self.figures: Counter = Counter()
        self.violations: Counter = Counter({k: 0 for k in VIOLATIONS})
        self.details: list[str] = []
        self.runs: dict[str, dict] = {}  # name → the run's spec values (removed runs are dropped)
        self.providers: dict[str, dict] = {}  # name → the Provider document as pushed
        self.next_name = 1
        self.proc: subprocess.Popen | None = None
        self.checkout: Path | None = None
        self.n_daemons = self.n_checkouts = 0
        self.restart_at: float | None = None
        self.restart_fresh = False
        self.fake = None
        self.remote_root = Path(tempfile.mkdtemp(prefix="rental-soak-ws-", dir="/tmp"))
        os.chmod(self.remote_root, 0o1777)  # the fake Lambda's login makes its workspaces in it

    # ------------------------------------------------------------ bookkeeping

    def now(self) -> float:
        return time.time() - self.t0

    def say(self, text: str) -> None:
        if self.progress:
            print(f"rental-soak [{self.now():6.1f}s] {text}", file=sys.stderr, flush=True)

    def violation(self, kind: str, detail: str) -> None:
        with self.lock:
            self.violations[kind] += 1
            self.details.append(f"[{self.now():7.1f}s] {kind}: {detail}")
        self.say(f"VIOLATION {kind}: {detail}")

    # ------------------------------------------------------------ what the providers hold

    def local_records(self) -> list[dict]:
        out = []
        for d in self.local_state.glob("lr-*"):
            try:
                out.append(json.loads((d / "meta.json").read_text()))
            except (OSError, ValueError):
                continue
        return out

    def lambda_records(self) -> list[dict]:
        for _ in range(20):  # the fake's HTTP threads change the table as it is read
            try:
                return [dict(r) for r in list(self.fake.machines.values())]
            except RuntimeError:
                continue
        return []

    def rentals(self) -> list[tuple[str, str, str | None, str]]:
        """(provider, id, full name, state) of every rental either provider lists."""
        out = local_rentals(self.local_state)
        for r in self.lambda_records():
            tags = {t.get("key"): t.get("value") for t in r.get("tags") or []}
            out.append(("lambda", r["id"], tags.get("rc-rental"), lambda_state(r["status"])))
        return out

    # ------------------------------------------------------------ specs

    def provider_doc(self, name: str, **spec) -> dict:
        if name == "local":
            body = {"type": "local", "offers": [{"id": "cpu-small", "cpu_count": 1, "memory_gb": 1,
                                                 "price_per_hour": 0.1}],
                    "local": {"stateDir": str(self.local_state), "failureRate": 0.05, "seed": self.seed}}
        else:
            key = self.work / "id_lambda"
            if not key.exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
            body = {"type": "lambda", "endpoint": self.fake.url + "/api/v1", "credentials": "LAMBDA_API_KEY",
                    "rateLimit": {"requestsPerSecond": 20, "burst": 10},
                    "offers": [{"id": "a10", "resource": "gpu_1x_a10", "region": "us-east-1", "gpu_count": 0,
                                "price_per_hour": 1.29}],
                    "ssh": {"user": LAMBDA_USER, "port": self.fake.ssh_port, "identity_file": str(key),
                            "workspace_root": str(self.remote_root / "lambda")}}
        body.update(orphanGrace=ORPHAN_GRACE, provisionTimeout=PROVISION_TIMEOUT, idle=0)
        body.update(spec)
        return {"apiVersion": "reconciler/v1", "kind": "Provider", "metadata": {"name": name}, "spec": body}

    def write_provider(self, doc: dict) -> None:
        self.providers[doc["metadata"]["name"]] = doc
        path = self.user / "specs" / "providers" / f"{doc['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))

    def run_text(self, r: dict) -> str:
        spec = {"template": f"rental-{r['provider']}",
                "task": {"type": "command", "argv": ["sh", "-c", f"sleep {r['sleep']}; exit {r['exit']}"]},
                "restartPolicy": {"maxRetries": r["retries"], "backoffSeconds": 1}}
        if r.get("maxCost") is not None:
            spec["maxCost"] = r["maxCost"]
        return yaml.safe_dump({"apiVersion": "reconciler/v1", "kind": "Run", "metadata": {"name": r["name"]},
                               "spec": spec}, sort_keys=False)

    def write_run(self, r: dict) -> None:
        self.runs[r["name"]] = r
        (self.user / "specs" / "runs" / f"{r['name']}.yaml").write_text(self.run_text(r))

    def new_run(self) -> dict:
        name = f"{self.prefix}{self.next_name:03d}"
        self.next_name += 1
        return {"name": name, "provider": "lambda" if self.rng.random() < 1 / 3 else "local",
                "sleep": self.rng.randint(3, 15), "exit": self.rng.choice([0, 0, 1]),
                "retries": self.rng.randint(0, 2)}

    def push(self, message: str) -> None:
        g = self.git
        g(self.user, "add", "-A")
        if not g(self.user, "status", "--porcelain"):
            return
        g(self.user, "commit", "-q", "-m", message)
        for attempt in range(40):
            if g.run(self.user, "pull", "-q", "--rebase", "origin", "main").returncode != 0:
                g.run(self.user, "rebase", "--abort")
            if g.run(self.user, "push", "-q", "origin", "HEAD:main").returncode == 0:
                self.figures["user_pushes"] += 1
                return
            time.sleep(0.05 * attempt)
        raise HarnessError("the user's push kept being rejected")

    def setup(self) -> None:
        g = self.git
        self.fake = fake_lambda(self.work / "lambda", self.seed)
        g(self.work, "init", "-q", "--bare", "-b", "main", str(self.origin))
        g(self.work, "clone", "-q", str(self.origin), str(self.user))
        for d in ("execution_templates", "specs/runs", "specs/providers"):
            (self.user / d).mkdir(parents=True)
        for p in ("local", "lambda"):
            (self.user / "execution_templates" / f"rental-{p}.yaml").write_text(TEMPLATE.format(provider=p))
            self.write_provider(self.provider_doc(p))
        (self.user / ".gitignore").write_text(".reconciler/\n")
        for _ in range(5):
            self.write_run(self.new_run())
        g(self.user, "add", "-A")
        g(self.user, "commit", "-q", "-m", "rental soak: providers and first runs")
        g(self.user, "push", "-q", "origin", "HEAD:main")

    # ------------------------------------------------------------ the daemon

    def daemon_env(self) -> dict[str, str]:
        env = {k: v for k, v in self.git.env.items() if not k.startswith(("GIT_AUTHOR", "GIT_COMMITTER"))}
        env.update(
            RECONCILER_WORKSPACE_ROOT=str(self.work / "ws"), RECONCILER_POLL_INTERVAL=str(POLL_INTERVAL),
            RECONCILER_RESYNC_INTERVAL=str(RESYNC_INTERVAL), RECONCILER_TERMINATE_GRACE=str(TERMINATE_GRACE),
            RECONCILER_UNREACHABLE_GRACE=str(UNREACHABLE_GRACE), RECONCILER_SSH_CONNECT_TIMEOUT="3",
            RECONCILER_SSH_READY_TIMEOUT="5", RECONCILER_NAMESPACE=self.namespace, RECONCILER_LOG_FORMAT="json",
            RECONCILER_LOG_LEVEL="INFO", RECONCILER_LOCAL_GPUS="0", LAMBDA_API_KEY=LAMBDA_KEY,
            RECONCILER_AUTHOR_NAME=soak.RECONCILER[0], RECONCILER_AUTHOR_EMAIL=soak.RECONCILER[1],
            PYTHONPATH=str(ROOT))
        return env

    def start_daemon(self, fresh: bool) -> None:
        if fresh or self.checkout is None:
            self.n_checkouts += 1
            self.checkout = self.work / "checkouts" / f"d{self.n_checkouts:02d}"
            self.checkout.parent.mkdir(exist_ok=True)
            self.git(self.work, "clone", "-q", str(self.origin), str(self.checkout))
            self.figures["daemon_starts_fresh_clone"] += 1
        else:
            self.figures["daemon_starts_same_checkout"] += 1
        self.n_daemons += 1
        log = self.logs / f"daemon-{self.n_daemons:02d}.log"
        with open(log, "wb") as fh:
            self.proc = subprocess.Popen([sys.executable, "-m", "reconciler", "--repo", str(self.checkout)],
                                         cwd=ROOT, env=self.daemon_env(), stdout=fh, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        tail, deadline = LogTail(log), time.time() + 60
        while time.time() < deadline and self.proc.poll() is None:
            if any(e.get("msg") == "daemon started" for e in tail.events()):
                self.restart_at = None
                return
            time.sleep(0.02)
        if self.proc.poll() == 2:  # the lock of a dying daemon is still held
            self.restart_at = time.time() + 0.5
            return
        raise HarnessError(f"the daemon did not start:\n{log.read_text(errors='replace')[-1500:]}")

    def kill_daemon(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.restart_fresh = self.rng.random() < 0.5
        self.restart_at = time.time() + self.rng.uniform(0.2, 2.0)

    def tend_daemon(self) -> None:
        if self.proc is not None and self.proc.poll() is not None and self.restart_at is None:
            code = self.proc.returncode
            if code not in (0, 2):
                text = (self.logs / f"daemon-{self.n_daemons:02d}.log").read_text(errors="replace")[-800:]
                self.violation("daemon_crash", f"daemon {self.n_daemons} exited with {code}: {text}")
            self.restart_at, self.restart_fresh = time.time() + 0.5, False
        if self.restart_at is not None and time.time() >= self.restart_at:
            self.start_daemon(self.restart_fresh)

    def stop_daemon(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    # ------------------------------------------------------------ faults

    def fault(self, kind: str) -> None:
        getattr(self, f"f_{kind}")()
        self.figures[f"fault_{kind}"] += 1

    def f_kill_daemon(self) -> None:
        self.kill_daemon()

    def _running(self, provider: str | None = None) -> list[tuple[str, dict]]:
        out = [("local", m) for m in self.local_records() if m.get("state") == "running"]
        out += [("lambda", r) for r in self.lambda_records() if r.get("status") == "active"]
        return [(p, r) for p, r in out if provider in (None, p)]

    def f_dead_listed(self) -> None:
        """The machine dies (sshd and everything on it) while its provider still lists it running."""
        running = self._running()
        if not running:
            self.figures["fault_skipped"] += 1
            return
        provider, r = self.rng.choice(sorted(running, key=lambda x: x[1]["id"]))
        if provider == "local":
            sshd = r.get("sshd_pid")
            cmd = Path(f"/proc/{sshd}/cmdline").read_bytes() if sshd and Path(f"/proc/{sshd}").exists() else b""
            if r["id"].encode() in cmd:  # still that rental's sshd, never a reused pid
                kill_pids([sshd])
            try:
                kill_pids(machine_pids(uid=pwd.getpwnam(r["user"]).pw_uid))
            except KeyError:
                pass
        else:
            rec = self.fake.machines.get(r["id"])
            if rec is not None and rec.get("server") is not None:
                kill_pids(machine_pids(ssh_ip=rec["ip"]))
                rec["server"].stop(kill_processes=True)
                kill_pids(machine_pids(ssh_ip=rec["ip"]))
        self.say(f"dead but listed: {provider}/{r['id']}")

    def f_evaporate(self) -> None:
        running = self._running()
        if not running:
            self.figures["fault_skipped"] += 1
            return
        provider, r = self.rng.choice(sorted(running, key=lambda x: x[1]["id"]))
        if provider == "local":
            from reconciler.rentals.providers.local import LocalAdapter
            from reconciler.spec.models.provider import Provider

            LocalAdapter(Provider.model_validate(self.providers["local"]), None).evaporate(r["id"])
        else:
            rec = self.fake.machines.get(r["id"])
            if rec is not None:
                kill_pids(machine_pids(ssh_ip=rec["ip"]))
                try:
                    self.fake.evaporate(r["id"])
                except KeyError:
                    pass
                kill_pids(machine_pids(ssh_ip=rec["ip"]))
        self.say(f"evaporated: {provider}/{r['id']}")

    def f_api_5xx(self) -> None:
        self.fake.chaos.storm(self.rng.choice([500, 502, 503]), self.rng.randint(1, 4), body="upstream error")

    def f_api_429(self) -> None:
        headers = {"Retry-After": "1"} if self.rng.random() < 0.5 else {}
        self.fake.chaos.storm(429, self.rng.randint(1, 4), headers, "error code: 1015")

    def f_api_timeout(self) -> None:
        self.fake.lose_answer("GET", "/api/v1/instances", "drop")

    def f_lost_create(self) -> None:
        self.fake.lose_answer("POST", "/api/v1/instance-operations/launch", self.rng.choice(["drop", 502]))

    def f_edit(self) -> None:
        if not self.runs:
            return self.f_add()
        r = self.runs[self.rng.choice(sorted(self.runs))]
        r["sleep"] = self.rng.randint(3, 15)
        self.write_run(r)
        self.push(f"edit {r['name']}")

    def f_add(self) -> None:
        if len(self.runs) >= 10:
            return self.f_remove()
        r = self.new_run()
        self.write_run(r)
        self.push(f"add {r['name']}")

    def f_remove(self) -> None:
        if not self.runs:
            return
        name = self.rng.choice(sorted(self.runs))
        del self.runs[name]
        (self.user / "specs" / "runs" / f"{name}.yaml").unlink()
        self.push(f"remove {name}")

    def f_limits(self) -> None:
        name = self.rng.choice(["local", "lambda"])
        doc = self.providers[name]
        limits = dict(doc["spec"].get("limits") or {})
        key = self.rng.choice(["maxMachines", "maxPricePerHour", "budget"])
        low = {"maxMachines": self.rng.choice([0, 1, 2]), "budget": 0,
               "maxPricePerHour": 0.05 if name == "local" else 1.0}[key]
        if key in limits or self.rng.random() < 0.4:
            limits.pop(key, None)
        else:
            limits[key] = low
        doc["spec"]["limits"] = limits
        self.write_provider(doc)
        self.push(f"limits of {name}: {limits}")

    def f_max_cost(self) -> None:
        if not self.runs:
            return
        r = self.runs[self.rng.choice(sorted(self.runs))]
        r["maxCost"] = None if r.get("maxCost") is not None else 0
        self.write_run(r)
        self.push(f"maxCost of {r['name']}: {r['maxCost']}")

    def f_idle(self) -> None:
        name = self.rng.choice(["local", "lambda"])
        doc = self.providers[name]
        doc["spec"]["idle"] = self.rng.choice([0, 0, 5])
        self.write_provider(doc)
        self.push(f"idle of {name}: {doc['spec']['idle']}")

    # ------------------------------------------------------------ the end

    def statuses(self) -> dict[str, dict]:
        out = {}
        for p in (self.checkout / "status").glob("*.yaml") if self.checkout else ():
            try:
                out[p.stem] = yaml.safe_load(p.read_text()) or {}
            except (OSError, yaml.YAMLError):
                continue
        return out

    def pending_runs(self) -> list[str]:
        """Runs whose status is not final for their current spec."""
        st, out = self.statuses(), []
        for name, r in self.runs.items():
            s = st.get(name) or {}
            digest = soak._RECONCILER["digest"](self.run_text(r))
            if s.get("phase") not in soak.TERMINAL or (s.get("spec") or {}).get("digest") != digest:
                out.append(f"{name}:{s.get('phase')}")
        return out

    def converge(self) -> None:
        """Faults off, limits lifted; wait for every run to be done and every rental given back."""
        self.fake.chaos.queue.clear()
        self.fake.lose.clear()
        for name in ("local", "lambda"):
            doc = self.providers[name]
            doc["spec"].pop("limits", None)
            doc["spec"]["idle"] = 0
            self.write_provider(doc)
        for r in self.runs.values():
            r.pop("maxCost", None)
            self.write_run(r)
        self.push("the end: limits lifted")
        deadline = time.time() + CONVERGE_TIMEOUT
        while time.time() < deadline:
            self.tend_daemon()
            if not self.pending_runs() and not self.rentals():
                break
            time.sleep(0.5)
        self.figures["converge_seconds"] = round(CONVERGE_TIMEOUT - max(0.0, deadline - time.time()), 1)
        self.stop_daemon()
        left = self.rentals()
        if left:
            self.violation("leaked", f"{len(left)} rental(s) left: {left}")
            self.violations["leaked"] += len(left) - 1
        pending = self.pending_runs()
        if pending:
            self.violation("not_converged", f"runs not done: {pending}")

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.providers.get("local"):
            from reconciler.rentals.providers.local import LocalAdapter
            from reconciler.spec.models.provider import Provider

            a = LocalAdapter(Provider.model_validate(self.providers["local"]), None)
            for r in a.inventory():
                a.terminate(r.id)
        if self.fake is not None:
            for rec in self.lambda_records():
                kill_pids(machine_pids(ssh_ip=rec["ip"]))
            self.fake.close()
        shutil.rmtree(self.remote_root, ignore_errors=True)

    # ------------------------------------------------------------ the whole

    def run(self) -> dict:
        self.setup()
        self.start_referee()
        try:
            self.start_daemon(fresh=True)
            end = time.time() + self.seconds
            names, weights = zip(*sorted(FAULTS.items()))
            while time.time() < end:
                time.sleep(self.rng.uniform(0.5, 2.5))
                self.tend_daemon()
                if self.proc is None or self.proc.poll() is not None:
                    continue
                kind = self.rng.choices(names, weights)[0]
                if kind not in ("edit", "add", "remove") and len(self.runs) < 3:
                    kind = "add"
                self.fault(kind)
            self.say("faults off; converging")
            self.converge()
        finally:
            seen = self.stop_referee()
        return self.report(seen)

    def start_referee(self) -> None:
        config = self.work / "referee-config.json"
        config.write_text(json.dumps({"t0": self.t0, "local_state": str(self.local_state),
                                      "lambda_table": str(self.fake.table), "prefix": self.prefix,
                                      "roots": ["/home", str(self.remote_root)], "out": str(self.work / "referee")}))
        self.referees = {part: subprocess.Popen([sys.executable, __file__, "--referee", str(config), part], cwd=ROOT,
                                                stdin=subprocess.DEVNULL) for part in ("rentals", "attempts")}
        deadline = time.time() + 30
        for part, proc in self.referees.items():
            while not (self.work / f"referee.{part}.ready").exists():
                if proc.poll() is not None or time.time() > deadline:
                    raise HarnessError(f"the referee's {part} sampler did not start")
                time.sleep(0.02)

    def stop_referee(self) -> dict:
        seen = {}
        for part, proc in getattr(self, "referees", {}).items():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            try:
                got = json.loads((self.work / f"referee.{part}").read_text())
            except (OSError, ValueError):
                raise HarnessError(f"the referee's {part} sampler left no findings") from None
            seen[{"rentals": "rental_sampler", "attempts": "attempts_sampler"}[part]] = got["figures"]
            for at, kind, detail in got["violations"]:
                self.violations[kind] += 1
                self.details.append(f"[{at:7.1f}s] {kind}: {detail}")
        return seen

    def report(self, seen: dict) -> dict:
        passes = 0
        for log in self.logs.glob("daemon-*.log"):
            passes += sum(1 for e in LogTail(log).events() if e.get("msg") == "pass")
        phases = Counter(str((s or {}).get("phase")) for s in self.statuses().values())
        return {"seed": self.seed, "seconds": self.seconds, "passes": passes, "daemons": self.n_daemons,
                "rental_sampler": seen.get("rental_sampler"), "attempts_sampler": seen.get("attempts_sampler"),
                "api_calls_to_fake_lambda": len(self.fake.requests), "final_phases": dict(phases),
                "figures": dict(self.figures), "violations": dict(self.violations), "details": self.details,
                "workdir": str(self.work)}


def print_text(r: dict) -> None:
    rs, at = r["rental_sampler"], r["attempts_sampler"]
    print(f"rental soak: seed {r['seed']}, {r['seconds']:g} s, {r['passes']} passes, {r['daemons']} daemon starts")
    print(f"  rental sampler: {rs['samples']} samples, period p50 {rs['period_p50_ms']} ms, p99 "
          f"{rs['period_p99_ms']} ms, max {rs['period_max_ms']} ms; rentals made: local {rs['rentals_local']}, "
          f"lambda {rs['rentals_lambda']}; most live at once {rs['max_live_rentals']}")
    print(f"  attempts sampler: {at['samples']} samples, period p50 {at['period_p50_ms']} ms, "
          f"p99 {at['period_p99_ms']} ms")
    print("  faults: " + ", ".join(f"{k[6:]} {v}" for k, v in sorted(r["figures"].items()) if k.startswith("fault_")))
    print(f"  final phases: {r['final_phases']}; converged in {r['figures'].get('converge_seconds')} s")
    print("  violations: " + ", ".join(f"{k} {v}" for k, v in r["violations"].items()))
    for d in r["details"][:40]:
        print("    " + d)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--referee", nargs=2, metavar=("CONFIG", "PART"), help=argparse.SUPPRESS)  # the soak's own
    a = ap.parse_args(argv)
    if a.referee:
        return referee(Path(a.referee[0]), a.referee[1])
    if os.geteuid() != 0:
        print("rental-soak: needs root (the local provider's rentals and the fake's machines are unix users)",
              file=sys.stderr)
        return 2
    s = RentalSoak(a.seconds, a.seed, a.workdir, progress=not a.quiet)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(2))  # a kill still ends what it started
    try:
        r = s.run()
    except HarnessError as e:
        print(f"rental-soak: {e}", file=sys.stderr)
        return 2
    finally:
        s.cleanup()
    print(json.dumps(r, indent=1) if a.json else "", end="")
    if not a.json:
        print_text(r)
    bad = sum(r["violations"].values())
    if not (a.workdir or a.keep or bad):
        shutil.rmtree(s.work, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

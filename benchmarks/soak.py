#!/usr/bin/env python3
"""Fault-injection soak: the real daemon, a real git remote, real processes, and a referee.

    python benchmarks/soak.py --seconds 600 --seed 1 [--workdir DIR] [--json] [--keep]

Why: the design promises that a crash at any moment is safe, that a fresh clone resumes without
launching anything twice, that an invalid spec touches nothing, and that the reconciler never
loses a user's commit nor writes outside ``status/``. Unit tests check each rule from fixtures;
this script checks them all at once, for minutes, while everything that can go wrong does.

The set-up (one scratch folder; nothing touches ``~/.reconciler``, the user's git configuration
or the network: git talks to a bare repository on disk, and the daemon listens on nothing):

- ``origin.git``: a bare repository, the remote everyone pushes to;
- ``user/``: a clone where the script plays the ML team. Each spec change is a commit pushed to
  origin after rebasing on the daemon's status commits, as a merged pull request would land;
- ``checkouts/dN/``: the daemon's checkouts. The daemon is the real command (``python -m
  reconciler --repo CHECKOUT``), placement ``local``, host processes, workspaces under ``ws/``,
  with short intervals (see ``daemon_env``) and JSON logs at DEBUG level in ``logs/``, so that
  every pass shows up as one ``pass`` line;
- the runs: ``sh -c 'sleep N; exit K'`` with N in 2-20 s, K 0 or not, ``maxRetries`` 0-2 and
  backoffs of 0.5-2 s, so that runs start, finish, fail and retry all through the soak.

Faults, picked by a seeded RNG (one seed gives the same sequence of choices; the instants they
land on are the machine's own):

- ``kill -9`` of the daemon at a random moment, and right after a pass (the ``pass`` log line is
  written just before the push, so this often leaves a status commit unpushed); after each,
  a restart in the same checkout or, as often, on a fresh clone of origin in a new folder, the
  old checkout and whatever it had not pushed abandoned;
- a crash in the middle of a roll-out: a spec edit, a kill the moment the daemon's pass
  relaunches that run, a second edit of the same run, and a restart on a fresh clone (the path
  where a stale instance could be adopted under the newer spec);
- ``kill -9`` of a job's process group, found by its identity in ``/proc``: with ``--ssh``, two
  in five runs also start a worker in a session of its own that ignores SIGTERM and keeps forking,
  so a kill of the wrapper's group leaves it running (the worker's own group may be the one killed);
- with ``--ssh N``: N machines reached over SSH (a real sshd on 127.0.0.11, .12, ...; the
  ``tests/infra`` server, logging in as ``rcsoak``; needs root), half of the runs placed there, and
  an sshd stopped now and then for 1-5 s (its processes keep running; within the unreachable grace,
  so a run there is waited for, not declared lost);
- with ``--slurm``: a Slurm cluster (the ``tests/infra`` one: munged, slurmctld and two slurmd on
  this machine; needs root) behind a ``slurm-host`` template that half of the runs use; now and
  then one of their jobs, queued or running, is cancelled with ``scancel`` from outside the
  reconciler (as root, the cluster's admin), or its job step's processes are killed with
  ``kill -9``; a job Slurm still holds (``squeue``: pending, configuring, running, completing,
  suspended) counts as alive for the attempts sampler, processes or none;
- spec edits (the command's argv, so the digest changes), additions, removals,
  ``desiredState: Stopped`` flips and back, and corruption (invalid YAML or an unknown key),
  fixed a few seconds later by restoring the previous valid text;
- racing pushes: the user pushes the moment the daemon has committed a pass and is pushing it;
  whoever loses must rebase, and no user commit may ever be lost.

The referee: a sampler thread reads the process table every ``SAMPLE_EVERY`` s, an auditor
thread follows origin and the daemons' logs, and the attempts sampler reads every process's
``RECONCILER_IDENTITY`` every ``ATTEMPTS_EVERY`` s. Violations, by kind:

- ``two_attempts``: at any sampled moment, processes of two instances of one run alive at once
  (two identities, or one identity in two workspaces), in any session or process group, for any
  time at all (with ``--slurm``, a job Slurm still holds counts as alive, queued or not). The design stops the old attempt, and confirms it gone, before it starts the next;

- ``double_run``: two live process groups of one run (any identities) for longer than
  ``FENCE_WINDOW``. The design replaces an instance only after the old one is stopped, in the same
  pass on this machine; the window allows one pass plus the terminate grace period;
- ``stale_generation``: (a) a live instance whose bundle's ``job.json`` ``spec_digest`` is not the
  run's spec on origin (changed, ``Stopped`` or removed) for longer than ``STALE_WINDOW`` after that
  spec reached the daemon's checkout (or after the daemon started, if later); while a spec is
  invalid the check pauses, since an invalid spec must touch nothing; (b) a NEW launch whose
  digest was not the run's desired spec on origin at any moment of the ``LAUNCH_SLACK`` before it
  (how old the daemon's view may be: one fetch interval and a pass); (c) a status file on origin
  naming an identity (Running, Succeeded or Failed) whose bundle runs another spec digest than
  the status records (an instance adopted under a newer spec, or an end recorded under a spec it
  did not run: the next pass would take that spec for the one that ran);
- ``invalid_killed``: the reconciler stopped (``result.json`` state ``terminated``) a run's current
  instance while its spec was invalid and nothing else (a change, a stop, a duplicate) explains it;
  the script's own kills are ``kill -9`` and recorded, so they are never confused with these;
- ``unexplained_kill``: the same, with no invalid spec around either;
- ``lost_user_commit``: a commit the user pushed is no longer in origin's history;
- ``outside_status``: a reconciler commit (by its author) touching anything outside ``status/``,
  or a merge commit by it;
- ``daemon_crash``: the daemon exited by itself with a code other than 0 or 2 (2: lock held);
- ``final_state`` and ``stale_process``: at the end the faults stop, every corrupt spec is fixed,
  the daemon converges (bounded wait), and each run's status on origin must match what happened:
  a removed spec Terminated or its final phase; a ``Stopped`` one Terminated (or the final phase
  it reached before the stop); a running spec Succeeded with exit 0, or Failed after all its
  retries with its command's exit code (a last attempt killed here reads as lost), for the spec's
  current digest; and no process of any run left alive.

Windows (all derived from the daemon settings below; ``PASS_ALLOWANCE`` is the longest a pass is
assumed to take, and the report says so when a pass took longer):

    FENCE_WINDOW = PASS_ALLOWANCE + TERMINATE_GRACE + 2 * SAMPLE_EVERY
    STALE_WINDOW = RESYNC_INTERVAL + 2 * PASS_ALLOWANCE + TERMINATE_GRACE + 2 * SAMPLE_EVERY
    LAUNCH_SLACK = POLL_INTERVAL + 2 * PASS_ALLOWANCE

Other options: ``--sleep MIN-MAX`` shortens the runs; ``--source DIR`` runs the daemon (and takes
the spec digest) from another source tree, e.g. an older commit unpacked with ``git archive``, to
compare before and after a fix; ``--plant KIND`` makes a violation on purpose, to show the
referee catches it (``tests/e2e/test_soak_smoke.py``).

It prints figures (passes, actions from the status commits' messages, kills, spec operations,
pushes and rejections, violations by kind, the final phases), or one JSON document with
``--json``. Exit status: 0 with no violation, 1 with violations, 2 when the harness itself failed.
Every process it started, daemons and runs, is killed at the end, on Ctrl-C too. The scratch
folder is removed unless ``--workdir`` or ``--keep`` was given, or a violation was found.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _use_the_venv() -> None:
    """Run under the project's virtualenv when started with a python that lacks its dependencies."""
    if all(importlib.util.find_spec(m) is not None for m in ("pydantic", "yaml", "git", "watchfiles")):
        return
    venv = ROOT / ".venv" / "bin" / "python"
    if venv.exists() and not os.environ.get("SOAK_REEXEC"):
        os.environ["SOAK_REEXEC"] = "1"
        os.execv(str(venv), [str(venv), *sys.argv])
    sys.exit("soak: the reconciler's dependencies are missing: pip install -e . (or create .venv)")


_use_the_venv()

import yaml  # noqa: E402

IDENTITY = re.compile(r"^(?P<name>[a-z0-9]([-a-z0-9]*[a-z0-9])?)-g(?P<gen>[0-9]+)-a(?P<attempt>[0-9]+)$")
_RECONCILER: dict = {}


def bind_reconciler(source: Path) -> None:
    """Import the spec digest from the source tree the daemon runs, so both always agree on it."""
    if _RECONCILER:
        if _RECONCILER["source"] != source:
            raise HarnessError(f"the reconciler is already imported from {_RECONCILER['source']}")
        return
    sys.path.insert(0, str(source))
    from reconciler.spec.load import run_digest
    from reconciler.spec.models.run import Run

    imported = Path(sys.modules["reconciler"].__file__).resolve().parents[1]
    if imported != source.resolve():
        raise HarnessError(f"wanted the reconciler from {source}, but python imported it from {imported}")
    _RECONCILER.update(source=source, digest=lambda text: run_digest(Run.model_validate(yaml.safe_load(text))))


def run_name(identity: str) -> str:
    m = IDENTITY.match(identity)
    return m.group("name") if m else identity

# ---------------------------------------------------------------- settings

POLL_INTERVAL = 0.5  # the daemon fetches origin this often
RESYNC_INTERVAL = 1.0  # and runs a pass at least this often
TERMINATE_GRACE = 2.0  # SIGTERM → SIGKILL when it stops a run
DEBOUNCE = 0.05
SAMPLE_EVERY = 0.2  # the process table sampler's period
PASS_ALLOWANCE = 2.0  # the longest one pass is assumed to take (checked against the logs)

FENCE_WINDOW = PASS_ALLOWANCE + TERMINATE_GRACE + 2 * SAMPLE_EVERY
STALE_WINDOW = RESYNC_INTERVAL + 2 * PASS_ALLOWANCE + TERMINATE_GRACE + 2 * SAMPLE_EVERY
LAUNCH_SLACK = POLL_INTERVAL + 2 * PASS_ALLOWANCE
RESULT_WAIT = 5.0  # how long a vanished group may take to show its result.json
ATTEMPTS_EVERY = 0.02  # the attempts sampler's period: two attempts of one run alive at once, ever
# With SSH machines: an sshd stays stopped this long, well inside the unreachable grace, so a run
# there is waited for and never declared lost (a run declared lost is relaunched elsewhere while
# the partitioned machine may still run the old attempt: the one overlap the design allows, which
# is not what the attempts sampler looks for).
SSH_OUTAGE = (1.0, 5.0)
UNREACHABLE_GRACE = 30.0
SSH_USER = "rcsoak"  # a login of its own: the tests' rctest accounts are never touched
# A worker that leaves the job's process group (a session of its own, as torchrun's workers do),
# ignores SIGTERM (only SIGKILL ends it) and keeps forking children: it outlives a kill of the
# group and the job's own end, and nothing but a stop by identity ends it.
WORKER = "setsid sh -c 'trap \"\" TERM; while :; do sleep 0.5; done' </dev/null >/dev/null 2>&1 & "

RECONCILER = ("soak-reconciler", "reconciler@soak.invalid")
USER = ("Soak User", "user@soak.invalid")
TERMINAL = ("Succeeded", "Failed", "Terminated")

PLANTABLE = ("double_run", "stale_generation", "outside_status", "two_attempts")  # the self-test's (--plant)
VIOLATION_KINDS = ("double_run", "stale_generation", "invalid_killed", "unexplained_kill", "lost_user_commit",
                   "outside_status", "daemon_crash", "final_state", "stale_process", "two_attempts")

# Relative weights of the faults the chaos loop picks from.
FAULTS = {
    "edit": 2.5, "add": 1.0, "remove": 0.5, "corrupt": 1.0, "flip": 0.8, "kill_job": 1.5,
    "kill_daemon": 0.5, "kill_after_pass": 0.5, "rollout_crash": 0.4, "race_push": 0.8,
}
SSH_FAULTS = {"stop_sshd": 0.6}  # added with SSH machines
SLURM_FAULTS = {"scancel_job": 0.5, "kill_slurm_step": 0.5}  # added with a Slurm cluster
# The job states in which Slurm still holds a job: an attempt in any of them is alive (squeue(1)'s
# JOB STATE CODES; COMPLETING: its processes are being ended).
SLURM_ALIVE = "PENDING,CONFIGURING,RUNNING,COMPLETING,SUSPENDED"
SLURM_EVERY = 0.25  # how often the queue is read (a sampled overlap is confirmed by a fresh read)
# A job's name is rcl-<namespace>-<identity> (docs/slurm.md); the soak's runs are soak-NN.
SLURM_JOB = re.compile(r"-(?P<ident>soak-[0-9]+-g[0-9]+-a[0-9]+)$")

SSH_TEMPLATE = """\
apiVersion: reconciler/v1
kind: ExecutionTemplate
id: ssh-host
description: The soak's SSH machines (sshd on loopback), host processes.
placement: {kind: ssh}
launch_mode: {kind: host_process}
defaults:
  target: soak
  runtime_env: {RECONCILER_GPU_SAMPLER: "0"}
allow_overrides: [resources, runtime_env]
"""

def slurm_template(root: str, env: dict[str, str]) -> str:
    """The soak's Slurm template: this machine as the login host, workspaces on the shared folder."""
    return yaml.safe_dump({
        "apiVersion": "reconciler/v1", "kind": "ExecutionTemplate", "id": "slurm-host",
        "description": "The soak's Slurm cluster (tests/infra/slurm.py), host processes.",
        "placement": {"kind": "slurm", "slurm": {"login": "local", "workspace_root": root, "partition": "debug",
                                                 "env": env}},
        "launch_mode": {"kind": "host_process"}, "defaults": {"runtime_env": {"RECONCILER_GPU_SAMPLER": "0"}},
        "allow_overrides": ["resources", "runtime_env"]}, sort_keys=False)


TEMPLATE = """\
apiVersion: reconciler/v1
kind: ExecutionTemplate
id: local-host
description: This machine, host processes (the soak's runs).
placement: {kind: local}
launch_mode: {kind: host_process}
defaults:
  runtime_env: {RECONCILER_GPU_SAMPLER: "0"}
allow_overrides: [resources, runtime_env]
"""


class HarnessError(RuntimeError):
    """The soak itself could not go on (not a finding about the reconciler)."""


# ---------------------------------------------------------------- specs


@dataclass
class JobSpec:
    """One run's spec as the user writes it."""

    name: str
    sleep: int
    exit_code: int
    retries: int
    backoff: float
    desired: str = "Running"
    template: str = "local-host"
    worker: bool = False  # the command also starts a worker in a session of its own (WORKER)

    def text(self) -> str:
        command = (WORKER if self.worker else "") + f"sleep {self.sleep}; exit {self.exit_code}"
        return (f"apiVersion: reconciler/v1\nkind: Run\nmetadata:\n  name: {self.name}\nspec:\n"
                f"  template: {self.template}\n  desiredState: {self.desired}\n"
                f"  task:\n    type: command\n    argv: [sh, -c, {json.dumps(command)}]\n"
                f"  restartPolicy: {{maxRetries: {self.retries}, backoffSeconds: {self.backoff:g}}}\n")

    @property
    def digest(self) -> str:
        """The reconciler's own digest of the spec (what a bundle's job.json records)."""
        return _RECONCILER["digest"](self.text())


EXIT_CODES = (0, 0, 1, 3, 7)  # two in five runs succeed


def random_spec(rng: random.Random, name: str, sleep: tuple[int, int], ssh: bool = False,
                slurm: bool = False) -> JobSpec:
    spec = JobSpec(name, sleep=rng.randint(*sleep), exit_code=rng.choice(EXIT_CODES), retries=rng.randint(0, 2),
                   backoff=rng.choice([0.5, 1, 2]))
    if ssh:  # drawn only with SSH machines, so that a seed without them gives the same runs as before
        spec.template = rng.choice(["local-host", "ssh-host"])
        spec.worker = rng.random() < 0.4
    if slurm and rng.random() < 0.5:  # the same: drawn only with a Slurm cluster
        spec.template = "slurm-host"
    return spec


def corrupt_text(rng: random.Random, text: str) -> str:
    if rng.random() < 0.5:
        return text + "  oops: [this flow sequence is never closed\n"  # not YAML
    return re.sub(r"(?m)^(  template: .*\n)", r"\1  priority: high\n", text, count=1)  # unknown key


@dataclass
class Push:
    sha: str
    at: float
    reached_at: float | None = None  # when the daemon's checkout first contained it


@dataclass
class Desired:
    """A run's desired state on origin, from the push that brought it on."""

    kind: str  # running, stopped, invalid, removed
    spec: JobSpec | None = None  # running and stopped: a copy of the spec
    digest: str | None = None
    push: Push | None = None  # set once pushed


def short(digest: str | None) -> str:
    return (digest or "none").removeprefix("sha256:")[:8]


# ---------------------------------------------------------------- git


class Git:
    """git with an isolated HOME (no global or system configuration) and fixed identities."""

    def __init__(self, home: Path):
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "RECONCILER_"))}
        self.env.update(HOME=str(home), GIT_CONFIG_NOSYSTEM="1", GIT_TERMINAL_PROMPT="0",
                        GIT_AUTHOR_NAME=USER[0], GIT_AUTHOR_EMAIL=USER[1],
                        GIT_COMMITTER_NAME=USER[0], GIT_COMMITTER_EMAIL=USER[1])

    def __call__(self, cwd: Path, *args: str, check: bool = True, env: dict | None = None) -> str:
        p = self.run(cwd, *args, env=env)
        if check and p.returncode != 0:
            raise HarnessError(f"git {' '.join(args)} (in {cwd}) failed: {(p.stderr or p.stdout).strip()[:400]}")
        return p.stdout.strip()

    def run(self, cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                              env=dict(self.env, **(env or {})), stdin=subprocess.DEVNULL)


# ---------------------------------------------------------------- the process table


@dataclass
class Group:
    """A live process group of one run instance."""

    pgid: int
    identity: str
    workspace: str | None
    pids: list[int] = field(default_factory=list)

    @property
    def run(self) -> str:
        return run_name(self.identity)


def _read(path: str, limit: int = 1 << 16) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit)
    except OSError:
        return None


def scan(ws_roots) -> dict[int, Group]:
    """Live process groups of runs under ``ws_roots`` (one root or several), by pgid.

    A run's group is led by its launch wrapper (``sh scripts/launch.sh IDENTITY``, its working
    folder the workspace); everything the job started carries ``RECONCILER_IDENTITY`` and
    ``RECONCILER_BUNDLE`` in its environment. Zombies do not count.
    """
    prefixes = tuple(r.rstrip("/") + "/" for r in ([ws_roots] if isinstance(ws_roots, str) else ws_roots))
    groups: dict[int, Group] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        stat = _read(f"/proc/{pid}/stat", 4096)
        if not stat:
            continue
        text = stat.decode(errors="replace")
        rest = text[text.rfind(")") + 2:].split()
        if len(rest) < 3 or rest[0] in ("Z", "X"):
            continue
        pgid = int(rest[2])
        ident = workspace = None
        argv = (_read(f"/proc/{pid}/cmdline") or b"").rstrip(b"\0").split(b"\0")
        if pid == pgid and len(argv) >= 3 and argv[-2] == b"scripts/launch.sh":
            try:
                cwd = os.readlink(f"/proc/{pid}/cwd")
            except OSError:
                cwd = ""
            if cwd.startswith(prefixes):
                ident, workspace = argv[-1].decode(errors="replace"), cwd
        else:
            env = _read(f"/proc/{pid}/environ", 1 << 20) or b""
            if any(b"RECONCILER_BUNDLE=" + p.encode() in env for p in prefixes):
                for item in env.split(b"\0"):
                    if item.startswith(b"RECONCILER_IDENTITY="):
                        ident = item.split(b"=", 1)[1].decode(errors="replace")
                    elif item.startswith(b"RECONCILER_BUNDLE="):
                        workspace = item.split(b"=", 1)[1].decode(errors="replace")
        if ident is None:
            continue
        g = groups.setdefault(pgid, Group(pgid, ident, workspace))
        g.pids.append(pid)
        if pid == pgid:  # the wrapper's word wins
            g.identity, g.workspace = ident, workspace or g.workspace
    return groups


def job_digest(workspace: str | None) -> str | None:
    raw = _read(os.path.join(workspace, "job.json")) if workspace else None
    try:
        return json.loads(raw)["payload"]["spec_digest"] if raw else None
    except (ValueError, KeyError, TypeError):
        return None


def result_of(workspace: str | None) -> dict | None:
    raw = _read(os.path.join(workspace, "runtime", "result.json")) if workspace else None
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


# ---------------------------------------------------------------- daemon logs


class SlurmQueue(threading.Thread):
    """The soak's jobs Slurm still holds, read with squeue every ``SLURM_EVERY`` s: "IDENTITY
    WORKDIR" (the key the attempts sampler gives a process: a job's work dir is its workspace, the
    wrapper's RECONCILER_BUNDLE) → (job id, state). A queued job has no process, yet it is an attempt
    that will run: it counts as alive."""

    def __init__(self, env: dict[str, str]):
        super().__init__(name="soak-squeue", daemon=True)
        self.env = {**os.environ, **env}
        self.snapshot: dict[str, tuple[str, str]] = {}
        self.halt = threading.Event()
        self.polls = self.failures = 0
        self.seen: set[str] = set()

    def read(self) -> dict[str, tuple[str, str]] | None:
        try:
            r = subprocess.run(["squeue", "-h", "-t", SLURM_ALIVE, "-o", "%i|%j|%T|%Z"], env=self.env,
                               capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            r = None
        if r is None or r.returncode != 0:
            self.failures += 1
            return None
        jobs = {}
        for line in r.stdout.splitlines():
            parts = line.split("|")
            m = SLURM_JOB.search(parts[1]) if len(parts) == 4 else None
            if m:
                jobs[f"{m['ident']} {parts[3].rstrip('/')}"] = (parts[0], parts[2])
        return jobs

    def run(self) -> None:
        while not self.halt.is_set():
            jobs = self.read()
            if jobs is not None:
                self.snapshot = jobs
                self.polls += 1
                self.seen.update(jobs)
            self.halt.wait(SLURM_EVERY)


class AttemptsSampler(threading.Thread):
    """Every ``ATTEMPTS_EVERY`` s: which attempts of each run (``RECONCILER_IDENTITY`` values) have
    a live process under the soak's workspace roots, in any session or process group. Any moment
    with two attempts of one run is an overlap (``two_attempts``; the target is none at all).

    Reading every process's environment 50 times a second would cost a core the daemon needs: a
    process's identity is read once (a process is its pid and start time), and read again while
    the process is young and has none (a fork of the daemon becomes a wrapper when it execs). An
    overlap is confirmed by reading the processes involved afresh."""

    def __init__(self, roots: list[str], ignore, down, report, queue: SlurmQueue | None = None):
        super().__init__(name="soak-attempts", daemon=True)
        self.queue = queue
        self.prefixes = tuple(b"\0RECONCILER_BUNDLE=" + (r.rstrip("/") + "/").encode() for r in roots)
        self.ignore, self.down, self.report = ignore, down, report
        self.halt = threading.Event()
        self.cache: dict[tuple[int, int], str | None] = {}
        self.hz = os.sysconf("SC_CLK_TCK")
        self.samples = self.overlap_samples = 0
        self.gaps: list[float] = []
        self.episodes: list[dict] = []
        self.open: dict[str, dict] = {}

    def identity(self, pid: int) -> str | None:
        """"IDENTITY WORKSPACE" of a process of a run, else None. The workspace too: one identity
        alive in two workspaces (two machines) is two instances just as much."""
        env = b"\0" + (_read(f"/proc/{pid}/environ", 1 << 20) or b"")
        if not any(p in env for p in self.prefixes):
            return None
        values = {}
        for key in (b"RECONCILER_IDENTITY", b"RECONCILER_BUNDLE"):
            at = env.find(b"\0" + key + b"=")
            if at < 0:
                return None
            values[key] = env[at + len(key) + 2:].split(b"\0", 1)[0].decode(errors="replace")
        ident = values[b"RECONCILER_IDENTITY"]
        if not IDENTITY.match(ident) or self.ignore(ident):
            return None
        return f"{ident} {values[b'RECONCILER_BUNDLE']}"

    def attempts(self) -> dict[str, dict[str, list[int]]]:
        """run → identity → pids, from one scan of /proc."""
        uptime = float((_read("/proc/uptime") or b"0").split()[0])
        by_run: dict[str, dict[str, list[int]]] = {}
        seen = set()
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            stat = _read(f"/proc/{entry}/stat", 4096)
            if not stat:
                continue
            text = stat.decode(errors="replace")
            rest = text[text.rfind(")") + 2:].split()
            if len(rest) < 20 or rest[0] in ("Z", "X"):
                continue
            key = (int(entry), int(rest[19]))  # field 22: the start time, in clock ticks since boot
            seen.add(key)
            cached = self.cache.get(key, "?")
            if cached == "?" or (cached is None and uptime - key[1] / self.hz < 2.0):
                cached = self.cache[key] = self.identity(key[0])
            if cached is not None:
                by_run.setdefault(run_name(cached.split(" ", 1)[0]), {}).setdefault(cached, []).append(key[0])
        self.cache = {k: v for k, v in self.cache.items() if k in seen}
        if self.queue is not None:  # a job Slurm holds, with or without a process here yet
            for key in self.queue.snapshot:
                ident = key.split(" ", 1)[0]
                if not self.ignore(ident):
                    by_run.setdefault(run_name(ident), {}).setdefault(key, [])
        return by_run

    def confirmed(self, idents: dict[str, list[int]]) -> set[str]:
        alive = {i for i, pids in idents.items() if any(self.identity(p) == i for p in pids)}
        queued = [i for i in idents if i not in alive]
        if queued and self.queue is not None:  # read afresh: the snapshot may be SLURM_EVERY old
            jobs = self.queue.read() or {}
            alive |= {i for i in queued if i in jobs}
        return alive

    def run(self) -> None:
        last = None
        while not self.halt.is_set():
            t = time.time()
            try:
                by_run = self.attempts()
            except OSError:
                self.halt.wait(ATTEMPTS_EVERY)
                continue
            now = time.time()
            if last is not None:
                self.gaps.append(now - last)
            last = now
            self.samples += 1
            both = {}
            for run, idents in by_run.items():
                if len(idents) > 1:
                    alive = self.confirmed(idents)
                    if len(alive) > 1:
                        both[run] = alive
            self.overlap_samples += bool(both)
            for run, alive in both.items():
                ep = self.open.setdefault(run, {"run": run, "start": now, "end": now, "identities": set(),
                                                "during_outage": False})
                ep["end"] = now
                ep["identities"] |= alive
                ep["during_outage"] |= self.down()
            for run in [r for r in self.open if r not in both]:
                self.close(run)
            self.halt.wait(max(0.0, ATTEMPTS_EVERY - (time.time() - t)))
        for run in list(self.open):
            self.close(run)

    def close(self, run: str) -> None:
        ep = self.open.pop(run)
        ep["identities"] = sorted(ep["identities"])
        self.episodes.append(ep)
        self.report(ep)

    def figures(self) -> dict:
        gaps = sorted(self.gaps) or [0.0]
        longest = max((e["end"] - e["start"] for e in self.episodes), default=0.0)
        return {"samples": self.samples, "period_p50_ms": round(1000 * statistics.median(gaps), 1),
                "period_p99_ms": round(1000 * gaps[int(0.99 * (len(gaps) - 1))], 1),
                "period_max_ms": round(1000 * gaps[-1], 1), "overlap_samples": self.overlap_samples,
                "overlap_episodes": len(self.episodes),
                "during_outage": sum(1 for e in self.episodes if e["during_outage"]),
                "longest_overlap_s": round(longest, 3)}


def kill_carriers(roots: list[str]) -> None:
    """SIGKILL every process of a run under ``roots``, in any session (a worker left its group)."""
    prefixes = tuple(b"\0RECONCILER_BUNDLE=" + (r.rstrip("/") + "/").encode() for r in roots)
    for _ in range(20):
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != os.getpid():
                env = b"\0" + (_read(f"/proc/{entry}/environ", 1 << 20) or b"")
                if any(p in env for p in prefixes):
                    found.append(int(entry))
        if not found:
            return
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.1)


class LogTail:
    """New JSON lines of a growing log file, a whole line at a time."""

    def __init__(self, path: Path, from_end: bool = False):
        self.path = path
        self.offset = path.stat().st_size if from_end and path.exists() else 0
        self.partial = b""

    def events(self) -> list[dict]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return []
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        out = []
        for line in lines:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if isinstance(ev, dict):
                out.append(ev)
        return out


# ---------------------------------------------------------------- the soak


@dataclass
class Options:
    seconds: float = 600.0
    seed: int = 1
    workdir: Path | None = None
    keep: bool = False
    initial_runs: int = 6
    sleep: tuple[int, int] = (2, 20)  # seconds each run's command sleeps, at least and at most
    max_runs: int = 10
    converge_timeout: float | None = None  # default: from the longest run still to finish
    plant: tuple[str, ...] = ()  # self-test: violations to plant (double_run, stale_generation, outside_status)
    progress: bool = True
    source: Path = ROOT  # the reconciler source tree the daemon runs
    ssh: int = 0  # SSH machines (sshd on loopback, tests/infra/sshd.py) besides this one
    slurm: bool = False  # a Slurm cluster (tests/infra/slurm.py) besides them


class Soak:
    def __init__(self, opts: Options):
        self.opts = opts
        bind_reconciler(opts.source)
        self.rng = random.Random(opts.seed)
        self.own_workdir = opts.workdir is None
        self.work = Path(opts.workdir or tempfile.mkdtemp(prefix="soak-")).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.origin = self.work / "origin.git"
        self.user = self.work / "user"
        self.ws_root = str(self.work / "ws")
        self.logs = self.work / "logs"
        (self.work / "home").mkdir(exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        self.git = Git(self.work / "home")
        self.lock = threading.RLock()
        self.stop = threading.Event()
        self.t0 = time.time()

        # desired state: what the user pushed, per run, in order
        self.timeline: dict[str, list[Desired]] = {}
        self.pushes: list[Push] = []
        self.specs: dict[str, JobSpec] = {}  # the valid text of each spec in the user clone
        self.corrupt: dict[str, float] = {}  # run → when its fix is due
        self.removed: set[str] = set()
        self.next_name = 1

        # the daemon
        self.proc: subprocess.Popen | None = None
        self.checkout: Path | None = None
        self.ready_at: float | None = None
        self.restart_at: float | None = None
        self.restart_fresh = False
        self.n_daemons = 0
        self.n_checkouts = 0
        self.tails: list[LogTail] = []

        # what the referee saw
        self.live: dict[int, Group] = {}
        self.seen_identities: set[str] = set()
        self.digests: dict[str, str | None] = {}  # identity → job.json spec_digest
        self.overlap_since: dict[frozenset, float] = {}
        self.last_overlap: dict[str, float] = {}  # run → last time two of its groups were alive
        self.flagged: set = set()
        self.vanished: list[tuple[Group, float]] = []
        self.launched: list[tuple[Group, float]] = []  # new instances whose launch check is due
        self.killed_here: set[str] = set()  # identities this script killed
        self.stopped_by_reconciler: set[str] = set()
        self.planted_pgids: set[int] = set()
        self.origin_head: str | None = None
        self.origin_commits: set[str] = set()
        self.pass_durations: list[float] = []

        # SSH machines: their servers, workspace roots, and the stopped ones (index → when back)
        self.sshds: list = []
        self.ssh_roots: list[str] = []
        self.remote_tmp: str | None = None
        self.sshd_back_at: dict[int, float] = {}
        self.planted_identities: set[str] = set()
        self.attempts: AttemptsSampler | None = None

        # The Slurm cluster: its folder, the workspace root on its shared folder, its queue, and the
        # identities whose job was cancelled from outside (an admin's scancel ends a run for good)
        self.cluster = None
        self.slurm_base: str | None = None
        self.slurm_root: str | None = None
        self.queue: SlurmQueue | None = None
        self.scancelled: set[str] = set()

        self.figures: Counter = Counter()
        self.violations: Counter = Counter({k: 0 for k in VIOLATION_KINDS})
        self.details: list[str] = []

    # ------------------------------------------------------------ bookkeeping

    def now(self) -> float:
        return time.time() - self.t0

    def violation(self, kind: str, detail: str) -> None:
        with self.lock:
            self.violations[kind] += 1
            self.details.append(f"[{self.now():7.1f}s] {kind}: {detail}")
        self.say(f"VIOLATION {kind}: {detail}")

    def say(self, text: str) -> None:
        if self.opts.progress:
            print(f"soak [{self.now():6.1f}s] {text}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------ set-up

    @property
    def roots(self) -> list[str]:
        return [self.ws_root, *self.ssh_roots, *([self.slurm_root] if self.slurm_root else [])]

    def start_sshds(self) -> str:
        """Start the SSH machines; the fleet spec that names them."""
        if os.geteuid() != 0:
            raise HarnessError("--ssh needs root: the loopback sshd logs in as a user it creates")
        sys.path.insert(0, str(ROOT))
        try:
            from tests.infra.sshd import SshServer
        except ImportError as e:
            raise HarnessError(f"--ssh needs the test infrastructure (tests/infra): {e}") from e
        self.remote_tmp = tempfile.mkdtemp(prefix="rc-soak-", dir="/tmp")
        os.chmod(self.remote_tmp, 0o1777)  # the SSH login creates its workspace roots in it
        machines = []
        for i in range(self.opts.ssh):
            server = SshServer(self.work / f"sshd-{i + 1}", host=f"127.0.0.{11 + i}", user=SSH_USER).start()
            self.sshds.append(server)
            root = os.path.join(self.remote_tmp, f"m{i + 1}")
            self.ssh_roots.append(root)
            machines.append({"name": f"ssh-{i + 1}", "max_tasks": 8, "workspace_root": root,
                             "ssh": {"host": server.host, "port": server.port, "user": server.user,
                                     "identity_file": str(server.identity_file), "host_key": server.host_key}})
        return yaml.safe_dump({"apiVersion": "reconciler/v1", "kind": "Fleet", "metadata": {"name": "soak"},
                               "spec": {"machines": machines}}, sort_keys=False)

    def start_slurm(self) -> str:
        """Start the Slurm cluster as the test suite's fixture does; the template that submits to it."""
        if os.geteuid() != 0:
            raise HarnessError("--slurm needs root: munged --force and the GPU devices' mknod")
        sys.path.insert(0, str(ROOT))
        try:
            from tests.infra.slurm import SlurmCluster, available
        except ImportError as e:
            raise HarnessError(f"--slurm needs the test infrastructure (tests/infra): {e}") from e
        why = available()
        if why:
            raise HarnessError(f"--slurm: {why}")
        self.slurm_base = tempfile.mkdtemp(prefix="rc-soak-slurm-", dir="/tmp")
        os.chmod(self.slurm_base, 0o755)
        self.cluster = SlurmCluster(Path(self.slurm_base)).start()
        self.slurm_root = str(self.cluster.shared / "soak")
        self.queue = SlurmQueue(self.cluster.env)
        self.queue.start()
        return slurm_template(self.slurm_root, self.cluster.env)

    def setup(self) -> None:
        g = self.git
        g(self.work, "init", "-q", "--bare", "-b", "main", str(self.origin))
        g(self.work, "clone", "-q", str(self.origin), str(self.user))
        (self.user / "execution_templates").mkdir()
        (self.user / "execution_templates" / "local-host.yaml").write_text(TEMPLATE)
        (self.user / "specs" / "runs").mkdir(parents=True)
        if self.opts.ssh:
            (self.user / "execution_templates" / "ssh-host.yaml").write_text(SSH_TEMPLATE)
            (self.user / "specs" / "fleets").mkdir()
            (self.user / "specs" / "fleets" / "soak.yaml").write_text(self.start_sshds())
        if self.opts.slurm:
            (self.user / "execution_templates" / "slurm-host.yaml").write_text(self.start_slurm())
        (self.user / ".gitignore").write_text(".reconciler/\n")
        changes = {}
        for _ in range(self.opts.initial_runs):
            spec = random_spec(self.rng, self.new_name(), self.opts.sleep, bool(self.opts.ssh), self.opts.slurm)
            changes[spec.name] = self.write_spec(spec)
        self.commit_and_push("initial runs", changes)

    def new_name(self) -> str:
        name = f"soak-{self.next_name:02d}"
        self.next_name += 1
        return name

    def spec_path(self, name: str) -> Path:
        return self.user / "specs" / "runs" / f"{name}.yaml"

    def write_spec(self, spec: JobSpec) -> Desired:
        self.spec_path(spec.name).write_text(spec.text())
        self.specs[spec.name] = spec
        kind = "running" if spec.desired == "Running" else "stopped"
        return Desired(kind, JobSpec(**vars(spec)), spec.digest)

    def commit_and_push(self, message: str, changes: dict[str, Desired], race: bool = False) -> Push:
        """Commit the user clone's changes and push them; record what origin now asks for."""
        g = self.git
        g(self.user, "add", "-A")
        g(self.user, "commit", "-q", "-m", message)
        for attempt in range(40):
            if not (race and attempt == 0) and self.pushes:  # (origin has no branch before the first push)
                pull = g.run(self.user, "pull", "-q", "--rebase", "origin", "main")
                if pull.returncode != 0:
                    self.figures["user_pulls_failed"] += 1
                    g.run(self.user, "rebase", "--abort")
                    time.sleep(0.1)
                    continue
            pushed_at = time.time()  # origin may have it from this moment on
            p = g.run(self.user, "push", "-q", "origin", "HEAD:main")
            if p.returncode == 0:
                self.figures["user_pushes"] += 1
                push = Push(g(self.user, "rev-parse", "HEAD"), pushed_at)
                with self.lock:
                    self.pushes.append(push)
                    for name, d in changes.items():
                        d.push = push
                        self.timeline.setdefault(name, []).append(d)
                return push
            self.figures["user_pushes_rejected"] += 1
            time.sleep(0.02 * attempt)
        raise HarnessError("the user's push kept being rejected")

    def prepare_race(self) -> None:
        """Bring the user clone up to origin now, so that the racing push is a plain push."""
        self.git.run(self.user, "pull", "-q", "--rebase", "origin", "main")

    # ------------------------------------------------------------ the daemon

    def daemon_env(self) -> dict[str, str]:
        env = {k: v for k, v in self.git.env.items() if not k.startswith(("GIT_AUTHOR", "GIT_COMMITTER"))}
        env.update(
            RECONCILER_WORKSPACE_ROOT=self.ws_root, RECONCILER_POLL_INTERVAL=str(POLL_INTERVAL),
            RECONCILER_RESYNC_INTERVAL=str(RESYNC_INTERVAL), RECONCILER_DEBOUNCE=str(DEBOUNCE),
            RECONCILER_TERMINATE_GRACE=str(TERMINATE_GRACE), RECONCILER_LOG_FORMAT="json",
            RECONCILER_LOG_LEVEL="DEBUG", RECONCILER_LOCAL_GPUS="0",
            RECONCILER_UNREACHABLE_GRACE=str(UNREACHABLE_GRACE),
            RECONCILER_AUTHOR_NAME=RECONCILER[0], RECONCILER_AUTHOR_EMAIL=RECONCILER[1],
            PYTHONPATH=str(self.opts.source) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        )
        return env

    def fresh_checkout(self) -> Path:
        self.n_checkouts += 1
        path = self.work / "checkouts" / f"d{self.n_checkouts:02d}"
        path.parent.mkdir(exist_ok=True)
        self.git(self.work, "clone", "-q", str(self.origin), str(path))
        return path

    def start_daemon(self, fresh: bool) -> None:
        if fresh or self.checkout is None:
            self.checkout = self.fresh_checkout()
            self.figures["daemon_starts_fresh_clone"] += 1
        else:
            self.figures["daemon_starts_same_checkout"] += 1
        self.n_daemons += 1
        log = self.logs / f"daemon-{self.n_daemons:02d}.log"
        with open(log, "wb") as fh:
            # Its own session: a Ctrl-C meant for the soak does not reach it (the soak kills it itself).
            self.proc = subprocess.Popen([sys.executable, "-m", "reconciler", "--repo", str(self.checkout)],
                                         cwd=self.opts.source, env=self.daemon_env(), stdout=fh,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        tail = LogTail(log)
        with self.lock:
            self.tails.append(LogTail(log))
        deadline = time.time() + 60
        while time.time() < deadline:
            if any(e.get("msg") == "daemon started" for e in tail.events()):
                self.ready_at = time.time()
                self.restart_at = None
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        code = self.proc.poll()
        text = log.read_text(errors="replace")[-1500:]
        if code == 2:  # the lock is still held (a dying child): try again shortly
            self.figures["daemon_start_refused"] += 1
            self.schedule_restart(False, 0.5)
            return
        if code is not None:
            self.violation("daemon_crash", f"daemon {self.n_daemons} exited with {code} at start: {text}")
            self.schedule_restart(False, 1.0)
            return
        raise HarnessError(f"the daemon did not start within 60 s:\n{text}")

    def daemon_alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.ready_at is not None

    def kill_daemon(self, why: str) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        with self.lock:
            self.ready_at = None
        self.figures[f"daemon_kills_{why}"] += 1

    def schedule_restart(self, fresh: bool, delay: float) -> None:
        self.restart_fresh = fresh
        self.restart_at = time.time() + delay

    def tend_daemon(self) -> None:
        """Notice a daemon that exited by itself; restart a killed one when its time has come."""
        if self.proc is not None and self.proc.poll() is not None and self.ready_at is not None:
            code = self.proc.returncode
            with self.lock:
                self.ready_at = None
            tail = (self.logs / f"daemon-{self.n_daemons:02d}.log").read_text(errors="replace")[-1500:]
            if code not in (0, 2):
                self.violation("daemon_crash", f"daemon {self.n_daemons} exited by itself with {code}: {tail}")
            self.schedule_restart(False, 0.5)
        if not self.daemon_alive() and self.restart_at is not None and time.time() >= self.restart_at:
            self.start_daemon(self.restart_fresh)

    def wait_for_pass(self, timeout: float, want=lambda ev: True) -> dict | None:
        """The next ``pass`` line of the running daemon that ``want`` accepts (polled every 5 ms)."""
        if not self.daemon_alive():
            return None
        tail = LogTail(self.logs / f"daemon-{self.n_daemons:02d}.log", from_end=True)
        deadline = time.time() + timeout
        while time.time() < deadline and self.proc.poll() is None:
            for ev in tail.events():
                if ev.get("msg") == "pass" and want(ev):
                    return ev
            time.sleep(0.005)
        return None

    def stop_daemon(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None

    # ------------------------------------------------------------ the referee: process table

    def desired_now(self, run: str) -> Desired | None:
        entries = self.timeline.get(run)
        return entries[-1] if entries else None

    def in_effect(self, run: str, t0: float, t1: float) -> list[Desired]:
        """The entries that were origin's word for ``run`` at some moment of [t0, t1]."""
        entries = self.timeline.get(run, [])
        out = [d for d in entries if t0 < d.push.at <= t1]
        before = [d for d in entries if d.push.at <= t0]
        return before[-1:] + out

    def anchor(self, d: Desired) -> float | None:
        """From when the daemon could have acted on ``d``: it reached its checkout, and it was up."""
        if d.push.reached_at is None or self.ready_at is None:
            return None
        return max(d.push.reached_at, self.ready_at)

    def sample(self) -> None:
        now = time.time()
        groups = scan(self.roots)
        with self.lock:
            for pgid, g in groups.items():
                if pgid not in self.live:
                    self.on_new_group(g, now)
            for pgid, g in self.live.items():
                if pgid not in groups and pgid not in self.planted_pgids:
                    self.vanished.append((g, now))
            self.live = groups
            self.figures["max_live_groups"] = max(self.figures["max_live_groups"], len(groups))
            self.check_launches(now)
            self.check_double_runs(now)
            self.check_stale(now)
            self.check_vanished(now)

    def on_new_group(self, g: Group, now: float) -> None:
        if g.identity in self.seen_identities:
            return  # the same instance, seen again
        self.seen_identities.add(g.identity)
        self.digests[g.identity] = job_digest(g.workspace)
        self.launched.append((g, self.submitted_at(g) or now))

    def submitted_at(self, g: Group) -> float | None:
        """When a Slurm job was submitted (runtime/launched_at): it may start long after."""
        if not (self.slurm_root and g.workspace and g.workspace.startswith(self.slurm_root + "/")):
            return None
        raw = _read(os.path.join(g.workspace, "runtime", "launched_at"), 64)
        try:
            return float(raw) + 1.0 if raw else None  # whole seconds (date +%s): the submit came within the next
        except ValueError:
            return None

    def check_launches(self, now: float) -> None:
        """A new instance must run a spec origin asked for just before it started. Checked a moment
        after it shows up, so that the push that asked for it is in the timeline."""
        due = [(g, t) for g, t in self.launched if now - t >= 0.5]
        self.launched = [(g, t) for g, t in self.launched if now - t < 0.5]
        for g, t in due:
            if g.run not in self.timeline:
                continue  # not a run of this repository
            self.figures["launches_seen"] += 1
            digest = self.digests.get(g.identity)
            asked = self.in_effect(g.run, t - LAUNCH_SLACK, t)
            if digest not in {d.digest for d in asked if d.kind == "running"}:
                wanted = ", ".join(f"{d.kind} {short(d.digest)}" for d in asked)
                self.violation("stale_generation", f"new launch {g.identity} runs spec {short(digest)}; origin "
                                                   f"asked for [{wanted}] in the {LAUNCH_SLACK:g} s before it")

    def check_double_runs(self, now: float) -> None:
        by_run: dict[str, list[Group]] = {}
        for g in self.live.values():
            by_run.setdefault(g.run, []).append(g)
        current = set()
        for run, gs in by_run.items():
            # A worker in a session of its own is a group of its own: one instance is an identity in a workspace.
            if len({(g.identity, g.workspace) for g in gs}) < 2:
                continue
            self.last_overlap[run] = now
            key = frozenset(g.pgid for g in gs)
            current.add(key)
            since = self.overlap_since.setdefault(key, now)
            if now - since > FENCE_WINDOW and ("double", key) not in self.flagged:
                self.flagged.add(("double", key))
                who = ", ".join(f"{g.identity} (pgid {g.pgid}, spec {short(self.digests.get(g.identity))})"
                                for g in sorted(gs, key=lambda g: g.identity))
                self.violation("double_run", f"{run}: {who} alive together for more than {FENCE_WINDOW:g} s")
        for key in list(self.overlap_since):
            if key not in current:
                del self.overlap_since[key]

    def check_stale(self, now: float) -> None:
        if not self.daemon_alive():
            return
        for g in self.live.values():
            if g.run not in self.timeline or ("stale", g.identity) in self.flagged:
                continue
            current = self.desired_now(g.run)
            if current is None or current.kind == "invalid":
                continue  # an invalid spec touches nothing: the last valid instance may go on
            digest = self.digests.get(g.identity)
            if current.kind == "running" and current.digest == digest:
                continue
            since = self.anchor(current)
            if since is None or now - since <= STALE_WINDOW:
                continue
            self.flagged.add(("stale", g.identity))
            what = {"running": f"spec {short(current.digest)}", "stopped": "desiredState: Stopped",
                    "removed": "the spec's removal"}[current.kind]
            self.violation("stale_generation", f"{g.identity} (spec {short(digest)}) still alive {now - since:.1f} s "
                                               f"after {what} reached the daemon (window {STALE_WINDOW:g} s)")

    def check_vanished(self, now: float) -> None:
        keep = []
        for g, gone_at in self.vanished:
            res = result_of(g.workspace)
            if res is None and now - gone_at < RESULT_WAIT:
                keep.append((g, gone_at))
                continue
            state = (res or {}).get("state")
            if g.identity in self.killed_here:
                self.figures["job_deaths_killed_here"] += 1
            elif state in ("succeeded", "failed"):
                self.figures["job_deaths_natural"] += 1
            elif state == "terminated":
                self.figures["job_deaths_stopped_by_reconciler"] += 1
                self.stopped_by_reconciler.add(g.identity)
                self.explain_stop(g, gone_at)
            else:
                self.figures["job_deaths_unexplained_loss"] += 1
                self.details.append(f"[{self.now():7.1f}s] note: {g.identity} vanished without a result")
        self.vanished = keep

    def explain_stop(self, g: Group, at: float) -> None:
        """The reconciler stopped ``g``: was there a reason it may act on?"""
        digest = self.digests.get(g.identity)
        seen = self.in_effect(g.run, at - LAUNCH_SLACK - TERMINATE_GRACE, at)
        if any(d.kind in ("stopped", "removed") or (d.kind == "running" and d.digest != digest) for d in seen):
            return  # a change, a stop or a removal
        if self.last_overlap.get(g.run, 0) >= at - FENCE_WINDOW:
            return  # fencing a duplicate
        if any(d.kind == "invalid" for d in seen):
            self.violation("invalid_killed", f"{g.identity} (spec {short(digest)}, still the last valid one) was "
                                             f"stopped by the reconciler while {g.run}'s spec was invalid")
        else:
            self.violation("unexplained_kill", f"{g.identity} (spec {short(digest)}, the current one) was stopped "
                                               "by the reconciler with no change, stop, removal or duplicate to "
                                               "explain it")

    # ------------------------------------------------------------ the referee: origin and logs

    def audit(self) -> None:
        self.follow_logs()
        self.track_reach()
        self.audit_origin()

    def follow_logs(self) -> None:
        with self.lock:
            tails = list(self.tails)
        for tail in tails:
            for ev in tail.events():
                msg = ev.get("msg")
                if msg == "pass":
                    self.figures["passes"] += 1
                    self.pass_durations.append(float(ev.get("duration") or 0))
                    for action, n in (ev.get("plan") or {}).items():
                        self.figures[f"planned_{action}"] += int(n)
                    if ev.get("errors"):
                        self.figures["action_errors"] += len(ev["errors"])
                elif msg == "pass failed":
                    self.figures["passes_failed"] += 1
                elif msg == "pushed status":
                    self.figures["daemon_pushes"] += 1
                elif msg == "push rejected: the remote moved; rebasing and retrying":
                    self.figures["daemon_pushes_rejected"] += 1
                elif msg == "push rejected; giving up until the next pass":
                    self.figures["daemon_pushes_given_up"] += 1
                elif msg and msg.startswith("rebasing status commits onto the remote failed"):
                    self.figures["daemon_rebase_resets"] += 1

    def track_reach(self) -> None:
        checkout = self.checkout
        if checkout is None:
            return
        with self.lock:
            pending = [p for p in self.pushes if p.reached_at is None]
        for p in pending:  # in push order: once one is missing, the later ones are too
            r = self.git.run(checkout, "merge-base", "--is-ancestor", p.sha, "HEAD")
            if r.returncode != 0:
                break
            with self.lock:
                p.reached_at = time.time()

    def audit_origin(self) -> None:
        g = self.git
        head = g(self.origin, "rev-parse", "main", check=False)
        if not head or head == self.origin_head:
            return
        fmt = "%H%x00%an%x00%ae%x00%P%x00%B%x1e"
        rng = [head] + ([f"^{self.origin_head}"] if self.origin_head else [])
        out = g.run(self.origin, "log", "--reverse", f"--format={fmt}", *rng).stdout
        for rec in out.split("\x1e"):
            rec = rec.strip("\n")
            if not rec:
                continue
            sha, name, email, parents, message = rec.split("\x00", 4)
            if (name, email) != RECONCILER:
                continue
            self.figures["status_commits"] += 1
            if message.startswith("status: refresh"):
                self.figures["status_commits_refresh_only"] += 1
            if len(parents.split()) > 1:
                self.violation("outside_status", f"merge commit {sha[:12]} by the reconciler")
                continue
            paths = g(self.origin, "diff-tree", "-r", "--root", "--no-commit-id", "--name-only", sha).splitlines()
            outside = [p for p in paths if not p.startswith("status/")]
            if outside:
                self.violation("outside_status", f"reconciler commit {sha[:12]} touches {', '.join(outside[:5])}")
            self.count_transitions(message)
            self.check_status_files(sha, [p for p in paths if p.startswith("status/") and p.endswith(".yaml")])
        self.origin_head = head
        with self.lock:  # first: only pushes that had landed before the listing below must be in it
            pushes = list(self.pushes)
        self.origin_commits = set(g(self.origin, "rev-list", "main").split())
        for p in pushes:
            if p.sha not in self.origin_commits and ("lost", p.sha) not in self.flagged:
                self.flagged.add(("lost", p.sha))
                self.violation("lost_user_commit", f"user commit {p.sha[:12]} (pushed at "
                                                   f"{p.at - self.t0:.1f} s) is not in origin's history")

    TRANSITION = re.compile(r"^- (?P<name>\S+): (?P<before>\S+) → (?P<after>\S+) \[(?P<ident>[^\]]*)\] (?P<why>.*)$")

    def count_transitions(self, message: str) -> None:
        for line in message.splitlines():
            m = self.TRANSITION.match(line)
            if not m:
                continue
            after, why = m.group("after"), m.group("why")
            if "adopting it" in why or "already running: adopted" in why or "kept running" in why:
                key = "adopt"
            elif after == "Running" and "spec changed" in why:
                key = "relaunch_spec_changed"
            elif after == "Running" and re.search(r"retry \d+/\d+", why):
                key = "relaunch_retry"
            elif after == "Running":
                key = "launch"
            elif after == "Terminated":
                key = "terminate"
            else:
                key = after.lower()
            self.figures[f"transition_{key}"] += 1

    def check_status_files(self, sha: str, paths: list[str]) -> None:
        """A status must never pair an identity with a spec digest that identity does not run."""
        for path in paths:
            text = self.git.run(self.origin, "show", f"{sha}:{path}").stdout
            try:
                st = yaml.safe_load(text) or {}
            except yaml.YAMLError:
                continue
            handle = st.get("handle") or {}
            ident, recorded = handle.get("identity"), (st.get("spec") or {}).get("digest")
            if st.get("phase") not in ("Running", "Succeeded", "Failed") or not ident or not recorded:
                continue
            with self.lock:
                runs = self.digests.get(ident) or job_digest(handle.get("workspace"))
            if runs and runs != recorded and ("status", ident, recorded) not in self.flagged:
                self.flagged.add(("status", ident, recorded))
                self.violation("stale_generation", f"status of {st.get('name')} at {sha[:12]} says {ident} is "
                                                   f"{st.get('phase')} for spec {short(recorded)}, but {ident} runs "
                                                   f"spec {short(runs)}: ({st.get('message', '')[:120]})")

    def referee(self) -> None:
        """The sampler and the auditor, until the soak ends."""
        next_audit = 0.0
        while not self.stop.is_set():
            try:
                self.sample()
                if time.time() >= next_audit:
                    self.audit()
                    next_audit = time.time() + 0.5
            except HarnessError as e:
                self.details.append(f"[{self.now():7.1f}s] referee: {e}")
            self.stop.wait(SAMPLE_EVERY)

    # ------------------------------------------------------------ faults

    def candidates(self, settled: bool = False) -> list[str]:
        """Runs whose spec exists and is valid; ``settled``: and the daemon's status has its digest."""
        names = sorted(n for n in self.specs if n not in self.corrupt and n not in self.removed)
        if not settled:
            return names
        out = []
        for n in names:
            text = self.git.run(self.origin, "show", f"main:status/{n}.yaml").stdout
            try:
                st = yaml.safe_load(text) if text else None
            except yaml.YAMLError:
                st = None
            if st and (st.get("spec") or {}).get("digest") == self.specs[n].digest:
                out.append(n)
        return out

    def live_groups(self) -> list[Group]:
        with self.lock:
            groups = [g for g in self.live.values() if g.run in self.timeline and g.pgid not in self.planted_pgids]
        return sorted(groups, key=lambda g: g.identity)

    def edit(self, name: str, race: bool = False, why: str = "edit") -> None:
        old = self.specs[name]
        new = JobSpec(**vars(old))
        while new.digest == old.digest:
            new.sleep, new.exit_code = self.rng.randint(*self.opts.sleep), self.rng.choice(EXIT_CODES)
            if self.rng.random() < 0.3:
                new.retries = self.rng.randint(0, 2)
        d = self.write_spec(new)
        self.commit_and_push(f"{why} {name}: sleep {new.sleep}; exit {new.exit_code}", {name: d}, race=race)
        self.figures["spec_edits"] += 1

    def do_edit(self) -> None:
        names = self.candidates()
        if names:
            self.edit(self.rng.choice(names))

    def do_add(self) -> None:
        if len(self.candidates()) + len(self.corrupt) >= self.opts.max_runs:
            return self.do_edit()
        spec = random_spec(self.rng, self.new_name(), self.opts.sleep, bool(self.opts.ssh), self.opts.slurm)
        self.commit_and_push(f"add {spec.name}", {spec.name: self.write_spec(spec)})
        self.figures["spec_additions"] += 1

    def do_remove(self) -> None:
        names = self.candidates()
        if len(names) <= 3:
            return self.do_add()
        name = self.rng.choice(names)
        self.spec_path(name).unlink()
        self.removed.add(name)
        self.commit_and_push(f"remove {name}", {name: Desired("removed")})
        self.figures["spec_removals"] += 1

    def do_flip(self) -> None:
        names = self.candidates()
        if not names:
            return
        spec = JobSpec(**vars(self.specs[self.rng.choice(names)]))
        spec.desired = "Stopped" if spec.desired == "Running" else "Running"
        self.commit_and_push(f"{spec.desired.lower()} {spec.name}", {spec.name: self.write_spec(spec)})
        self.figures["spec_stop_flips" if spec.desired == "Stopped" else "spec_start_flips"] += 1

    def do_corrupt(self) -> None:
        """Corrupt a settled spec, preferably one whose current instance is alive (so a kill would show)."""
        settled = [n for n in self.candidates(settled=True) if self.specs[n].desired == "Running"]
        if not settled:
            return
        with self.lock:
            running = {g.run for g in self.live_groups() if self.digests.get(g.identity) == self.specs[g.run].digest}
        pool = [n for n in settled if n in running] or settled
        name = self.rng.choice(pool)
        self.spec_path(name).write_text(corrupt_text(self.rng, self.specs[name].text()))
        self.corrupt[name] = time.time() + self.rng.uniform(4, 15)
        self.commit_and_push(f"break {name}", {name: Desired("invalid")})
        self.figures["spec_corruptions"] += 1

    def fix(self, name: str) -> None:
        del self.corrupt[name]
        self.commit_and_push(f"fix {name}", {name: self.write_spec(self.specs[name])})
        self.figures["spec_fixes"] += 1

    def do_kill_job(self) -> None:
        groups = self.live_groups()
        if not groups:
            return
        g = self.rng.choice(groups)
        with self.lock:
            self.killed_here.add(g.identity)
        try:
            os.killpg(g.pgid, signal.SIGKILL)
            self.figures["job_kills"] += 1
        except ProcessLookupError:
            pass

    def do_stop_sshd(self) -> None:
        """An SSH machine stops answering for a few seconds; its processes keep running."""
        up = [i for i in range(len(self.sshds)) if i not in self.sshd_back_at]
        if not up:
            return
        i = self.rng.choice(up)
        self.sshds[i].stop()
        with self.lock:
            self.sshd_back_at[i] = time.time() + self.rng.uniform(*SSH_OUTAGE)
        self.figures["sshd_stops"] += 1

    def tend_sshds(self, all_now: bool = False) -> None:
        for i, at in sorted(self.sshd_back_at.items()):
            if all_now or time.time() >= at:
                self.sshds[i].start()
                with self.lock:
                    del self.sshd_back_at[i]

    def do_scancel_job(self) -> None:
        """Someone other than the reconciler cancels one of the soak's jobs, queued or running."""
        jobs = sorted((self.queue.read() or {}).items()) if self.queue is not None else []
        jobs = [(k, v) for k, v in jobs if k.split(" ", 1)[0] not in self.planted_identities]
        if not jobs:
            return
        key, (job, _) = self.rng.choice(jobs)
        ident = key.split(" ", 1)[0]
        with self.lock:
            self.killed_here.add(ident)
            self.scancelled.add(ident)
        self.cluster.command("scancel", job, check=False)
        self.figures["scancels"] += 1

    def do_kill_slurm_step(self) -> None:
        """kill -9 of a running Slurm job's step: its process group on the node."""
        groups = [g for g in self.live_groups() if g.workspace and g.workspace.startswith(self.slurm_root + "/")]
        if not groups:
            return
        g = self.rng.choice(groups)
        with self.lock:
            self.killed_here.add(g.identity)
        try:
            os.killpg(g.pgid, signal.SIGKILL)
            self.figures["slurm_step_kills"] += 1
        except ProcessLookupError:
            pass

    def do_kill_daemon(self) -> None:
        if self.daemon_alive():
            self.kill_daemon("random")
            self.schedule_restart(self.rng.random() < 0.5, self.rng.uniform(0, 2))

    def do_kill_after_pass(self) -> None:
        fresh, delay = self.rng.random() < 0.5, self.rng.uniform(0, 2)
        if self.wait_for_pass(5.0):
            self.kill_daemon("after_pass")
            self.schedule_restart(fresh, delay)

    def do_rollout_crash(self) -> None:
        """Edit a run, kill the daemon the moment its pass relaunches it, edit again, restart on a fresh clone."""
        names = [n for n in self.candidates() if self.specs[n].desired == "Running"]
        if not names or not self.daemon_alive():
            return
        name = self.rng.choice(names)
        self.edit(name, why="roll out")
        ev = self.wait_for_pass(8.0, lambda ev: any(t.startswith(f"{name}: ") and "→ Running" in t
                                                    for t in ev.get("transitions") or []))
        if ev is None:
            return
        self.kill_daemon("mid_rollout")
        self.edit(name, why="roll out again")
        self.schedule_restart(True, self.rng.uniform(0, 1))

    def do_race_push(self) -> None:
        names = self.candidates()
        if not names:
            return
        name = self.rng.choice(names)
        self.prepare_race()
        if self.wait_for_pass(5.0, lambda ev: bool(ev.get("commit"))):
            self.figures["racing_pushes"] += 1
            self.edit(name, race=True, why="race")

    # ------------------------------------------------------------ self-test plants

    def plant(self, kind: str) -> None:
        """Make a violation on purpose, to show the referee catches it (tests/e2e/test_soak_smoke.py)."""
        if kind == "double_run":  # two instances of one run, out of the reconciler's sight
            for ident in ("planted-g1-a1", "planted-g2-a1"):
                self.planted_instance(ident, None, FENCE_WINDOW + 4)
        elif kind == "stale_generation":  # an instance of a real run built from a spec nobody asked for
            name = sorted(self.candidates())[0]
            self.planted_instance(f"{name}-g99-a1", "sha256:" + "0" * 64, STALE_WINDOW + 4)
        elif kind == "two_attempts":  # two attempts of one run for a moment, shorter than the fencing window
            for ident in ("overlap-g1-a1", "overlap-g1-a2"):
                self.planted_instance(ident, None, 1, sampled=True)
        elif kind == "outside_status":
            (self.user / "specs" / "runs" / "PLANTED.txt").write_text("a commit by the reconciler's author\n")
            self.git(self.user, "add", "-A")
            self.git(self.user, "commit", "-q", "-m", "status: planted", env={
                "GIT_AUTHOR_NAME": RECONCILER[0], "GIT_AUTHOR_EMAIL": RECONCILER[1]})
            self.commit_and_push_plain()
        else:
            raise HarnessError(f"cannot plant {kind!r}")
        self.figures[f"planted_{kind}"] += 1

    def planted_instance(self, ident: str, digest: str | None, seconds: float, sampled: bool = False) -> None:
        """A process group that looks like a run instance to the referee (its environment), in a
        folder the reconciler never looks at, so nothing stops it but its own end. ``sampled``: the
        attempts sampler's to catch (else it ignores it, the group referee catches it)."""
        if not sampled:
            self.planted_identities.add(ident)
        bundle = os.path.join(self.ws_root, "planted", ident)
        os.makedirs(bundle, exist_ok=True)
        if digest:
            with open(os.path.join(bundle, "job.json"), "w") as fh:
                json.dump({"schema_version": "v1", "payload": {"identity": ident, "spec_digest": digest}}, fh)
        env = dict(os.environ, RECONCILER_IDENTITY=ident, RECONCILER_BUNDLE=bundle)
        p = subprocess.Popen(["sleep", str(int(seconds))], env=env, start_new_session=True, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with self.lock:
            self.planted_pgids.add(p.pid)
        threading.Thread(target=p.wait, daemon=True).start()  # reap it: a zombie is not alive

    def commit_and_push_plain(self) -> None:
        for _ in range(40):
            self.git.run(self.user, "pull", "-q", "--rebase", "origin", "main")
            if self.git.run(self.user, "push", "-q", "origin", "HEAD:main").returncode == 0:
                return
        raise HarnessError("could not push the planted commit")

    # ------------------------------------------------------------ the run

    def chaos(self, seconds: float) -> None:
        deadline = time.time() + seconds
        plants = list(self.opts.plant)
        plant_at = time.time() + min(5.0, seconds / 3)
        next_progress = time.time() + 15
        faults = {**FAULTS, **(SSH_FAULTS if self.sshds else {}), **(SLURM_FAULTS if self.cluster else {})}
        while time.time() < deadline:
            self.tend_daemon()
            self.tend_sshds()
            for name, due in sorted(self.corrupt.items()):
                if time.time() >= due:
                    self.fix(name)
            if plants and time.time() >= plant_at:
                self.plant(plants.pop(0))
            fault = self.rng.choices(list(faults), weights=list(faults.values()))[0]
            self.figures[f"fault_{fault}"] += 1
            getattr(self, f"do_{fault}")()
            self.tend_daemon()
            time.sleep(self.rng.uniform(0.3, 1.5))
            if time.time() >= next_progress:
                next_progress = time.time() + 15
                bad = sum(self.violations.values())
                self.say(f"passes {self.figures['passes']}, launches seen {self.figures['launches_seen']}, "
                         f"live groups {len(self.live)}, violations {bad}")

    def converge(self) -> tuple[float, list[str]]:
        """No more faults: fix what is broken, keep a daemon up, and wait until the world settles."""
        for name in sorted(self.corrupt):
            self.fix(name)
        self.tend_sshds(all_now=True)
        if not self.daemon_alive():
            self.start_daemon(False)
        running = [s for n, s in self.specs.items() if n not in self.removed and s.desired == "Running"]
        timeout = self.opts.converge_timeout or 30 + max([(s.sleep + s.backoff + 1) * (s.retries + 1)
                                                          for s in running] or [0])
        t0 = time.time()
        deadline = t0 + timeout
        problems = ["not checked yet"]
        while time.time() < deadline:
            self.tend_daemon()
            if not self.daemon_alive():
                time.sleep(0.2)
                continue
            with self.lock:
                reached = all(p.reached_at is not None for p in self.pushes)
                live = list(self.live.values())  # planted ones included: they end by themselves
            pushed = self.git.run(self.checkout, "rev-list", "--count", "origin/main..HEAD").stdout.strip() == "0"
            problems = self.final_problems()
            if reached and pushed and not live and not problems:
                break
            time.sleep(0.5)
        return time.time() - t0, problems

    def origin_status(self, name: str) -> dict | None:
        text = self.git.run(self.origin, "show", f"main:status/{name}.yaml").stdout
        try:
            return yaml.safe_load(text) if text else None
        except yaml.YAMLError:
            return None

    def final_problems(self) -> list[str]:
        """What differs between each run's status on origin and what should have happened."""
        problems = []
        with self.lock:
            killed, stopped = set(self.killed_here), set(self.stopped_by_reconciler)
            seen = {run_name(i) for i in self.seen_identities}
            scancelled = set(self.scancelled)
        for name in sorted(self.timeline):
            d = self.desired_now(name)
            st = self.origin_status(name)
            phase = st.get("phase") if st else None
            if d.kind == "invalid":
                problems.append(f"{name}: its spec is still invalid")
            elif d.kind == "removed":
                if st is None and name in seen:
                    problems.append(f"{name}: removed after it ran, but it has no status")
                elif st is not None and phase not in TERMINAL:
                    problems.append(f"{name}: removed, but its phase is {phase}")
            elif d.kind == "stopped":
                if phase == "Terminated":
                    continue
                if phase in ("Succeeded", "Failed") and (st.get("spec") or {}).get("digest") != d.digest:
                    continue  # it had finished before the stop
                problems.append(f"{name}: desiredState Stopped, but its phase is {phase}")
            else:
                problems.extend(self.finished_problems(name, d, st, killed, stopped, scancelled))
        return problems

    def finished_problems(self, name: str, d: Desired, st: dict | None, killed: set[str],
                          stopped: set[str], scancelled: set[str] = frozenset()) -> list[str]:
        spec = d.spec
        if st is None:
            return [f"{name}: no status on origin"]
        phase, gen, att, code = st.get("phase"), st.get("generation") or 0, st.get("attempt") or 0, st.get("exit_code")
        digest = (st.get("spec") or {}).get("digest")
        if digest != d.digest:
            return [f"{name}: status is for spec {short(digest)}, origin's spec is {short(d.digest)} ({phase})"]
        ident = f"{name}-g{gen}-a{att}"
        interrupted = {i for i in killed | stopped if i.startswith(f"{name}-g{gen}-a")}
        last_interrupted = ident in interrupted
        want = f"sleep {spec.sleep}; exit {spec.exit_code}, maxRetries {spec.retries}"
        if phase not in ("Succeeded", "Failed"):
            return [f"{name}: phase {phase} at the end ({want})"]
        if phase == "Succeeded":
            if spec.exit_code != 0 or code != 0:
                return [f"{name}: Succeeded (exit {code}) but the command exits {spec.exit_code} ({want})"]
            if att > 1 + len(interrupted):
                return [f"{name}: Succeeded on attempt {att}, but only {len(interrupted)} attempt(s) were interrupted"]
            return []
        if ident in scancelled:
            return []  # an admin's scancel ends the run for good, whatever retries are left (docs/slurm.md)
        if att != spec.retries + 1:
            return [f"{name}: Failed after {att} attempt(s) with maxRetries {spec.retries} ({want})"]
        # A last attempt killed here is lost (no exit code), one stopped by the reconciler exits 143 or
        # 137; either may have finished by itself just before.
        allowed = {spec.exit_code, None, 137, 143} if last_interrupted else {spec.exit_code}
        if last_interrupted and spec.template == "slurm-host":
            allowed.add(code)  # Slurm reports a killed step by its signal, in its own words
        if code not in allowed:
            return [f"{name}: Failed with exit {code}, the command exits {spec.exit_code} ({want})"]
        if spec.exit_code == 0 and not last_interrupted:
            return [f"{name}: Failed though the command exits 0 and {ident} was not interrupted"]
        return []

    def cleanup(self) -> None:
        self.stop.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.attempts is not None:
            self.attempts.halt.set()
        for g in scan(self.roots).values():
            try:
                os.killpg(g.pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        kill_carriers(self.roots)
        for server in self.sshds:
            server.close()
        if self.remote_tmp:
            shutil.rmtree(self.remote_tmp, ignore_errors=True)
        if self.queue is not None:
            self.queue.halt.set()
        if self.cluster is not None:
            self.cluster.close()  # cancels every job first
            kill_carriers(self.roots)
        if self.slurm_base:
            shutil.rmtree(self.slurm_base, ignore_errors=True)

    def run(self) -> dict:
        referee = threading.Thread(target=self.referee, name="soak-referee", daemon=True)
        try:
            self.setup()
            self.attempts = AttemptsSampler(self.roots, lambda i: i in self.planted_identities,
                                            lambda: bool(self.sshd_back_at), self.on_overlap, self.queue)
            self.attempts.start()
            self.start_daemon(fresh=True)
            referee.start()
            self.say(f"workdir {self.work}; faults for {self.opts.seconds:g} s (seed {self.opts.seed})")
            t0 = time.time()
            self.chaos(self.opts.seconds)
            fault_seconds = time.time() - t0
            self.say("faults stopped; converging")
            converge_seconds, problems = self.converge()
            with self.lock:
                for p in problems:
                    self.violation("final_state", p)
                for g in self.live.values():
                    if g.pgid not in self.planted_pgids:
                        self.violation("stale_process", f"{g.identity} (pgid {g.pgid}) still alive at the end")
            code = self.stop_daemon()
            self.figures["final_daemon_exit"] = code if code is not None else -1
            self.attempts.halt.set()
            self.attempts.join(timeout=10)
            self.stop.set()
            referee.join(timeout=10)
            self.audit()  # whatever the last push brought
            return self.report(fault_seconds, converge_seconds)
        finally:
            self.cleanup()

    def on_overlap(self, ep: dict) -> None:
        where = " (an SSH machine was down)" if ep["during_outage"] else ""
        self.violation("two_attempts", f"{ep['run']}: {', '.join(ep['identities'])} alive together for "
                                       f"{ep['end'] - ep['start']:.3f} s{where}")

    # ------------------------------------------------------------ the report

    def report(self, fault_seconds: float, converge_seconds: float) -> dict:
        f = self.figures
        durations = sorted(self.pass_durations) or [0.0]
        phases = Counter((self.origin_status(n) or {}).get("phase", "none") for n in self.timeline)
        return {
            "seed": self.opts.seed,
            "workdir": str(self.work),
            "seconds": {"faults": round(fault_seconds, 1), "converge": round(converge_seconds, 1)},
            "windows": {"fence": FENCE_WINDOW, "stale": STALE_WINDOW, "launch_slack": LAUNCH_SLACK,
                        "pass_allowance": PASS_ALLOWANCE},
            "daemon": {
                "passes": f["passes"], "passes_failed": f["passes_failed"], "action_errors": f["action_errors"],
                "pass_seconds": {"p50": round(statistics.median(durations), 3),
                                 "p90": round(durations[int(0.9 * (len(durations) - 1))], 3),
                                 "max": round(durations[-1], 3)},
                "starts": {"fresh_clone": f["daemon_starts_fresh_clone"],
                           "same_checkout": f["daemon_starts_same_checkout"],
                           "refused_lock_held": f["daemon_start_refused"]},
                "planned": {k.removeprefix("planned_"): v for k, v in sorted(f.items()) if k.startswith("planned_")},
            },
            "actions": {k.removeprefix("transition_"): v for k, v in sorted(f.items()) if k.startswith("transition_")},
            "status_commits": {"total": f["status_commits"], "refresh_only": f["status_commits_refresh_only"]},
            "kills": {"daemon_random": f["daemon_kills_random"], "daemon_after_pass": f["daemon_kills_after_pass"],
                      "daemon_mid_rollout": f["daemon_kills_mid_rollout"], "jobs": f["job_kills"]},
            "job_ends": {"natural": f["job_deaths_natural"], "killed_here": f["job_deaths_killed_here"],
                         "stopped_by_reconciler": f["job_deaths_stopped_by_reconciler"],
                         "unexplained_loss": f["job_deaths_unexplained_loss"], "launches_seen": f["launches_seen"],
                         "max_live_groups": f["max_live_groups"]},
            "spec_ops": {"edits": f["spec_edits"], "additions": f["spec_additions"], "removals": f["spec_removals"],
                         "corruptions": f["spec_corruptions"], "fixes": f["spec_fixes"],
                         "stop_flips": f["spec_stop_flips"], "start_flips": f["spec_start_flips"],
                         "racing_pushes": f["racing_pushes"]},
            "pushes": {"user": f["user_pushes"], "user_rejected": f["user_pushes_rejected"],
                       "user_pulls_failed": f["user_pulls_failed"],
                       "daemon": f["daemon_pushes"], "daemon_rejected": f["daemon_pushes_rejected"],
                       "daemon_given_up": f["daemon_pushes_given_up"], "rebase_resets": f["daemon_rebase_resets"]},
            "final": {"runs": len(self.timeline), "phases": dict(sorted(phases.items())),
                      "daemon_exit": f["final_daemon_exit"]},
            "faults_picked": {k.removeprefix("fault_"): v for k, v in sorted(f.items()) if k.startswith("fault_")},
            "planted": {k.removeprefix("planted_"): v for k, v in f.items() if k.startswith("planted_")},
            "attempts": self.attempts.figures() if self.attempts is not None else {},
            "ssh": {"machines": len(self.sshds), "sshd_stops": f["sshd_stops"]},
            "slurm": {"cluster": self.cluster is not None, "scancels": f["scancels"],
                      "step_kills": f["slurm_step_kills"],
                      "jobs_seen": len(self.queue.seen) if self.queue is not None else 0,
                      "queue_reads": self.queue.polls if self.queue is not None else 0,
                      "queue_read_failures": self.queue.failures if self.queue is not None else 0},
            "violations": dict(self.violations),
            "violation_count": sum(self.violations.values()),
            "details": self.details[:200],
        }


def print_text(r: dict) -> None:
    d, a, k, s, p = r["daemon"], r["actions"], r["kills"], r["spec_ops"], r["pushes"]
    ps = d["pass_seconds"]
    print(f"soak: seed {r['seed']}, {r['seconds']['faults']:g} s of faults, then {r['seconds']['converge']:g} s to "
          f"converge  (workdir {r['workdir']})")
    print(f"daemon:     {d['passes']} passes ({d['passes_failed']} failed, {d['action_errors']} action errors); "
          f"pass p50 {ps['p50']:.2f} s, p90 {ps['p90']:.2f} s, max {ps['max']:.2f} s; starts: "
          f"{d['starts']['fresh_clone']} on a fresh clone, {d['starts']['same_checkout']} in the same checkout")
    if ps["max"] > r["windows"]["pass_allowance"]:
        print(f"            note: the longest pass exceeded PASS_ALLOWANCE ({r['windows']['pass_allowance']:g} s), "
              "which the windows assume")
    print("actions:    " + ", ".join(f"{k2.replace('_', ' ')} {v}" for k2, v in a.items())
          + f"  (from {r['status_commits']['total']} status commits, {r['status_commits']['refresh_only']} "
          "without a transition)")
    print("planned:    " + ", ".join(f"{k2} {v}" for k2, v in d["planned"].items() if k2 != "none"))
    print(f"kills:      daemon {k['daemon_random']} at random, {k['daemon_after_pass']} right after a pass, "
          f"{k['daemon_mid_rollout']} mid-roll-out; job groups {k['jobs']}")
    je = r["job_ends"]
    print(f"instances:  {je['launches_seen']} launched; ended {je['natural']} by themselves, {je['killed_here']} "
          f"killed here, {je['stopped_by_reconciler']} stopped by the reconciler, {je['unexplained_loss']} lost "
          f"otherwise; at most {je['max_live_groups']} alive at once")
    print(f"spec ops:   {s['edits']} edits, {s['additions']} additions, {s['removals']} removals, "
          f"{s['corruptions']} corruptions ({s['fixes']} fixed), {s['stop_flips']} stop flips "
          f"({s['start_flips']} back), {s['racing_pushes']} racing pushes")
    print(f"pushes:     user {p['user']} ({p['user_rejected']} rejected and retried); daemon {p['daemon']} "
          f"({p['daemon_rejected']} rejected and retried, {p['daemon_given_up']} given up); "
          f"{p['rebase_resets']} rebase resets")
    print(f"final:      {r['final']['runs']} runs: " + ", ".join(f"{v} {k2}" for k2, v in r["final"]["phases"].items())
          + f"; daemon exit {r['final']['daemon_exit']}")
    at = r["attempts"]
    if at:
        print(f"attempts:   {at['samples']} samples of the process table (period p50 {at['period_p50_ms']} ms, "
              f"p99 {at['period_p99_ms']} ms, max {at['period_max_ms']} ms); two attempts of one run alive at "
              f"once: {at['overlap_samples']} samples, {at['overlap_episodes']} episodes (longest "
              f"{at['longest_overlap_s']} s, {at['during_outage']} while an SSH machine was down)")
    if r["ssh"]["machines"]:
        print(f"ssh:        {r['ssh']['machines']} machines (sshd on loopback), {r['ssh']['sshd_stops']} sshd stops")
    sl = r.get("slurm") or {}
    if sl.get("cluster"):
        print(f"slurm:      {sl['jobs_seen']} jobs seen in the queue ({sl['queue_reads']} reads, "
              f"{sl['queue_read_failures']} failed); {sl['scancels']} scancels from outside, "
              f"{sl['step_kills']} job steps killed with kill -9")
    if r["planted"]:
        print("planted:    " + ", ".join(f"{k2} {v}" for k2, v in r["planted"].items()))
    print(f"violations: {r['violation_count']}  (" + ", ".join(f"{k2} {v}" for k2, v in r["violations"].items()) + ")")
    for line in r["details"]:
        print("  " + line)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=600, help="how long faults are injected (default 600)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workdir", type=Path, help="scratch folder (kept); default: a new temporary folder")
    ap.add_argument("--keep", action="store_true", help="keep the temporary scratch folder")
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    ap.add_argument("--runs", type=int, default=6, help="runs at the start (default 6)")
    ap.add_argument("--max-runs", type=int, default=10, help="specs at most at once (default 10)")
    ap.add_argument("--sleep", default="2-20", metavar="MIN-MAX", help="seconds a run's command sleeps (default 2-20)")
    ap.add_argument("--converge-timeout", type=float, help="seconds to wait for the end state")
    ap.add_argument("--plant", action="append", default=[], choices=PLANTABLE,
                    help="self-test: plant a violation the referee must catch")
    ap.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    ap.add_argument("--ssh", type=int, default=0, metavar="N",
                    help="also N SSH machines (sshd on loopback; needs root), stopped now and then")
    ap.add_argument("--slurm", action="store_true",
                    help="also a Slurm cluster on this machine (tests/infra/slurm.py; needs root) that half "
                         "of the runs are submitted to; jobs cancelled and job steps killed now and then")
    ap.add_argument("--source", type=Path, default=ROOT,
                    help="the reconciler source tree the daemon runs (default: this checkout); e.g. an older "
                         "commit unpacked with `git archive COMMIT | tar -x -C DIR`")
    args = ap.parse_args(argv)
    try:
        low, _, high = args.sleep.partition("-")
        sleep = (int(low), int(high or low))
        assert 0 <= sleep[0] <= sleep[1]
    except (ValueError, AssertionError):
        ap.error(f"--sleep: expected MIN-MAX in whole seconds, got {args.sleep!r}")
    soak = Soak(Options(seconds=args.seconds, seed=args.seed, workdir=args.workdir, keep=args.keep,
                        initial_runs=args.runs, max_runs=args.max_runs, sleep=sleep,
                        converge_timeout=args.converge_timeout,
                        plant=tuple(args.plant), progress=not args.quiet, source=args.source.resolve(),
                        ssh=args.ssh, slurm=args.slurm))

    def interrupted(signum, frame):  # noqa: ARG001 - SIGTERM ends the soak like Ctrl-C does
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupted)
    report = None
    try:
        report = soak.run()
    except KeyboardInterrupt:
        print("soak: interrupted; every process it started was killed", file=sys.stderr)
        return 130
    except HarnessError as e:
        print(f"soak: harness error: {e}", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGTERM, previous)
        bad = report is None or report["violation_count"] > 0
        if soak.own_workdir and not args.keep and not bad:
            shutil.rmtree(soak.work, ignore_errors=True)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_text(report)
    return 0 if report["violation_count"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

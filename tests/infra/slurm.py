"""A real Slurm cluster on this machine: munged, slurmctld and two slurmd nodes, all on loopback.

Why a real one: the Slurm placement drives ``sbatch``, ``squeue``, ``scontrol`` and ``scancel``, whose
output formats, job states and timing (a job PENDING before it RUNS, a cancelled job's states, what
is left of a finished job) are what the reconciler has to get right. The cluster is small but whole:

* munge authentication with its own key and socket (root needs ``--force``; the socket's folder is
  world-traversable so other users could submit too);
* two nodes, ``n1`` and ``n2``, both this host (``NodeHostname`` = ``hostname``, ``NodeAddr``
  127.0.0.1, a port each), with 2 CPUs and 2 fake GPUs each: GRES ``gpu`` backed by character
  devices made with ``mknod`` (Slurm refuses regular files), so ``--gres=gpu:N`` is scheduled and
  jobs see ``CUDA_VISIBLE_DEVICES``;
* no accounting daemon: a job's end is read from ``scontrol show job`` (kept ``MinJobAge`` seconds)
  or the job-completion file (``jobcomp.txt``);
* ``batch_sched_delay=0`` so a job starts within about a second.

slurmctld and slurmd listen on all interfaces (Slurm has no bind option); the ports are taken from
the kernel's free ones, nothing else is exposed, and no address outside loopback is configured.
Clients find the cluster through ``SLURM_CONF`` (``cluster.env``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

from tests.infra._proc import descendants, end_pids, wait_until

SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
MUNGED = "/usr/sbin/munged"
NODES = ("n1", "n2")
GPUS_PER_NODE = 2
CPUS_PER_NODE = 2


def _free_ports(n: int) -> list[int]:
    """``n`` ports the kernel calls free now, kept open together so they are distinct."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _free_range(width: int) -> int:
    """The first port of ``width`` consecutive ports that are free now (for srun's port range)."""
    # Each pytest-xdist worker starts its search elsewhere: two clusters starting at once would
    # otherwise both find the same range free.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    start = 41000 + 1940 * (int(worker[2:]) % 8 if worker[2:].isdigit() else 0)
    for base in [*range(start, 60000, 97), *range(41000, start, 97)]:
        ok = True
        for port in range(base, base + width):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free port range for srun")


class SlurmCluster:
    """Attributes: ``env`` (the environment for Slurm's commands), ``conf`` (slurm.conf),
    ``shared`` (a folder every node sees, as a cluster's shared file system), ``jobcomp``."""

    def __init__(self, base: Path):
        self.base = Path(base)
        self.conf = self.base / "slurm.conf"
        self.jobcomp = self.base / "jobcomp.txt"
        self.shared = self.base / "shared"
        self.munge_socket = self.base / "munge" / "munge.socket.2"
        self.env = {"SLURM_CONF": str(self.conf)}
        self._procs: list[subprocess.Popen] = []

    def command(self, *argv: str, check: bool = True) -> str:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30, env={**os.environ, **self.env})
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()}")
        return r.stdout

    def _write_config(self) -> None:
        b = self.base
        for d in ("munge", "state", "log", "dev", *(f"spool/{n}" for n in NODES)):
            (b / d).mkdir(parents=True, exist_ok=True)
        self.shared.mkdir(exist_ok=True)
        os.chmod(self.shared, 0o1777)
        os.chmod(b / "munge", 0o711)
        key = b / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        for i in range(GPUS_PER_NODE * len(NODES)):
            dev = b / "dev" / f"nvidia{i}"
            if not dev.exists():
                os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))  # a character device, like /dev/null
        ctld, *node_ports = _free_ports(1 + len(NODES))
        srun = _free_range(20)
        host = socket.gethostname()
        lines = [
            "ClusterName=rctest",
            f"SlurmctldHost={host}(127.0.0.1)",
            "SlurmUser=root", "SlurmdUser=root",
            f"SlurmctldPort={ctld}",
            f"SrunPortRange={srun}-{srun + 19}",
            "AuthType=auth/munge", f"AuthInfo=socket={self.munge_socket}", "CredType=cred/munge",
            f"StateSaveLocation={b}/state",
            f"SlurmdSpoolDir={b}/spool/%n",
            f"SlurmctldPidFile={b}/slurmctld.pid", f"SlurmdPidFile={b}/slurmd-%n.pid",
            f"SlurmctldLogFile={b}/log/slurmctld.log", f"SlurmdLogFile={b}/log/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/filetxt", f"JobCompLoc={self.jobcomp}",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "MpiDefault=none", "SwitchType=switch/none", "ReturnToService=2",
            "SchedulerParameters=batch_sched_delay=0", "KillWait=5", "MinJobAge=300",
            "GresTypes=gpu",
        ]
        gres = ["AutoDetect=off"]
        for i, (name, port) in enumerate(zip(NODES, node_ports)):
            lines.append(f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
                         f"CPUs={CPUS_PER_NODE} RealMemory=4000 Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN")
            first = i * GPUS_PER_NODE
            gres.append(f"NodeName={name} Name=gpu File={b}/dev/nvidia[{first}-{first + GPUS_PER_NODE - 1}]")
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        (b / "gres.conf").write_text("\n".join(gres) + "\n")
        for f in (self.conf, b / "gres.conf"):
            os.chmod(f, 0o644)  # every submitting user's commands read them

    def start(self) -> "SlurmCluster":
        self._write_config()
        b = self.base
        env = {**os.environ, **self.env}
        self._procs.append(subprocess.Popen(
            [MUNGED, "--foreground", "--force", f"--socket={self.munge_socket}", f"--key-file={b}/munge/munge.key",
             f"--log-file={b}/log/munged.log", f"--pid-file={b}/munge/munged.pid", f"--seed-file={b}/munge/seed"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_until(self.munge_socket.exists, 10, what="munged's socket")
        self._procs.append(subprocess.Popen([SLURMCTLD, "-D", "-i", "-f", str(self.conf)], env=env,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for name in NODES:
            self._procs.append(subprocess.Popen([SLURMD, "-D", "-N", name, "-f", str(self.conf)], env=env,
                                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_until(self._idle, 30, interval=0.1, what="both Slurm nodes idle")
        return self

    def _idle(self) -> bool:
        for p in self._procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args[0]} exited {p.returncode}; see {self.base}/log")
        out = self.command("sinfo", "-h", "-N", "-o", "%N %t", check=False)
        states = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
        return sorted(states) == sorted(NODES) and all(s == "idle" for s in states.values())

    def jobs(self, name: str | None = None, namespace: str | None = None) -> list[dict]:
        """Jobs Slurm still knows (any state), as {id, name, state, reason, user}. ``name``: a run
        identity; its jobs are named rcl-<namespace>-<identity> (any namespace unless given)."""
        argv = ["squeue", "-h", "-t", "all", "-o", "%i|%j|%T|%r|%u"]
        rows = [line.split("|") for line in self.command(*argv).splitlines() if line.count("|") == 4]
        jobs = [{"id": r[0], "name": r[1], "state": r[2], "reason": r[3], "user": r[4]} for r in rows]
        if name:
            jobs = [j for j in jobs if j["name"] == f"rcl-{namespace}-{name}" or namespace is None
                    and j["name"].startswith("rcl-") and j["name"].endswith(f"-{name}")]
        return jobs

    def job_fields(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields of one job."""
        out = self.command("scontrol", "-o", "show", "job", job_id)
        return dict(f.split("=", 1) for f in out.split() if "=" in f)

    def accounting_env(self) -> dict[str, str]:
        """The Slurm commands' environment with a FAKE ``sacct`` first on PATH.

        Slurm records who cancelled a job only in its accounting database (sacct's State
        "CANCELLED by <uid>"), and slurmdbd needs a MySQL server, which cannot run here. The fake
        answers ``sacct -X -n -P -j ID -o State`` the way slurmdbd-backed sacct does, from
        slurmctld's own log line of the cancel ("REQUEST_KILL_JOB JobId=ID uid UID"): the uid is
        the real canceller's, only the database is missing."""
        fake = self.base / "fake-accounting"
        fake.mkdir(exist_ok=True)
        script = fake / "sacct"
        script.write_text(
            "#!/bin/sh\n# FAKE sacct (tests/infra/slurm.py accounting_env): the canceller from slurmctld's log.\n"
            'id=""; while [ $# -gt 0 ]; do [ "$1" = "-j" ] && id="$2"; shift; done\n'
            f'uid=$(sed -n "s/.*REQUEST_KILL_JOB JobId=$id uid \\([0-9]*\\).*/\\1/p" {self.base}/log/slurmctld.log '
            "| tail -n 1)\n"
            '[ -n "$uid" ] && echo "CANCELLED by $uid"\nexit 0\n')
        os.chmod(script, 0o755)
        return {**self.env, "PATH": f"{fake}:{os.environ.get('PATH', '/usr/bin:/bin')}"}

    def close(self) -> None:
        try:
            self.command("scancel", "--user=root", check=False)
            wait_until(lambda: not [j for j in self.jobs() if j["state"] in ("PENDING", "RUNNING", "COMPLETING")],
                       15, raise_on_timeout=False)
        except Exception:  # noqa: BLE001 - tearing down what is left, whatever state it is in
            pass
        pids = []
        for p in reversed(self._procs):
            pids += descendants(p.pid) + [p.pid]
        end_pids(pids)
        for p in self._procs:
            p.wait(timeout=5)
        self._procs.clear()


def available() -> str | None:
    """Why no cluster can start here (None: it can)."""
    if os.geteuid() != 0:
        return "the Slurm fixture needs root (munged --force, mknod)"
    for path in (SLURMCTLD, SLURMD, MUNGED):
        if not os.access(path, os.X_OK):
            return f"{path} not installed"
    for tool in ("sbatch", "squeue", "scontrol", "scancel", "sinfo", "srun"):
        if shutil.which(tool) is None:
            return f"{tool} not installed"
    return None

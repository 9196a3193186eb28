"""Which GPUs of this machine processes the reconciler did not start are using (``foreign_gpus:
avoid``), read from ``nvidia-smi`` by the probe.

Apart from the probe because its answer decides whether a GPU may be handed out: every way of
not knowing (no ``nvidia-smi``, a failure, a hang, an answer that does not parse) must come back as
an error, never as "none in use", so that ``avoid`` fails closed; and what counts as the
reconciler's own process must not rest on anything a job or an engineer can set alone.
Standard library only: it runs on machines with whatever python3 they have.
"""

import os
import subprocess


def _ours(pid):
    """Whether a process was started by a launch wrapper: it runs as this login (the reconciler's)
    AND its environment names a run identity. The variable alone is not enough: anyone can set it,
    so a process of another login (an engineer, or the agent's own login) is never ours, whatever
    it says. An environment we cannot read is not ours either."""
    try:
        if os.stat("/proc/%d" % pid).st_uid != os.getuid():
            return False
        with open("/proc/%d/environ" % pid, "rb") as fh:
            return b"\0RECONCILER_IDENTITY=" in b"\0" + fh.read()
    except OSError:
        return False


MAX_SMI_ROWS = 4096  # GPUs and compute processes of one machine: far more than any has


def foreign_gpus(smi="nvidia-smi", timeout=10):
    """Indices of the GPUs some process not started by the reconciler is using, from nvidia-smi.
    {"gpus": [...]} or {"error": why}: no nvidia-smi, a failure, a timeout or an answer that does
    not parse (an app on a GPU it did not list, a non-numeric index or pid) is an error, never an
    empty list, so that ``foreign_gpus: avoid`` fails closed."""
    def query(*args):
        p = subprocess.run([smi, *args, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                           timeout=timeout, errors="replace")
        if p.returncode != 0:
            raise OSError((p.stderr or p.stdout).strip()[:200] or "exit %d" % p.returncode)
        rows = [[f.strip() for f in line.split(",")] for line in p.stdout.splitlines() if line.strip()]
        if len(rows) > MAX_SMI_ROWS or any(len(r) != 2 for r in rows):
            raise ValueError("unexpected output of nvidia-smi %s" % args[0])
        return rows
    try:
        index = {uuid: int(i) for i, uuid in query("--query-gpu=index,uuid")}
        busy = set()
        for uuid, pid in query("--query-compute-apps=gpu_uuid,pid"):
            if uuid not in index or not pid.isdigit():
                raise ValueError("compute process %r on GPU %r, which the GPU list does not name"
                                 % (pid[:20], uuid[:60]))
            if not _ours(int(pid)):
                busy.add(index[uuid])
        return {"gpus": sorted(busy)}
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        return {"error": "cannot read the GPUs' processes: %s" % (str(e)[:300] or type(e).__name__)}

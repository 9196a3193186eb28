#!/usr/bin/env python3
"""A checkpoint from machine to bucket: storage_sync.py against a raw ``rclone copy``.

    python benchmarks/storage_bench.py [--gb 2] [--files 4] [--rounds 2]

A ``--gb`` checkpoint (``--files`` files of random bytes, no sparse regions, plus a
trainer_state.json written last) is uploaded to a real ``rclone serve s3`` on loopback, in
alternating rounds: (1) ``rclone copy --checksum`` of the folder, the floor (under ``nice -n 10``, the
priority storage_sync.py gives itself and its rclone); (2) the real
``scripts/storage_sync.py watch`` in a workspace whose job has already ended, which uploads the
folder with the same rclone, hashes every file (sha256, in a thread while rclone reads them) for
the manifest, uploads the manifest, prunes, syncs the artifacts and exits. Each round writes to a
new prefix, so nothing is skipped as already there.

Also measured: the sync program's peak resident memory (VmHWM of its python process, sampled
every 50 ms: rclone's own memory is rclone's), and the bytes this process, standing where the
reconciler stands, reads and writes meanwhile (``/proc/self/io``, rchar and wchar): it only reads
runtime/uploads.json, so the checkpoint never crosses it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.infra.storage import S3Server, rclone_binary  # noqa: E402

RUNTIME = ROOT / "reconciler" / "runtime"


def make_checkpoint(folder: Path, gb: float, files: int) -> int:
    folder.mkdir(parents=True)
    per = int(gb * (1 << 30)) // files
    for i in range(files):
        with open(folder / f"model-{i:05d}-of-{files:05d}.safetensors", "wb") as fh:
            left = per
            while left:
                n = min(left, 8 << 20)
                fh.write(os.urandom(n))
                left -= n
    (folder / "trainer_state.json").write_text('{"global_step": 100}')
    return per * files


def io_bytes() -> int:
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["rchar"]) + int(fields["wchar"])


def hwm_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def raw_copy(s3: S3Server, ckpt: Path, prefix: str) -> float:
    env = {"PATH": os.environ["PATH"], **s3.env()}
    t = time.monotonic()
    # At storage_sync's priority (it runs niced by 10, rclone included, so that the job comes first):
    # on a busy machine a niced upload is slower by design, and that is not the overhead measured.
    subprocess.run(["nice", "-n", "10", rclone_binary(), "--config", os.devnull, "-q", "copy", "--checksum", str(ckpt),
                    f"store:{s3.bucket}/{prefix}/checkpoint-100"], env=env, check=True)
    return time.monotonic() - t


def sync_upload(s3: S3Server, ckpt: Path, scratch: Path, prefix: str) -> tuple[float, int, int]:
    ws = scratch / f"ws-{prefix}"
    for d in ("scripts", "runtime", "artifacts/output"):
        (ws / d).mkdir(parents=True)
    for name in ("storage_sync.py", "storage_fetch.py", "storage_common.py"):
        shutil.copy(RUNTIME / name, ws / "scripts" / name)
    os.rename(ckpt, ws / "artifacts" / "output" / "checkpoint-100")  # moved in: a link would be skipped
    (ws / "artifacts" / "stdout.log").write_text("step 100\n")
    (ws / "runtime" / "result.json").write_text('{"state": "succeeded", "exit_code": 0}')
    (ws / "scripts" / "storage.json").write_text(json.dumps({
        "schema_version": 1, "remote": "store", "base": f"{s3.bucket}/{prefix}", "attempt": 1,
        "keep_checkpoints": 2, "interval_s": 30, "bwlimit": "", "rclone": rclone_binary(),
        "resume": False, "pinned": None}))
    before = io_bytes()
    t = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(ws / "scripts" / "storage_sync.py"), "watch", str(ws)],
                            stdin=subprocess.PIPE, env={"PATH": os.environ["PATH"]})
    proc.stdin.write(s3.env_lines().encode())
    proc.stdin.close()
    peak = 0
    try:
        # WNOWAIT: the exit is seen but the child not reaped yet, so that its I/O (and rclone's,
        # which it reaped) is not yet added to this process's /proc/self/io.
        while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            peak = max(peak, hwm_kb(proc.pid) or 0)
            time.sleep(0.05)
        took = time.monotonic() - t
        state = json.loads((ws / "runtime" / "uploads.json").read_text())
        crossed = io_bytes() - before
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.returncode == 0 and state["error"] is None, state
    assert [c["name"] for c in state["checkpoints"]] == ["checkpoint-100"]
    os.rename(ws / "artifacts" / "output" / "checkpoint-100", ckpt)  # back, for the next round
    return took, peak, crossed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="storage-bench-"))
    s3 = S3Server(scratch / "s3")
    try:
        s3.scratch.mkdir(parents=True)
        s3.start()
        ckpt = scratch / "checkpoint-100"
        size = make_checkpoint(ckpt, args.gb, args.files)
        print(f"checkpoint: {size / 1e9:.2f} GB in {args.files} files; load average {os.getloadavg()[0]:.1f}")
        raws, syncs = [], []
        for r in range(args.rounds):
            raws.append(raw_copy(s3, ckpt, f"raw{r}"))
            took, peak, crossed = sync_upload(s3, ckpt, scratch, f"sync{r}")
            syncs.append(took)
            print(f"round {r + 1}: raw rclone copy {raws[-1]:.1f} s ({size / raws[-1] / 1e6:.0f} MB/s); "
                  f"storage_sync {took:.1f} s ({took / raws[-1]:.2f}x); sync program peak RSS {peak / 1024:.1f} MB; "
                  f"bytes read+written by this (reconciler-side) process meanwhile: {crossed:,}")
            for p in (f"raw{r}", f"sync{r}"):  # keep the disk to one round's worth
                shutil.rmtree(s3.data / s3.bucket / p, ignore_errors=True)
        print(f"median: raw {sorted(raws)[len(raws) // 2]:.1f} s, storage_sync {sorted(syncs)[len(syncs) // 2]:.1f} s, "
              f"ratio {sorted(syncs)[len(syncs) // 2] / sorted(raws)[len(raws) // 2]:.2f}x; "
              f"load average {os.getloadavg()[0]:.1f}")
    finally:
        s3.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

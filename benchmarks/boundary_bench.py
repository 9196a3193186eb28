"""What the trust boundary costs: transfers and probe replies at real sizes.

Two figures decide whether the boundary can stay on the hot paths:

- **transfers**: a collection or checkpoint copy unpacked by ``safetar`` (every file written by
  hand through descriptors opened without following links) against tarfile's own extraction with
  the ``data`` filter, on the same stream: a few large files (a checkpoint's shards) and many small
  ones (logs, a tokenizer's files). The stream is spooled on disk as collection spools it.
- **probe replies**: ``boundary.loads`` + ``parse_probe`` over a reply for N runs on one machine
  (each with progress and 20 checkpoints, the shape a busy training machine answers), in time per
  run and peak memory of the decode.

    python benchmarks/boundary_bench.py [--large-mb 1024] [--small 5000] [--runs 1000]

Prints one line per figure. Nothing leaves /tmp; everything is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reconciler.core import boundary
from reconciler.artifacts import safetar  # noqa: E402


def build_stream(path: Path, large_mb: int, small: int) -> tuple[int, int]:
    """A plain tar: four shards of large_mb/4 MiB each and ``small`` files of 2 KiB."""
    chunk = os.urandom(1 << 20)
    files = 0
    total = 0
    src = path.parent / "src"
    ck = src / "artifacts" / "checkpoints" / "checkpoint-1000"
    ck.mkdir(parents=True)
    for i in range(4):
        with open(ck / f"model-{i:05d}-of-00004.safetensors", "wb") as f:
            for _ in range(max(1, large_mb // 4)):
                f.write(chunk)
                total += len(chunk)
        files += 1
    logs = src / "artifacts" / "logs"
    logs.mkdir(parents=True)
    small_body = os.urandom(2048)
    for i in range(small):
        (logs / f"part-{i:06d}.jsonl").write_bytes(small_body)
        total += len(small_body)
        files += 1
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(src / "artifacts", arcname="artifacts")
    shutil.rmtree(src)
    return files, total


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_transfers(large_mb: int, small: int) -> None:
    with tempfile.TemporaryDirectory(prefix="rc-boundary-bench-") as tmp:
        tmp = Path(tmp)
        stream = tmp / "stream.tar"
        files, total = build_stream(stream, large_mb, small)
        mb = total / 1e6

        def ours() -> None:
            dest = tmp / "ours"
            dest.mkdir()
            with open(stream, "rb") as f:
                res = safetar.unpack(f, dest, limits=safetar.Limits(max_bytes=total * 2, max_files=files * 2))
            assert res.files == files and res.complete, res.note()

        def theirs() -> None:
            dest = tmp / "tarfile"
            dest.mkdir()
            with tarfile.open(stream, "r|") as tar:
                tar.extractall(dest, filter="data")

        for name, fn, folder in (("safetar", ours, "ours"), ("tarfile data filter", theirs, "tarfile")):
            best = None
            for _ in range(3):
                shutil.rmtree(tmp / folder, ignore_errors=True)
                os.sync()
                t = timed(fn)
                best = t if best is None else min(best, t)
            print(f"transfer  {name:<20} {files} files, {mb:,.0f} MB: best of 3 {best:.2f} s = {mb / best:,.0f} MB/s")
            shutil.rmtree(tmp / folder, ignore_errors=True)


def reply(runs: int) -> bytes:
    entries = {}
    for i in range(runs):
        ident = f"run-{i:05d}-g1-a1"
        entries[ident] = {
            "state": "running", "pid": 10_000 + i, "workspace": f"/srv/ws/r-abc/{ident}", "gpus": [i % 8],
            "started_at": 1.7e9, "spec_digest": "sha256:" + "ab" * 32, "heartbeat_age": 1.5,
            "message": "", "progress": {"step": 400, "max_steps": 1000, "loss": 1.2345, "lr": 1e-5, "epoch": 0.4},
            "checkpoints": [f"artifacts/v0-20260101-000000/checkpoint-{50 * k}" for k in range(1, 21)],
        }
    return json.dumps({"root": "/srv/ws/r-abc", "runs": entries}).encode()


def bench_replies(runs: int) -> None:
    data = reply(runs)
    boundary.parse_probe(boundary.loads(data))  # warm pydantic's validators
    best = None
    for _ in range(5):
        t = timed(lambda: boundary.parse_probe(boundary.loads(data)))
        best = t if best is None else min(best, t)
    plain = min(timed(lambda: json.loads(data)) for _ in range(5))
    tracemalloc.start()
    boundary.parse_probe(boundary.loads(data))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"probe     {runs} runs, reply {len(data) / 1e6:.2f} MB: loads+parse best of 5 {best * 1e3:.0f} ms "
          f"({best / runs * 1e6:.0f} µs per run; json.loads alone {plain * 1e3:.0f} ms); "
          f"peak {peak / 1e6:.0f} MB ({peak / len(data):.1f}x the reply)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--large-mb", type=int, default=1024, help="MiB in the four large files together")
    ap.add_argument("--small", type=int, default=5000, help="number of 2 KiB files")
    ap.add_argument("--runs", type=int, default=1000, help="runs in the probe reply")
    args = ap.parse_args()
    bench_transfers(args.large_mb, args.small)
    bench_replies(args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())

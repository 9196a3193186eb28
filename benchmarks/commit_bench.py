"""Benchmark: a status commit of N changed files against ``git add`` + ``git commit`` of the same files.

A scratch repository like the scale benchmark's (R run specs and R status files, committed), then
rounds that alternate the two ways of committing N changed status files: the reconciler's
``gitops.commit_status`` (one ``git status``, one ``git fast-import``, ``update-ref``,
``update-index``) and the git command line (``git add -- PATHS`` + ``git commit -m``). Each round
rewrites the same N files with new content first. Printed per way: median CPU (this process plus
its children, so the git processes count), median wall, and the number of processes it started
(counted by wrapping ``subprocess``'s process creation); with the load average, since the machine
may be shared.

    python benchmarks/commit_bench.py [--files 100] [--runs 10000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reconciler.gitops import repo as gitops  # noqa: E402

AUTHOR = gitops.Author("reconciler", "reconciler@localhost")


def cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


class Spawns:
    """Counts the processes this process starts (every ``subprocess`` call goes through Popen)."""

    def __init__(self) -> None:
        self.count = 0
        self._init = subprocess.Popen.__init__
        spawns = self

        def counting(popen, *args, **kwargs):
            spawns.count += 1
            spawns._init(popen, *args, **kwargs)

        subprocess.Popen.__init__ = counting


def status_text(i: int, round_no: int) -> str:
    return (f"# Written by the reconciler. Do not edit: it is rewritten on every change.\napiVersion: reconciler/v1\n"
            f"kind: RunStatus\nname: run-{i:05d}\nphase: Running\ngeneration: 1\nattempt: {round_no}\n"
            f"message: round {round_no}\nobserved_at: '2026-11-26T03:00:{round_no % 60:02d}Z'\n")


def build(root: Path, runs: int) -> None:
    for sub in ("specs/runs", "status"):
        (root / sub).mkdir(parents=True)
    for i in range(runs):
        (root / "specs" / "runs" / f"run-{i:05d}.yaml").write_text(
            f"apiVersion: reconciler/v1\nkind: Run\nmetadata: {{name: run-{i:05d}}}\nspec:\n  template: t\n")
        (root / "status" / f"run-{i:05d}.yaml").write_text(status_text(i, 0))
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "initial"]):
        subprocess.run(["git", "-C", str(root), *args], check=True, env=git_env())


def git_env() -> dict[str, str]:
    return {**os.environ, "GIT_AUTHOR_NAME": AUTHOR.name, "GIT_AUTHOR_EMAIL": AUTHOR.email,
            "GIT_COMMITTER_NAME": AUTHOR.name, "GIT_COMMITTER_EMAIL": AUTHOR.email}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=100)
    ap.add_argument("--runs", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="rc-commit-bench-"))
    try:
        root = tmp / "repo"
        build(root, args.runs)
        repo = gitops.open_repo(root)
        step = max(1, args.runs // args.files)
        paths = [f"status/run-{i * step:05d}.yaml" for i in range(args.files)]
        spawns = Spawns()
        results: dict[str, list[tuple[float, float, int]]] = {"reconciler": [], "git CLI": []}
        round_no = 0
        for _ in range(args.rounds):
            for way in results:
                round_no += 1
                for p in paths:
                    (root / p).write_text(status_text(int(p[11:16]), round_no))
                c0, t0, n0 = cpu(), time.perf_counter(), spawns.count
                if way == "reconciler":
                    made = gitops.commit_status(repo, lambda ps: gitops.transitions_message([], files=len(ps)), AUTHOR)
                    assert made is not None and len(made.paths) == args.files
                else:
                    subprocess.run(["git", "-C", str(root), "add", "--", *paths], check=True, env=git_env())
                    subprocess.run(["git", "-C", str(root), "commit", "-q", "-m", f"status: {args.files} file(s) updated"],
                                   check=True, env=git_env())
                results[way].append((cpu() - c0, time.perf_counter() - t0, spawns.count - n0))
                clean = subprocess.run(["git", "-C", str(root), "status", "--porcelain"], capture_output=True,
                                       text=True, check=True).stdout
                assert clean == "", f"{way} left the checkout unclean: {clean[:200]}"
        print(f"status commit of {args.files} changed files in a repository of {args.runs} specs and "
              f"{args.runs} status files, {args.rounds} alternated rounds; load average "
              f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        base = statistics.median(c for c, _, _ in results["git CLI"])
        for way, rows in results.items():
            c = statistics.median(r[0] for r in rows)
            print(f"  {way:10s}: median {c:.3f}s CPU (incl. children; {c / base:.2f}x the git CLI), "
                  f"{statistics.median(r[1] for r in rows):.3f}s wall, {rows[0][2]} processes"
                  f" (CPU per round: {', '.join(f'{r[0]:.3f}' for r in rows)})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

"""A run's last workspace goes only once git holds its end.

On a machine other than this one, the workspace is the only record of how an attempt ended until
the status that records it is in git. Removing it in the pass that collects it would leave a pass
killed between the collection and its commit (or push) with nothing: a fresh clone would read
the run as still running, find nothing on the machine, and record a success as lost. So the final
collection only marks the workspace collected, and a later pass removes it once the status file
at the ref that others clone from (the remote's branch as last fetched or pushed; HEAD where the
checkout has no remote) records that end: the same phase, generation and attempt.
"""

from __future__ import annotations

import subprocess

from reconciler.core.actions import Action
from reconciler.core.names import LOCAL
from reconciler.core.plan import Change
from reconciler.gitops import repo as gitops
from reconciler.status import store as statuses

ENDS = ("Succeeded", "Failed", "Terminated")


def add_removals(cfg, plan, world, previous: dict) -> None:
    """Append to ``plan`` the removal of every ended run's last remote workspace, collected, whose
    end git holds (a side change: the run's status is left as it is)."""
    if cfg.remote_cleanup != "after_collect":
        return
    busy = {c.name for c in plan.changes if c.mutates}
    todo = {}
    for name, st in previous.items():
        if st.phase not in ENDS or st.handle is None or not st.handle.identity or name in busy:
            continue
        done = [n for r in world.instances(name) if r.identity == st.handle.identity for n in (r.nodes or [r])
                if awaits_removal(n, cfg)]
        if done:
            todo[name] = (st, done)
    if not todo:
        return
    texts = blobs_at(cfg, [f"status/{n}.yaml" for n in todo])
    for name, (st, done) in todo.items():
        if statuses.head_key(texts.get(f"status/{name}.yaml")) != (st.phase, st.generation, st.attempt):
            continue  # not in git yet (or not pushed): the workspace stays, marked collected
        for n in done:
            plan.changes.append(Change(
                name, Action.COLLECT, "EndRecorded",
                f"git records {st.handle.identity} as {st.phase}: removing its workspace on {n.machine}", None,
                identity=n.identity, machine=n.machine, workspace=n.workspace, remove=True, ran=False))


def awaits_removal(r, cfg) -> bool:
    """An ended, collected workspace on a machine other than this one, which a later pass removes."""
    return (cfg.remote_cleanup == "after_collect" and r.machine != LOCAL and r.collected and not r.alive
            and not r.lingering and r.state != "unknown")


def _ref(cfg) -> str | None:
    """What a fresh clone would read: the remote's branch where there is a remote, else HEAD."""
    url = gitops.run_git(cfg.repo, "config", "--get", f"remote.{cfg.remote}.url", check=False).stdout.strip()
    if not url:
        return "HEAD"
    branch = cfg.branch or gitops.current_branch(cfg.repo)
    return f"refs/remotes/{cfg.remote}/{branch}" if branch else None


def blobs_at(cfg, paths: list[str]) -> dict[str, str | None]:
    """The files' texts at ``_ref`` (None where it has none), with one ``git cat-file --batch``."""
    ref = _ref(cfg)
    if ref is None or not paths:
        return {}
    query = "".join(f"{ref}:{p}\n" for p in paths).encode()
    try:
        proc = subprocess.run(["git", "-C", str(cfg.repo), "cat-file", "--batch"], input=query, capture_output=True,
                              env=gitops.git_env(), timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if proc.returncode != 0:
        return {}
    out, pos, found = proc.stdout, 0, {}
    for p in paths:
        eol = out.find(b"\n", pos)
        if eol < 0:
            break
        header = out[pos:eol].split()
        pos = eol + 1
        found[p] = None
        if len(header) == 3 and header[1] == b"blob" and header[2].isdigit():
            size = int(header[2])
            found[p] = out[pos:pos + size].decode("utf-8", "replace")
            pos += size + 1
    return found

"""Where a relaunch resumes from, found on the machine and named as its job sees it.

A relaunch of the same generation resumes from the newest complete checkpoint of its previous
attempts: on the same machine, where it lies; on a new rental, the copy taken off the old one,
staged with the bundle (rentals/checkpoints.py). The machine's answer is a path the reconciler
writes into the run's config and, in a container, mounts: it is taken only as one of the folders
asked about plus ``checkpoint-N``.
"""

from __future__ import annotations

import shlex

from reconciler.core.identity import make, node_identity, parse
from reconciler.core.plan import Change


def vm_resume(c: Change, ctx, entry, t, identity: str):
    """(what the task resumes from, the VM store's checkpoint to stage) for a run without a Storage:
    a checkpoint of a previous attempt on this machine, else the copy taken off the old rental.
    A command run resumes from its previous attempt whenever it left a checkpoint (docs/rentals.md)."""
    from reconciler.rentals import checkpoints

    prior = checkpoints.previous_attempt(identity) if entry.run.spec.task.type == "command" else c.resume_from
    if not prior:
        return None, None
    resume = on_the_machine(t, prior)
    if resume is not None:
        return resume, None
    # Not on this machine (a new rental): the copy taken off the old one, staged with the bundle.
    p = parse(prior)
    saved = checkpoints.latest(ctx.repo / ".reconciler", p.name, p.generation) if p else None
    if saved is None:
        return None, None
    # inputs/.reconciler/: a path no repository input can take
    return f"{t.workspace(identity)}/inputs/.reconciler/resume/{saved.name}", saved


def as_the_run_sees(resume: str | None, workspace: str, docker: bool) -> tuple[str | None, list]:
    """The checkpoint a relaunch resumes from as its job sees it, and the read-only mounts that
    needs: in a container, its own workspace is /bundle and another one is mounted
    (rentals/checkpoints.py ``container_view``); outside one, the machine's path as it is."""
    if not docker or not resume:
        return resume, []
    from reconciler.rentals import checkpoints

    seen, mount = checkpoints.container_view(resume, workspace)
    return seen, [mount] if mount else []


def env_for(entry, resume: str | None) -> dict[str, str]:
    """A command run learns its checkpoint from the environment (RECONCILER_RESUME_DIR), as it sees it."""
    if entry.run.spec.task.type != "command" or not resume:
        return {}
    from reconciler.rentals import checkpoints

    return {checkpoints.RESUME_ENV: resume}


def on_the_machine(t, prior: str) -> str | None:
    """The latest complete checkpoint of the previous attempts on this machine, newest attempt first.

    ``prior`` is the failed attempt's identity; when it died before saving anything, the
    attempt before it (which it resumed from) may still hold one. A checkpoint counts only once its
    ``trainer_state.json`` exists: a kill in the middle of a save leaves a folder without it.
    One round trip; None when there is nothing to resume from (the run then starts over).
    """
    p = parse(prior)
    idents = [make(p.name, p.generation, a) for a in range(p.attempt, 0, -1)] if p else [prior]
    # A run on several machines saves its checkpoints on node 0: that node's workspaces too.
    idents = [x for i in idents for x in (i, node_identity(i, 0))]
    outs = " ".join(shlex.quote(f"{t.workspace(i)}/artifacts/output") for i in idents)
    script = (f"for d in {outs}; do\n"
              "  [ -d \"$d\" ] || continue\n"
              "  best=$(cd \"$d\" && for c in checkpoint-*; do [ -f \"$c/trainer_state.json\" ] && echo \"$c\"; done"
              " | sort -t- -k2 -n | tail -n 1)\n"
              "  if [ -n \"$best\" ]; then echo \"$d/$best\"; exit 0; fi\n"
              "done\n")
    r = t.sh(script, timeout=30)
    return checkpoint_reply(r.out, [f"{t.workspace(i)}/artifacts/output" for i in idents]) if r.rc == 0 else None


def checkpoint_reply(out: str, folders: list[str]) -> str | None:
    """The machine's answer, taken only as one of the folders asked about plus ``/checkpoint-N``:
    it becomes a path in the run's config and, in a container, a mount (nothing from a machine
    is trusted)."""
    found = out.strip()
    folder, _, leaf = found.rpartition("/")
    ok = folder in folders and leaf.startswith("checkpoint-") and leaf[len("checkpoint-"):].isdigit() \
        and leaf[len("checkpoint-"):].isascii()
    return found if ok else None

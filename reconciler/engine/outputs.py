"""A run's outputs in object storage, as the engine wires them: launch, observation, status.

A run with a Storage (its spec.outputs.storage, else the Policy's defaultStorage) never sends a
checkpoint through the reconciler host: at launch the engine writes ``scripts/storage.json`` into
the bundle (where to upload, whether to resume, a pinned checkpoint), hands the machine the remote's
settings and credentials as ``runtime/storage.env`` (the secrets' channel), and has rclone
installed there; the machine uploads and reports in ``runtime/uploads.json``. Each pass, what a
machine reported is held to the run's own folder of the bucket (core/uploads.py) and becomes the
status's ``outputs``. A run without a Storage is left exactly as before (the VM store of
rentals/checkpoints.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from reconciler.artifacts import storage as st
from reconciler.core.errors import PermanentError, TemporaryError
from reconciler.core.identity import parse
from reconciler.core.uploads import BadUploads, parse_uploads

RESUME_LATEST = "inputs/.reconciler/resume/latest"  # where the machine puts the checkpoint it resumes from


@dataclass
class StorageLaunch:
    """What one launch of a run with a Storage needs: the bundle's storage.json, the machine's
    storage.env, what the task resumes from, and the status's outputs as of the launch."""

    storage: Any
    base: str
    config: dict
    env: dict[str, str] = field(repr=False)  # holds credentials: never logged, never in a status
    resume_from: str | None
    outputs: dict
    installed: str = ""  # rclone's path on the machine


def run_storage(desired, run):
    """The Storage a run writes its outputs to, or None (the VM store). A name that finds no valid
    Storage is a permanent error: validation reports it, and it must never fall back silently."""
    name = run.spec.outputs.storage if run.spec.outputs is not None else None
    if name is None and desired.policy is not None:
        name = desired.policy.spec.defaultStorage
    if name is None:
        return None
    found = desired.storages.get(name)
    if found is None:
        raise PermanentError(f"Storage '{name}' does not exist or is invalid")
    return found


def has_storage(desired, name: str) -> bool:
    entry = desired.runs.get(name)
    try:
        return entry is not None and run_storage(desired, entry.run) is not None
    except PermanentError:
        return True  # it asks for one: never the VM store


def credential_refusals(desired, run, storage) -> list[str]:
    """The Storage's credentials go to the run's machine: the run must be granted each of them."""
    from reconciler.spec.checks.secrets import provider_credentials
    from reconciler.spec.models.policy import secret_refusal

    policy = desired.policy.spec if desired.policy is not None else None
    label = policy.teamLabel if policy is not None else "team"
    team = run.metadata.labels.get(label)
    out = []
    for option, secret in sorted(storage.spec.credentials.items()):
        why = secret_refusal(policy.secrets if policy is not None else None, run.metadata.name, team, secret,
                             provider_credentials(desired.files), label)
        if why:
            out.append(f"Storage {storage.metadata.name} credential {option}: {why}")
    return out


def prepare(ctx, c, entry, t, identity: str, docker: bool = False) -> StorageLaunch | None:
    """Everything a launch of ``c`` needs for its Storage, or None when the run has none. Nothing is
    written anywhere yet: a launch that cannot proceed leaves nothing behind."""
    run = entry.run
    storage = run_storage(ctx.desired, run)
    if storage is None:
        return None
    refused = credential_refusals(ctx.desired, run, storage)
    if refused:
        raise PermanentError("; ".join(refused))
    env = st.machine_env(storage, ctx.secret_source)
    p = parse(identity)
    generation, attempt = (p.generation, p.attempt) if p else (c.generation, c.attempt)
    base = st.run_base(storage, ctx.repo_id, run.metadata.name, generation)
    outputs = run.spec.outputs
    keep = outputs.keep_checkpoints if outputs is not None and outputs.keep_checkpoints else None
    # A relaunch resumes from the generation's own newest checkpoint in the bucket, if it has one;
    # a first attempt, or a relaunch before any upload, starts from the pinned one (if any).
    own = _own_checkpoints(ctx, storage, base) if c.resume_from is not None else []
    pinned = _pin(storage, outputs) if not own else None
    resume = bool(own)
    resume_from = f"{t.workspace(identity)}/{RESUME_LATEST}" if resume or pinned else None
    from reconciler.machines import rclone

    installed = rclone.install(t)  # once per machine (its checksum is checked each time)
    config = st.storage_json(storage, base, attempt, rclone.WORKSPACE_PATH if docker else installed,
                             resume, keep, pinned)
    status = {"storage": storage.metadata.name, "uri": st.status_uri(storage, base), "checkpoints": [],
              "artifacts": st.status_uri(storage, f"{base}/a{attempt}"), "resumed_from": None, "error": None}
    return StorageLaunch(storage, base, config, env, resume_from, status, installed)


def _pin(storage, outputs) -> dict | None:
    """spec.outputs.start_from as storage.json's ``pinned`` (machine URIs)."""
    start = outputs.start_from if outputs is not None else None
    if start is None:
        return None
    try:
        uri = st.to_machine_uri(storage, start.uri)
    except ValueError as e:
        raise PermanentError(f"spec.outputs.start_from: {e}") from None
    return {"checkpoint": start.checkpoint, "uri": uri, "manifest_sha256": start.manifest_sha256}


def _own_checkpoints(ctx, storage, base: str) -> list[str]:
    """The complete checkpoints of this run generation in the bucket (a manifest beside each),
    newest first: what a relaunch resumes from. Read from the reconciler host (a listing, no
    data); a listing that fails is not an empty bucket, so the launch waits for the next pass."""
    try:
        entries = st.list_objects(storage, ctx.secret_source, f"{base}/checkpoints", recursive=False, timeout=60)
    except (TemporaryError, PermanentError) as e:
        raise TemporaryError(f"cannot list the run's checkpoints in Storage {storage.metadata.name}: {e}") from None
    names = {e["path"][:-5] for e in entries if not e["is_dir"] and e["path"].endswith(".json")}
    dirs = {e["path"] for e in entries if e["is_dir"]}
    done = [n for n in names & dirs if n.startswith("checkpoint-") and n[11:].isdigit()]
    return sorted(done, key=lambda n: int(n[11:]), reverse=True)


def into_container(t, sl: StorageLaunch, workspace: str) -> None:
    """A docker launch: the machine's rclone copied into the staged workspace, which the container
    mounts (storage.json names it there)."""
    from reconciler.machines import rclone

    if sl.installed and sl.config["rclone"] == rclone.WORKSPACE_PATH:
        rclone.into_workspace(t, workspace, sl.installed)


def keep_of(storage, run) -> int:
    outputs = run.spec.outputs
    return outputs.keep_checkpoints if outputs is not None and outputs.keep_checkpoints else storage.spec.keep_checkpoints


# ---------------------------------------------------------------- observation → status


def bind(desired, repo_id: str, world, previous: dict) -> None:
    """Hold every observed uploads.json to its run's folder of the bucket, in place: a report that
    names anything outside it is dropped with its reason (``uploads_error``), for that run only;
    then the instance's ``outputs`` for its status (``previous``: the runs' statuses, whose
    checkpoints of the same generation are kept beside the new ones)."""
    for name, entry in desired.runs.items():
        try:
            storage = run_storage(desired, entry.run)
        except PermanentError:
            storage = None
        for obs in world.instances(name) if storage is not None else ():
            if obs.uploads is None:
                continue
            p = parse(obs.identity)
            if p is None:
                continue
            base = st.run_base(storage, repo_id, name, p.generation)
            pin = _pin_uri(storage, entry.run)
            try:
                obs.uploads = parse_uploads(obs.uploads, base, pin)
            except BadUploads as e:
                obs.uploads, obs.uploads_error = None, f"runtime/uploads.json refused: {e}"
            new = status_outputs(storage, base, p.attempt, obs.uploads, obs.uploads_error)
            prev = previous.get(name)
            obs.outputs = merged(getattr(prev, "outputs", None), new, keep_of(storage, entry.run))


def merged(prev: dict | None, new: dict, keep: int) -> dict:
    """``new`` with the checkpoints ``prev`` recorded for the same generation's folder (an earlier
    attempt's uploads are still in the bucket), newest first, at most ``keep``."""
    ckpts = {c["name"]: c for c in new["checkpoints"]}
    if isinstance(prev, dict) and prev.get("uri") == new["uri"] and isinstance(prev.get("checkpoints"), list):
        for c in prev["checkpoints"]:
            if isinstance(c, dict) and isinstance(c.get("name"), str) and c["name"][11:].isdigit():
                ckpts.setdefault(c["name"], c)
    order = sorted(ckpts.values(), key=lambda c: int(c["name"][11:]), reverse=True)
    return dict(new, checkpoints=order[:keep])


def hold_while_uploading(desired, world) -> None:
    """An attempt of a run with a Storage whose job has ended while its uploader still runs (the
    last checkpoint and the artifacts go up after the result is written) is still running: it
    is neither collected nor cleaned up, nor its leftover process fenced, until the upload ends.
    The uploader bounds its last round itself (storage_sync.py), so this ends."""
    for name in desired.runs:
        if not has_storage(desired, name):
            continue
        for obs in world.instances(name):
            final = bool(obs.uploads and (obs.uploads.get("artifacts") or {}).get("final"))
            if obs.state in ("succeeded", "failed") and obs.live > 0 and obs.uploads is not None and not final:
                obs.state, obs.message = "running", "the job has ended; uploading its last outputs"


def _pin_uri(storage, run) -> str | None:
    try:
        pin = _pin(storage, run.spec.outputs)
    except PermanentError:
        return None
    return pin["uri"] if pin else None


def status_outputs(storage, base: str, attempt: int, uploads: dict | None, error: str | None) -> dict:
    """The status's ``outputs`` from a checked uploads.json: URIs named by the Storage (usable with
    its RCLONE_CONFIG_<NAME>_* variables), no secret, a fixed key order."""
    def uri(u: str) -> str:
        return st.to_status_uri(storage, u)

    up = uploads or {}
    arts = up.get("artifacts")
    resumed = up.get("resumed_from")
    return {
        "storage": storage.metadata.name,
        "uri": st.status_uri(storage, base),
        "checkpoints": [{"name": c["name"], "uri": uri(c["uri"]), "manifest_sha256": c["manifest_sha256"],
                         "bytes": c["bytes"], "uploaded_at": int(c["uploaded_at"])} for c in up.get("checkpoints", [])],
        "artifacts": uri(arts["uri"]) if arts else st.status_uri(storage, f"{base}/a{attempt}"),
        "resumed_from": ({"name": resumed["name"], "uri": uri(resumed["uri"]),
                          "manifest_sha256": resumed["manifest_sha256"]} if resumed else None),
        "error": error or up.get("error"),
    }

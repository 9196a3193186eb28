"""``reconcile reproduce NAME``: a new Run spec pinned to what a finished run was made of.

Reproducing a run should be a pull request like any other change: so the command writes a spec
file (``specs/runs/<NEW>.yaml`` by default) and changes nothing else. Its content comes from the
run's provenance manifest (what it really ran: the task, the template, the code commit, the
inputs, the image) and the bundle's ``job.json`` beside it (the resources it got, its labels and
secret names), not from the spec as it stands today, which may have moved on. Pins the Run spec
has no field for (the inputs' content hashes, the spec commit, the environment's versions, an
image that the template does not let a run override) are written as comments at the top, so the
reviewer sees them and ``reconcile provenance NEW --diff NAME`` can check them once it has run.

``--checkpoint N`` also pins ``spec.outputs.start_from`` to the run's checkpoint-N in its Storage:
its manifest is read from the bucket now and its sha256 must be the one the run recorded when it
uploaded it (and the files it lists must be there with their sizes); a manifest changed since is
refused, never pinned. The machine checks the same sha256 again at launch.

The file is written byte-stably (``core/yamlemit``: the same run gives the same bytes), never
over an existing file, and is checked the way ``reconcile validate`` checks it before the command
reports success (a file that fails is removed).
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any

from reconciler.core.boundary import clean_text
from reconciler.core.errors import PermanentError, UsageError
from reconciler.status import store as statuses

from .common import _cfg, no_such_run, status_names

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def _text(value: Any, limit: int = 200) -> str:
    """A value from a manifest as a comment may hold it: one line, printable, bounded."""
    return clean_text(value if isinstance(value, str) else str(value), limit)


def _drop_none(value: Any) -> Any:
    """A model dump without its unset fields: what a person would have written."""
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def load_original(cfg, name: str) -> tuple[dict, dict, str]:
    """The run's provenance manifest, the job.json beside it and its identity."""
    from reconciler.artifacts.provenance import locate, read_json

    path, ident = locate(cfg, name)
    if path is None:
        raise PermanentError(f"cannot reproduce {name}: {ident}")
    manifest, why = read_json(path)
    if manifest is None or not isinstance(manifest.get("reproducibility"), dict):
        raise PermanentError(f"cannot reproduce {name}: {path}: not a readable provenance manifest ({why})")
    job, _ = read_json(path.parent.parent / "job.json")
    payload = job.get("payload") if isinstance(job, dict) and isinstance(job.get("payload"), dict) else {}
    return manifest, payload, ident


def _overrides(repro: dict, job: dict, notes: list[str]) -> dict:
    """Resources and image as the original got them, where they differ from the template's
    defaults: as overrides where the template allows them, else as notes."""
    template = repro.get("template") if isinstance(repro.get("template"), dict) else {}
    defaults = template.get("defaults") if isinstance(template.get("defaults"), dict) else {}
    allowed = template.get("allow_overrides") if isinstance(template.get("allow_overrides"), list) else []
    out: dict[str, Any] = {}
    got, default = job.get("resources"), defaults.get("resources") or {}
    if isinstance(got, dict) and isinstance(default, dict):
        changed = {k: v for k, v in got.items() if v is not None and default.get(k) != v}
        if changed and "resources" in allowed:
            out["resources"] = changed
        elif changed:
            notes.append(f"resources the original got (the template allows no override): {_text(changed, 300)}")
    image = repro.get("image")
    if isinstance(image, str) and image:
        if image != defaults.get("image") and "image" in allowed:
            out["image"] = image
        notes.append(f"image: {_text(image)}" + ("" if "@sha256:" in image else " (a tag, not a digest: the "
                                                  "registry may now serve other content under it)"))
    return out


def _environment_note(env: Any) -> str | None:
    if not isinstance(env, dict):
        return None
    parts = []
    py = env.get("python") if isinstance(env.get("python"), dict) else {}
    if py.get("version"):
        parts.append(f"python {_text(py['version'], 40)}")
    torch = env.get("torch") if isinstance(env.get("torch"), dict) else {}
    if torch.get("version"):
        parts.append(f"torch {_text(torch['version'], 40)} (CUDA {_text(torch.get('cuda_version'), 20) or '-'})")
    packages = env.get("packages") if isinstance(env.get("packages"), dict) else {}
    parts += [f"{_text(k, 40)} {_text(v, 40)}" for k, v in sorted(packages.items()) if v and k != "torch"]
    return "environment: " + ", ".join(parts) if parts else None


def build_spec(manifest: dict, job: dict, new: str, ident: str) -> tuple[dict, list[str]]:
    """The Run document and the notes (pins without a field) for the run ``ident`` of ``manifest``."""
    repro = manifest["reproducibility"]
    template = repro.get("template") if isinstance(repro.get("template"), dict) else {}
    notes = [f"spec commit of the original: {_text((repro.get('spec') or {}).get('commit')) or 'unknown'}"]
    spec: dict[str, Any] = {"template": template.get("id")}
    overrides = _overrides(repro, job, notes)
    if overrides:
        spec["overrides"] = overrides
    task = _drop_none(repro.get("task"))
    # The tag first, as people write it (the dump sorts its keys).
    spec["task"] = {"type": task.get("type"), **task} if isinstance(task, dict) else task
    inputs = [i for i in repro.get("inputs") or [] if isinstance(i, dict) and isinstance(i.get("path"), str)]
    if inputs:
        spec["inputs"] = [i["path"] for i in inputs]
    for i in inputs:
        notes.append(f"input {_text(i['path'])}: sha256 {_text(i.get('sha256'), 80) or 'unknown'}")
    code = repro.get("code")
    if isinstance(code, dict) and code.get("repo") and code.get("commit"):
        path = str(code.get("path") or "inputs/code").removeprefix("inputs/")
        spec["code"] = {"repo": code["repo"], "commit": code["commit"], "path": path}
        if code.get("sha256"):
            notes.append(f"code tree: sha256 {_text(code['sha256'], 80)}")
    names = job.get("secret_names")
    if isinstance(names, list) and names and all(isinstance(n, str) and ENV_NAME.match(n) for n in names):
        spec["secrets"] = sorted(names)
    env_note = _environment_note(repro.get("environment"))
    if env_note:
        notes.append(env_note)
    labels = job.get("labels")
    metadata: dict[str, Any] = {"name": new}
    if isinstance(labels, dict) and labels and all(isinstance(v, str) for v in labels.values()):
        metadata["labels"] = dict(sorted(labels.items()))
    metadata["annotations"] = {"reconciler/reproduces": ident,
                               "reconciler/reproducibility-digest": str(manifest.get("reproducibility_digest"))}
    return {"apiVersion": "reconciler/v1", "kind": "Run", "metadata": metadata, "spec": spec}, notes


def pin_checkpoint(cfg, name: str, which: str) -> tuple[dict, list[str]]:
    """``spec.outputs`` starting from the run's checkpoint ``which``, verified in the bucket now."""
    from difflib import get_close_matches

    from .artifacts import CHECKPOINT, _place, listing, outputs_of, read_manifest

    st, out = outputs_of(cfg, name)
    if out is None:
        raise UsageError(f"--checkpoint: run {name} has no Storage (spec.outputs.storage), so no checkpoint can "
                         "be pinned for a new machine")
    ckpt = which if which.startswith("checkpoint-") else f"checkpoint-{which}"
    if not CHECKPOINT.fullmatch(ckpt):
        raise UsageError(f"--checkpoint {which!r}: give N or checkpoint-N")
    objects, _ = listing(out)
    there = sorted({key for rel in objects for kind, key in [_place(rel)] if kind in ("checkpoint", "manifest")})
    if ckpt not in there:
        close = get_close_matches(ckpt, there, n=1, cutoff=0.6)
        raise UsageError(f"no {ckpt} in {out.uri}/checkpoints" + (f" (did you mean {close[0]!r}?)" if close
                                                                  else f" (there: {', '.join(there) or 'none'})"))
    m = read_manifest(out, ckpt, objects)
    recorded = out.recorded_checkpoints().get(ckpt, {}).get("manifest_sha256")
    if recorded and m["sha256"] and recorded != m["sha256"]:
        raise PermanentError(f"{ckpt} of {name}: its manifest in the bucket has sha256 {m['sha256']}, but the run "
                             f"recorded {recorded} when it was uploaded: it was changed since; not pinning it")
    if m["problems"] or not m["sha256"]:
        raise PermanentError(f"{ckpt} of {name} is not whole in the bucket: {'; '.join(m['problems'])}")
    notes = [] if recorded else [f"{ckpt}: the run's status does not record it; pinned its manifest as the "
                                 "bucket holds it now"]
    start = {"checkpoint": ckpt, "uri": f"{out.uri}/checkpoints/{ckpt}", "manifest_sha256": m["sha256"]}
    return {"storage": out.storage.metadata.name, "start_from": start}, notes


def render(doc: dict, notes: list[str], name: str, ident: str) -> str:
    """The file's text: a header of comments, then the document, byte-stable."""
    from reconciler.core.yamlemit import dump, pyyaml_dump

    head = [f"# Reproduces {ident} (run {name}), written by `reconcile reproduce {name}`.",
            "# Pins the Run spec has no field for, as the original's provenance manifest records them",
            f"# (compare once it has run: reconcile provenance {doc['metadata']['name']} --diff {ident}):"]
    head += [f"#   {_text(n, 400)}" for n in notes]
    body = dump(doc)
    return "\n".join(head) + "\n" + (body if body is not None else pyyaml_dump(doc))


def write_new(path: Path, text: str) -> None:
    """Create ``path`` with ``text``, never over an existing file, never half-written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    try:
        os.link(tmp, path)  # fails if the file appeared meanwhile: never replaced
    except FileExistsError:
        raise UsageError(f"{path}: already exists; not overwriting it (give --as or --out)") from None
    finally:
        tmp.unlink(missing_ok=True)


def _check_written(cfg, path: Path) -> None:
    """The file as ``reconcile validate`` sees it; a file that fails is removed again."""
    from reconciler.spec.load import load_tree

    root = cfg.repo.resolve()
    if root not in path.resolve().parents:
        return
    problems = load_tree(root, only={path.resolve()}).diagnostics
    if problems:
        path.unlink()
        raise PermanentError("the spec written would not validate, so it was removed: "
                             + "; ".join(d.text() for d in problems[:3]))


def cmd_reproduce(args: argparse.Namespace) -> int:
    cfg = _cfg(args)
    if statuses.load_one(cfg.repo / "status", args.name) is None:
        raise no_such_run(args.name, status_names(cfg))
    new = args.as_name or f"{args.name}-repro"
    if not DNS_LABEL.match(new):
        raise UsageError(f"--as {new!r}: a run name is a DNS label (lowercase letters, digits, '-'; at most 63)")
    path = Path(args.out) if args.out else cfg.repo / "specs" / "runs" / f"{new}.yaml"
    if path.exists() or path.is_symlink():
        raise UsageError(f"{path}: already exists; not overwriting it (give --as or --out)")
    if statuses.load_one(cfg.repo / "status", new) is not None:
        raise UsageError(f"a run {new!r} already has a status; give another name with --as")
    manifest, job, ident = load_original(cfg, args.name)
    doc, notes = build_spec(manifest, job, new, ident)
    _check_repository(cfg, doc, manifest, notes)
    if args.checkpoint:
        outputs, more = pin_checkpoint(cfg, args.name, args.checkpoint)
        doc["spec"]["outputs"] = outputs
        notes += more
    else:
        _, out = _outputs_or_none(cfg, args.name)
        if out is not None:
            doc["spec"]["outputs"] = {"storage": out.storage.metadata.name, **_same_start(manifest, notes)}
    _check_model(doc)
    write_new(path, render(doc, notes, args.name, ident))
    _check_written(cfg, path)
    start = doc["spec"]["outputs"]["start_from"] if args.checkpoint else None
    if args.json:
        import json

        print(json.dumps({"path": str(path), "name": new, "reproduces": ident, "start_from": start}, indent=2,
                         sort_keys=True))
    else:
        print(f"wrote {path}: run {new}, pinned to {ident}" + (f" from {start['checkpoint']}" if start else ""))
    return 0


def _same_start(manifest: dict, notes: list[str]) -> dict:
    """The checkpoint the original itself started from, if it was pinned to one: the same pin."""
    pinned = manifest["reproducibility"].get("start_from")
    keys = ("checkpoint", "uri", "manifest_sha256")
    if not isinstance(pinned, dict) or not all(isinstance(pinned.get(k), str) for k in keys):
        return {}
    notes.append(f"start_from: the checkpoint the original started from, {_text(pinned['checkpoint'], 40)}")
    return {"start_from": {k: pinned[k] for k in keys}}


def _check_repository(cfg, doc: dict, manifest: dict, notes: list[str]) -> None:
    """The new name is free among the specs, and the template is still there (a changed one is noted:
    the manifest holds the one the original ran with)."""
    from reconciler.spec.load import load_tree

    desired = load_tree(cfg.repo)
    new, tid = doc["metadata"]["name"], doc["spec"]["template"]
    if new in desired.runs or new in desired.invalid:
        raise UsageError(f"a run {new!r} is already in the specs; give another name with --as")
    template = desired.templates.get(tid)
    if template is None:
        raise PermanentError(f"the template {tid!r} the original ran with is no longer in execution_templates/")
    if template.model_dump(mode="json") != manifest["reproducibility"].get("template"):
        notes.append(f"template {tid} has changed since the original ran (its manifest's reproducibility.template "
                     "holds the one it ran with)")


def _outputs_or_none(cfg, name: str):
    from .artifacts import outputs_of

    try:
        return outputs_of(cfg, name)
    except PermanentError:  # a Storage gone from the repository: the new run gets the default
        return None, None


def _check_model(doc: dict) -> None:
    """The document against the Run model before anything is written."""
    from pydantic import ValidationError

    from reconciler.spec.models.run import Run

    try:
        Run.model_validate(doc)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise PermanentError(f"the original's manifest does not make a valid Run spec: {where}: "
                             f"{first.get('msg')}") from None

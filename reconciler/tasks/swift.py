"""``type: swift-sft`` and ``type: swift-rlhf``: an ms-swift YAML config and the line that runs it.

The control plane never imports swift: it writes ``scripts/swift-config.yaml`` from the typed
fields plus the passthrough ``args`` and runs ``swift sft|rlhf CONFIG`` with the execution plane's
python (the template's ``defaults.python``, the machine's ``python``, or ``python3``; the bundle
carries it as ``RECONCILER_PYTHON`` in ``scripts/env.sh``).

What the config pins, because the reconciler owns it:

- ``output_dir: artifacts/output`` with ``add_version: false``: no timestamped sub-folder, so the
  probe finds ``logging.jsonl`` and a relaunch finds ``checkpoint-N/`` at a known place;
- ``resume_from_checkpoint`` when a relaunch resumes (``resume: auto``): the absolute path, on the
  same machine, of the previous attempt's latest complete checkpoint;
- ``check_model: false`` and ``report_to: none`` unless ``args`` says otherwise (the execution plane
  may have no hub access).

Paths: the entrypoint runs from the bundle's root, so staged files are referenced as
``inputs/<repository path>`` (datasets, a model folder, a fork manifest) and are the same on every
machine and in every container.

The entrypoint runs the precheck first (``scripts/precheck.py`` with the arguments in
``scripts/precheck.args``, one per line, read by argparse's ``@file``); on a mismatch with
``task.requires`` it exits 3 before any training and ``artifacts/runtime-precheck.json`` holds the
reason, which the probe reports and the status shows.
"""

from __future__ import annotations

import json
import shlex
from pathlib import PurePosixPath

from . import NOTE, RenderContext, Rendered, register

OUTPUT_DIR = "artifacts/output"
CONFIG_PATH = "scripts/swift-config.yaml"
PRECHECK_ARGS = "scripts/precheck.args"
PRECHECK_JSON = "artifacts/runtime-precheck.json"
PRECHECK_LOG = "artifacts/runtime-precheck.log"
EXIT_PRECHECK = 3  # precheck.py's EXIT_MISMATCH
# Defaults that make sense on an execution plane that may have no hub access; args may override.
DEFAULTS = {"check_model": False, "report_to": "none"}
# Task fields that are the reconciler's, not ms-swift arguments.
TYPED_SKIP = {"type", "args", "resume", "requires"}


def swift_config(task, ctx: RenderContext) -> dict:
    """The ms-swift arguments, in a stable order: defaults, typed fields, passthrough, managed keys."""
    cfg: dict = dict(DEFAULTS)
    for key, value in task.model_dump(mode="json").items():
        if key in TYPED_SKIP or value is None or value == [] or value == {}:
            continue
        cfg[key] = value
    cfg.update(task.args)
    cfg["output_dir"] = OUTPUT_DIR
    cfg["add_version"] = False
    if ctx.resume_from and task.resume == "auto":
        cfg["resume_from_checkpoint"] = ctx.resume_from
    return cfg


def _yaml_scalar(v) -> str:
    # JSON is valid YAML for scalars and flow lists/maps, and it is unambiguous.
    return json.dumps(v, ensure_ascii=False)


def config_text(cfg: dict) -> str:
    lines = [NOTE]
    lines += [f"{k}: {_yaml_scalar(v)}" for k, v in cfg.items()]
    return "\n".join(lines) + "\n"


def precheck_args(task) -> list[str]:
    req = task.requires
    out: list[str] = []
    if req is not None and req.swift_version:
        out += ["--expect-swift-version", req.swift_version]
    if req is not None and req.swift_fork:
        out += ["--expect-swift-fork", req.swift_fork]
    return out


def fork_pythonpath(task, ctx: RenderContext) -> str | None:
    """Bundle-relative folder holding the fork's ``swift/``, when its staged manifest names a root."""
    req = task.requires
    if req is None or not req.swift_fork or ctx.bundle is None:
        return None
    try:
        manifest = json.loads((ctx.bundle / req.swift_fork).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # the precheck reports an unreadable manifest, with the run's own python
    root = manifest.get("root") if isinstance(manifest, dict) else None
    if not isinstance(root, str) or not root:
        return None
    path = PurePosixPath(req.swift_fork).parent / root
    if path.is_absolute() or ".." in path.parts:
        return None
    return path.as_posix()


def entrypoint(verb: str, pythonpath: str | None = None) -> str:
    lines = [
        "#!/bin/sh",
        NOTE,
        'cd "$RECONCILER_BUNDLE" || exit 111',
        'PY="${RECONCILER_PYTHON:-python3}"',
        'if ! command -v "$PY" >/dev/null 2>&1; then',
        '    echo "reconciler: python \'$PY\' not found on this machine (template defaults.python or the'
        ' machine\'s python)" >&2',
        "    exit 127",
        "fi",
    ]
    if pythonpath:
        lines.append(f'PYTHONPATH="$RECONCILER_BUNDLE/{pythonpath}${{PYTHONPATH:+:$PYTHONPATH}}"; export PYTHONPATH')
    lines += [
        "mkdir -p " + OUTPUT_DIR,
        f'"$PY" scripts/precheck.py --log {PRECHECK_LOG} --json {PRECHECK_JSON} @{PRECHECK_ARGS} || exit $?',
        # `swift sft` without the console script, which may not be on PATH; it starts a child python
        # that trains (the wrapper kills the whole process group on terminate).
        "exec \"$PY\" -c 'import sys; from swift.cli.main import cli_main; sys.exit(cli_main())' "
        f"{shlex.quote(verb)} {CONFIG_PATH}",
    ]
    return "\n".join(lines) + "\n"


def _render(task, ctx: RenderContext, verb: str) -> Rendered:
    cfg = swift_config(task, ctx)
    files = {
        CONFIG_PATH: config_text(cfg).encode(),
        PRECHECK_ARGS: "".join(a + "\n" for a in precheck_args(task)).encode(),
    }
    return Rendered(entrypoint=entrypoint(verb, fork_pythonpath(task, ctx)), files=files)


@register("swift-sft")
def render_sft(task, ctx: RenderContext) -> Rendered:
    return _render(task, ctx, "sft")


@register("swift-rlhf")
def render_rlhf(task, ctx: RenderContext) -> Rendered:
    return _render(task, ctx, "rlhf")


# ---------------------------------------------------------------- what a spec may reference


def bundle_paths(task) -> list[tuple[tuple, str]]:
    """(location within the task, path) of every value that names a staged file (``inputs/...``).

    Dataset strings may carry ms-swift's sampling suffix (``path#1000``), which is not part of the path.
    """
    out: list[tuple[tuple, str]] = []
    for key in ("dataset", "val_dataset"):
        for i, value in enumerate(getattr(task, key, []) or []):
            out.append(((key, i), value.split("#", 1)[0]))
    for key in ("model", "ref_model"):
        value = getattr(task, key, None)
        if value:
            out.append(((key,), value))
    req = getattr(task, "requires", None)
    if req is not None and req.swift_fork:
        out.append((("requires", "swift_fork"), req.swift_fork))
    return [(loc, p) for loc, p in out if p == "inputs" or p.startswith("inputs/")]

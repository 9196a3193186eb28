"""``type: swift-sft`` and ``type: swift-rlhf``: an ms-swift YAML config and the line that runs it.

The control plane never imports swift: it writes ``scripts/swift-config.yaml`` from the typed
fields plus the passthrough ``args`` and runs ``swift sft|rlhf CONFIG`` with the execution plane's
python (the template's ``defaults.python``, the machine's ``python``, or ``python3``). The config
pins what the reconciler owns: ``output_dir`` under artifacts/ without a timestamped sub-folder
(so observers find ``logging.jsonl`` and checkpoints), and ``resume_from_checkpoint`` when a
relaunch resumes. The precheck runs first and fails the run before training on a mismatch.
"""

from __future__ import annotations

import json

from . import RenderContext, Rendered, register

OUTPUT_DIR = "artifacts/output"
CONFIG_PATH = "scripts/swift-config.yaml"
# Defaults that make sense on an execution plane that may have no hub access; args may override.
DEFAULTS = {"check_model": False, "report_to": "none"}
TYPED_SKIP = {"type", "args", "resume"}


def swift_config(task, ctx: RenderContext) -> dict:
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
    lines = ["# Rendered by the reconciler from the run's task; do not edit."]
    lines += [f"{k}: {_yaml_scalar(v)}" for k, v in cfg.items()]
    return "\n".join(lines) + "\n"


def _render(task, ctx: RenderContext, verb: str) -> Rendered:
    cfg = swift_config(task, ctx)
    entry = (
        "#!/bin/sh\n# Rendered by the reconciler from the run's task; do not edit.\n"
        'cd "$RECONCILER_BUNDLE"\n'
        'PY="${RECONCILER_PYTHON:-python3}"\n'
        "mkdir -p " + OUTPUT_DIR + "\n"
        '"$PY" scripts/precheck.py --log artifacts/runtime-precheck.log --json artifacts/runtime-precheck.json'
        ' $(cat scripts/precheck.args 2>/dev/null) || exit $?\n'
        f"exec \"$PY\" -c 'import sys; from swift.cli.main import cli_main; sys.exit(cli_main())' {verb} {CONFIG_PATH}\n"
    )
    files = {CONFIG_PATH: config_text(cfg).encode()}
    return Rendered(entrypoint=entry, files=files)


@register("swift-sft")
def render_sft(task, ctx: RenderContext) -> Rendered:
    return _render(task, ctx, "sft")


@register("swift-rlhf")
def render_rlhf(task, ctx: RenderContext) -> Rendered:
    return _render(task, ctx, "rlhf")

"""``reconcile init [DIR]``: a new repository of run specs, ready for its first pull request.

A team starting out needs the same dozen files every time: the folders the reconciler reads, a
template that runs on the machine at hand, a Policy, the JSON Schemas and the editor settings that
check specs while they are typed, the two pull-request workflows (validate, and the plan as a
comment), and a .gitignore that keeps the reconciler's working state out of git. Writing them by
hand is where the forgotten flag comes from, so they are written here from what this version of
the reconciler knows (the schemas are generated from its models, not copied).

Nothing that exists is overwritten: a file already there is kept and named in the output, so
``init`` can also fill in what an older repository lacks. The folder becomes a git repository if
it is not one; nothing is committed (the first commit is the user's, after reading the files).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from reconciler.core.errors import UsageError

TEMPLATE = """\
# yaml-language-server: $schema=../schemas/execution-template.schema.json
# Runs on the reconciler's own machine as a detached host process: the embedded default.
# Add ssh-host, rental or slurm templates as you add machines (docs/machines.md, docs/rentals.md).
apiVersion: reconciler/v1
kind: ExecutionTemplate
id: local-host
description: Runs on the reconciler's machine as a detached host process.
placement:
  kind: local
launch_mode:
  kind: host_process
defaults:
  resources:
    gpu_count: 0
  runtime_env:
    PYTHONUNBUFFERED: "1"
allow_overrides: [resources, runtime_env]
"""

POLICY = """\
# yaml-language-server: $schema=../schemas/policy.schema.json
# Priorities, team quotas and which runs may have which secrets (one Policy per repository).
# See docs/scheduling.md.
apiVersion: reconciler/v1
kind: Policy
metadata:
  name: policy
spec:
  teamLabel: team          # a run's team is its `team` label
  priorityClasses:
    - name: normal
      value: 100
      default: true        # runs that name no priority
    - name: batch
      value: 10
"""

RUN = """\
# yaml-language-server: $schema=../../schemas/run.schema.json
# A first run: prints a line and exits. Change the task to your training (docs/specs.md, docs/swift.md),
# open a pull request, and the plan appears as a comment.
apiVersion: reconciler/v1
kind: Run
metadata:
  name: hello
  labels:
    team: research
spec:
  template: local-host
  task:
    type: command
    argv: ["python3", "-c", "print('hello from the reconciler')"]
  restartPolicy:
    maxRetries: 1
"""

GITIGNORE = """\
# The reconciler's working state on its host (bundles, locks, caches): never in git.
.reconciler/
"""

WORKFLOW_INSTALL = "pip install \"$RECONCILER_PACKAGE\""

VALIDATE = """\
# Every pull request: each spec, template and fleet checked against the models and the cross-file
# rules (errors as annotations on the changed lines), and the schemas against the models.
name: validate
on:
  pull_request:
permissions: {{}}
env:
  # The reconciler the daemon runs: the same version here (or a git URL / your index).
  RECONCILER_PACKAGE: gpu-reconciler=={version}
jobs:
  validate:
    runs-on: ubuntu-latest
    timeout-minutes: 10
    permissions:
      contents: read
    steps:
      - uses: actions/checkout@11bd71901bbe5b1630ceea73d27597364c9af683 # v4.2.2
        with:
          persist-credentials: false
      - uses: actions/setup-python@42375524e23c412d93fb67b49958b491fce71c38 # v5.4.0
        with:
          python-version: "3.11"
      - run: {install}
      - run: reconcile validate --format github
      - run: reconcile schema --check
"""

PLAN = """\
# Every pull request: what merging would launch, stop or leave waiting, from the specs and the
# committed status files alone (no SSH, no secrets), in the job summary and as one comment that each
# push edits. The comment job runs the base branch's reconciler only and holds the write token.
name: plan
on:
  pull_request:
permissions: {{}}
env:
  RECONCILER_PACKAGE: gpu-reconciler=={version}
jobs:
  plan:
    runs-on: ubuntu-latest
    timeout-minutes: 10
    permissions:
      contents: read
    outputs:
      code: ${{{{ steps.plan.outputs.code }}}}
    steps:
      - uses: actions/checkout@11bd71901bbe5b1630ceea73d27597364c9af683 # v4.2.2
        with:
          persist-credentials: false
      - uses: actions/setup-python@42375524e23c412d93fb67b49958b491fce71c38 # v5.4.0
        with:
          python-version: "3.11"
      - run: {install}
      - id: plan
        run: |
          set +e
          reconcile plan --offline --github --detailed-exitcode
          code=$?
          mkdir -p plan-out
          cp "$GITHUB_STEP_SUMMARY" plan-out/plan.md
          echo "code=$code" >> "$GITHUB_OUTPUT"
      - uses: actions/upload-artifact@ea165f8d65b6e75b540449e92b4886f43607fa02 # v4.6.2
        with:
          name: plan
          path: plan-out/plan.md
          retention-days: 1
          if-no-files-found: error
      - env:
          CODE: ${{{{ steps.plan.outputs.code }}}}
        run: '[ "$CODE" = 0 ] || [ "$CODE" = 2 ]'
  comment:
    needs: plan
    if: ${{{{ !cancelled() && needs.plan.outputs.code != '' }}}}
    runs-on: ubuntu-latest
    timeout-minutes: 5
    permissions:
      contents: read
      pull-requests: write
    steps:
      - uses: actions/setup-python@42375524e23c412d93fb67b49958b491fce71c38 # v5.4.0
        with:
          python-version: "3.11"
      - run: {install}
      - uses: actions/download-artifact@d3f86a106a0bac45b974a628896c90dbdf5c8093 # v4.3.0
        with:
          name: plan
          path: ${{{{ runner.temp }}}}/plan
      - env:
          GITHUB_TOKEN: ${{{{ github.token }}}}
          PLAN: ${{{{ runner.temp }}}}/plan/plan.md
        run: python -m reconciler.cli.prcomment "$PLAN"
"""


def _editor_settings() -> str:
    globs = ["specs/**/*.yaml", "specs/**/*.yml", "execution_templates/**/*.yaml", "execution_templates/**/*.yml"]
    return json.dumps({"yaml.schemas": {"./schemas/reconciler.schema.json": globs}, "yaml.yamlVersion": "1.2",
                       "yaml.validate": True, "yaml.completion": True, "yaml.hover": True}, indent=2) + "\n"


def files(version: str) -> dict[str, str]:
    """Every file ``init`` writes but the schemas (generated): repository path → text."""
    install = WORKFLOW_INSTALL
    return {
        "execution_templates/local-host.yaml": TEMPLATE,
        "specs/policy.yaml": POLICY,
        "specs/runs/hello.yaml": RUN,
        ".gitignore": GITIGNORE,
        ".vscode/settings.json": _editor_settings(),
        ".github/workflows/validate.yml": VALIDATE.format(version=version, install=install),
        ".github/workflows/plan.yml": PLAN.format(version=version, install=install),
        "status/.gitkeep": "",
    }


def build(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", nargs="?", default=".", metavar="DIR", help="the repository's folder (default: here; "
                   "made if missing)")


def cmd_init(args: argparse.Namespace) -> int:
    from reconciler.gitops.repo import run_git
    from reconciler.spec import schema

    from .about import version

    root = Path(args.dir)
    if root.exists() and not root.is_dir():
        raise UsageError(f"{root}: not a folder")
    root.mkdir(parents=True, exist_ok=True)
    written, kept = [], []
    for rel, text in files(version()).items():
        path = root / rel
        if path.exists():
            kept.append(rel)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        written.append(rel)
    written += [f"schemas/{n}" for n in schema.write(root.resolve() / "schemas")]
    if not (root / ".git").exists():
        run_git(root, "init", "-q")
        written.append(".git (git init)")
    for rel in written:
        print(f"wrote {rel}")
    for rel in kept:
        print(f"kept {rel} (already there)")
    print("next: reconcile validate && reconcile plan (in that folder), then commit, push, and run the daemon "
          "there or on a small VM: docs/getting-started.md")
    return 0

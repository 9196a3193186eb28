"""The Run kind: what to run, where, and what to do when it fails."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from .common import (CODE_PATH, COMMIT_MESSAGE, DNS_LABEL, DNS_LABEL_MESSAGE, ENV_NAME_MESSAGE, INPUT_PATH,
                     INPUT_PATH_MESSAGE, SHA1_HEX, EnvMap, EnvName, Metadata, ResourcesOverride, Strict)
from .slurm import SlurmRequest
from .tasks import Task


class CodePin(Strict):
    """Upstream code checked out at an exact commit and staged with the run."""

    repo: str = Field(description="Upstream code repository: a URL git can clone, or a path on the reconciler "
                      "host.", examples=["https://github.com/org/trainer.git"])
    commit: str = Field(description="Exact 40-hex commit; branches and tags move, so they are refused.",
                        examples=["0123456789abcdef0123456789abcdef01234567"],
                        json_schema_extra={"pattern": SHA1_HEX.pattern, "patternErrorMessage": COMMIT_MESSAGE})
    path: str = Field("code", pattern=r"^[A-Za-z0-9_.][A-Za-z0-9_.\-]*(/[A-Za-z0-9_.][A-Za-z0-9_.\-]*)*$",
                      description="Folder under inputs/ the code is checked out into (relative, no '..').",
                      examples=["code"],
                      json_schema_extra={"pattern": CODE_PATH, "patternErrorMessage": "must be a relative folder "
                                         "(letters, digits, '_', '.', '-' and '/'), without '..'"})

    @field_validator("path")
    @classmethod
    def _rel(cls, v: str) -> str:
        if ".." in v.split("/"):
            raise ValueError("must not contain '..'")
        return v

    @field_validator("commit")
    @classmethod
    def _hex(cls, v: str) -> str:
        if not SHA1_HEX.match(v):
            raise ValueError(COMMIT_MESSAGE)
        return v


class RestartPolicy(Strict):
    """What happens when an attempt fails."""

    maxRetries: int = Field(0, ge=0, le=100, description="Relaunches after a failure (0: a failed run stays "
                            "Failed).", examples=[3])
    backoffSeconds: float = Field(10, ge=0, le=86400, description="Seconds to wait before each relaunch.",
                                  examples=[60])


class Overrides(Strict):
    """Per-run changes to the template's defaults; only the keys its allow_overrides lists."""

    target: str | None = Field(None, description="Fleet or machine name to run on (ssh placement).",
                               examples=["lab"])
    resources: ResourcesOverride | None = Field(None, description="Resources; only the keys given replace the "
                                                "template's.")
    runtime_env: EnvMap | None = Field(None, description="Environment variables added to the template's "
                                       "runtime_env (same name: this value wins); never secrets.",
                                       examples=[{"NCCL_DEBUG": "WARN"}])
    image: str | None = Field(None, description="Container image (docker launches only).",
                              examples=["registry.example/trainer:1.4"])
    detach: bool | None = Field(None, description="Replaces the template's detach.")
    selector: dict[str, str] | None = Field(None, description="Machine labels the run needs (added to the "
                                            "template's selector; same key: this value wins).",
                                            examples=[{"site": "basement"}])


class Stall(Strict):
    """What counts as a stalled run, and what to do about it."""

    afterSeconds: float = Field(600, gt=0, le=30 * 86400, description="No training progress for this many "
                                "seconds sets the Stalled condition.", examples=[900])
    action: Literal["condition", "terminate"] = Field("condition", description="condition: only report it "
                                                      "(condition Stalled); terminate: also stop the run.")


class StartFrom(Strict):
    """A checkpoint in a Storage the run starts from instead of from scratch (what `reconcile
    reproduce --checkpoint` writes)."""

    checkpoint: str = Field(pattern=r"^checkpoint-[0-9]{1,12}$", description="The checkpoint's folder name.",
                            examples=["checkpoint-400"],
                            json_schema_extra={"patternErrorMessage": "checkpoint-N (N: up to 12 digits)"})
    uri: str = Field(pattern=r"^[a-z0-9]([-_a-z0-9]*[a-z0-9])?:[A-Za-z0-9_.=+-]+(/[A-Za-z0-9_.=+-]+)*$",
                     max_length=1024, description="Where it is: <remote>:<path>, as status outputs show it (the remote is "
                     "the Storage's name with '-' as '_').",
                     examples=["s3_outputs:training/r-0123456789ab/llama/g1/checkpoints/checkpoint-400"],
                     json_schema_extra={"patternErrorMessage": "<remote>:<path in the bucket>, as status outputs show "
                                        "it, without '.' or '..'"})
    manifest_sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the checkpoint's manifest: "
                                 "the machine refuses a checkpoint whose manifest differs.",
                                 json_schema_extra={"patternErrorMessage": "64 lowercase hex characters"})

    @field_validator("uri")
    @classmethod
    def _no_dotdot(cls, v: str) -> str:
        if {"..", "."} & set(v.partition(":")[2].split("/")):
            raise ValueError("must not contain '.' or '..' segments")
        return v


class Outputs(Strict):
    """Where the run's checkpoints and artifacts go: a Storage, written to from the machine."""

    storage: Annotated[str, Field(pattern=DNS_LABEL, json_schema_extra={"patternErrorMessage": DNS_LABEL_MESSAGE})] | None = Field(
        None, description="Name of a Storage (specs/storage/<name>.yaml). Unset: the Policy's defaultStorage; "
                          "neither: outputs come back to the reconciler host.", examples=["s3-outputs"])
    keep_checkpoints: int | None = Field(None, ge=1, le=64, description="Replaces the Storage's keep_checkpoints "
                                         "for this run.", examples=[3])
    start_from: StartFrom | None = Field(None, description="Start from this checkpoint of the Storage (resume "
                                         "from it) rather than from scratch.")


class RunSpec(Strict):
    """What to run, where, and what to do when it fails."""

    template: str = Field(description="Id of an execution template (a file in execution_templates/).",
                          examples=["local-host"])
    overrides: Overrides = Field(default_factory=Overrides, description="Changes to the template's defaults; "
                                 "only the keys the template's allow_overrides lists.")
    task: Task = Field(description="What the run executes; its type picks the fields: command (argv, env), "
                       "swift-sft or swift-rlhf (ms-swift training).")
    inputs: list[Annotated[str, Field(json_schema_extra={"pattern": INPUT_PATH,
                                                         "patternErrorMessage": INPUT_PATH_MESSAGE})]] = Field(
        default_factory=list, description="Repository files or folders (relative paths, no '..'), each staged "
                                          "into the bundle as inputs/<path>.", examples=[["data/train.jsonl"]],
        json_schema_extra={"uniqueItems": True})
    code: CodePin | None = Field(None, description="Optional pin of upstream code at an exact commit, staged "
                                 "under inputs/<code.path>.")
    desiredState: Literal["Running", "Stopped"] = Field("Running", description="Running: launch it (again, after "
                                                        "a change); Stopped: terminate it if it runs.")
    restartPolicy: RestartPolicy = Field(default_factory=RestartPolicy, description="Relaunches after a failure.")
    secrets: list[Annotated[EnvName, Field(json_schema_extra={"patternErrorMessage": ENV_NAME_MESSAGE})]] = Field(
        default_factory=list, description="Names of secrets, resolved on the reconciler host at launch and set as "
                                          "environment variables of the same name; never values.",
        examples=[["HF_TOKEN"]], json_schema_extra={"uniqueItems": True}
    )
    stall: Stall | None = Field(None, description="Optional: no progress for stall.afterSeconds sets the Stalled "
                                "condition (or terminates the run).")
    affinity: dict[str, str] | None = Field(None, description="Placed only on a machine where a live run carries "
                                            "all these labels (key: value), e.g. next to its data loader.",
                                            examples=[{"app": "feature-store"}])
    antiAffinity: dict[str, str] | None = Field(None, description="Never placed on a machine where a live run "
                                                "carries all these labels, e.g. replicas kept apart.",
                                                examples=[{"job": "eval"}])
    priority: Annotated[str, Field(pattern=DNS_LABEL, json_schema_extra={"patternErrorMessage": DNS_LABEL_MESSAGE})] | None = Field(
        None, description="Priority class (defined in the Policy): higher classes are placed first. Unset: the "
                          "Policy's default class.", examples=["urgent"])
    maxCost: float | None = Field(None, ge=0, description="Rental placement: what the run's rentals may cost in "
                                  "all (status cost.so_far); reached, no new rental is provisioned for it.",
                                  examples=[50])
    slurm: SlurmRequest | None = Field(None, description="Slurm placement: this run's time limit, account, QOS "
                                       "and warning signal, over its template's placement.slurm.")
    restartedAt: Annotated[str, Field(pattern=r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$", json_schema_extra={
        "patternErrorMessage": "a time in UTC like 2026-11-26T09:30:00Z (reconcile restart writes it)"})] | None = Field(
        None, description="Set by `reconcile restart`: a new value starts the run again from the beginning, as a "
                          "new generation (its retries counted afresh). A time in UTC.",
        examples=["2026-11-26T09:30:00Z"])
    outputs: Outputs | None = Field(None, description="Optional: checkpoints and artifacts go to object storage "
                                    "(a Storage) from the machine, never through the reconciler host.")


class Run(Strict):
    """A training run: what to run, where, and what to do when it fails."""

    apiVersion: Literal["reconciler/v1"] = Field(description="Version of the spec language.")
    kind: Literal["Run"] = Field(description="What this file describes: a training run.")
    metadata: Metadata = Field(description="The run's name (its file name) and labels.")
    spec: RunSpec = Field(description="The run's desired state.")

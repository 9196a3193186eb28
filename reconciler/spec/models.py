"""The desired-state objects users write: Run, ExecutionTemplate and Fleet.

These models are strict on write: unknown keys are errors, and values are not coerced (``"2"`` is
not a GPU count). They carry descriptions and examples because ``reconcile schema`` turns them into
the JSON Schemas that editors use to complete and check specs. Checks that need more than one file
(does the template exist, is the name unique) live in ``checks.py``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

API_VERSION = "reconciler/v1"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
SHA1_HEX = re.compile(r"^[0-9a-f]{40}$")
DNS_LABEL_MAX = 63

OVERRIDABLE = ("target", "resources", "runtime_env", "image", "detach")
# ms-swift arguments the reconciler sets itself (artifacts location and resume); never in args.
SWIFT_MANAGED = ("output_dir", "add_version", "resume_from_checkpoint")


def is_dns_label(value: Any) -> bool:
    """What ``Metadata.name`` accepts. Status files are named after runs, so only such a name may
    ever become part of a path (``fullmatch``: ``$`` alone would let a trailing newline through)."""
    return isinstance(value, str) and len(value) <= DNS_LABEL_MAX and re.fullmatch(DNS_LABEL, value) is not None


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=False)


class Metadata(Strict):
    name: str = Field(
        pattern=DNS_LABEL,
        max_length=DNS_LABEL_MAX,
        description="DNS label (lowercase letters, digits, '-'); equals the file name without .yaml.",
        examples=["llama-sft-v2"],
    )
    labels: dict[str, str] = Field(default_factory=dict, description="Free-form string labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Free-form notes.")


class Resources(Strict):
    gpu_type: str | None = Field(None, description="GPU model wanted, e.g. H100; any when unset.", examples=["H100"])
    gpu_count: int = Field(0, ge=0, le=64, description="GPUs per run.")
    cpu_count: int | None = Field(None, ge=1, le=1024, description="CPU cores per run.")
    memory_gb: float | None = Field(None, gt=0, le=16384, description="Host memory per run, GB.")


class ResourcesOverride(Strict):
    """Resources as an override: only the keys given replace the template's."""

    gpu_type: str | None = None
    gpu_count: int | None = Field(None, ge=0, le=64)
    cpu_count: int | None = Field(None, ge=1, le=1024)
    memory_gb: float | None = Field(None, gt=0, le=16384)


# ---------------------------------------------------------------- tasks


class CommandTask(Strict):
    type: Literal["command"]
    argv: list[str] = Field(min_length=1, description="Program and arguments; no shell.", examples=[["python", "train.py"]])
    env: dict[Annotated[str, Field(pattern=ENV_NAME)], str] = Field(
        default_factory=dict, description="Plain environment variables. Secrets belong in spec.secrets."
    )


class SwiftRequires(Strict):
    """What the execution plane's ms-swift must be; checked by the precheck before training (exit 3)."""

    swift_version: str | None = Field(None, min_length=1, description="swift.__version__ must equal this.",
                                      examples=["4.6.0"])
    swift_fork: str | None = Field(
        None,
        description="Bundle path (under inputs/, so listed in spec.inputs) of a FORK_MANIFEST.json the imported "
                    "swift package must match (tree_sha256). When the manifest has a 'root', that folder is put "
                    "first on PYTHONPATH so the staged fork is the one imported.",
        examples=["inputs/forks/acme-swift/FORK_MANIFEST.json"],
    )

    @field_validator("swift_fork")
    @classmethod
    def _staged(cls, v: str | None) -> str | None:
        if v is not None and (not v.startswith("inputs/") or not v.endswith(".json") or ".." in v.split("/")):
            raise ValueError(f"'{v}' must be a staged JSON file: inputs/<path listed in spec.inputs>/FORK_MANIFEST.json")
        return v


TUNER_TYPES = ("full", "lora", "longlora", "adalora", "llamapro", "adapter", "vera", "boft", "fourierft", "reft")


class SwiftCommon(Strict):
    model: str = Field(description="Model id or path on the execution plane (or under inputs/).", examples=["Qwen/Qwen2.5-7B-Instruct"])
    model_type: str | None = Field(None, description="ms-swift model type; needed for local model folders.", examples=["qwen2"])
    template: str | None = Field(None, description="ms-swift chat template.", examples=["qwen"])
    dataset: list[str] = Field(min_length=1, description="Datasets: ids or paths (inputs/... for staged files).")
    val_dataset: list[str] = Field(default_factory=list)
    tuner_type: Literal[TUNER_TYPES] = Field("lora", description="ms-swift 4 name; ms-swift 3 called it train_type.")  # type: ignore[valid-type]
    max_steps: int | None = Field(None, ge=1)
    num_train_epochs: float | None = Field(None, gt=0)
    learning_rate: float | None = Field(None, gt=0, lt=1)
    per_device_train_batch_size: int | None = Field(None, ge=1)
    per_device_eval_batch_size: int | None = Field(None, ge=1)
    gradient_accumulation_steps: int | None = Field(None, ge=1)
    max_length: int | None = Field(None, ge=1)
    torch_dtype: Literal["bfloat16", "float16", "float32"] | None = None
    lora_rank: int | None = Field(None, ge=1)
    lora_alpha: int | None = Field(None, ge=1)
    save_steps: int | None = Field(None, ge=1)
    eval_steps: int | None = Field(None, ge=1)
    logging_steps: int | None = Field(None, ge=1)
    save_total_limit: int | None = Field(None, ge=1)
    seed: int | None = None
    requires: SwiftRequires | None = Field(None, description="Declared ms-swift version or fork; a mismatch fails "
                                           "the run before training, with the reason in its status.")
    resume: Literal["auto", "never"] = Field(
        "auto", description="auto: a relaunch resumes from the latest checkpoint of the previous attempt."
    )
    args: dict[str, Any] = Field(
        default_factory=dict,
        description="Any other ms-swift argument, passed through unchanged (scalars or lists).",
        examples=[{"warmup_ratio": 0.05, "gradient_checkpointing": True}],
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "train_type" in data:
            raise ValueError("'train_type' was renamed to 'tuner_type' in ms-swift 4; use tuner_type")
        return data

    @model_validator(mode="after")
    def _consistent(self):
        if self.tuner_type == "full":
            lora = [k for k in ("lora_rank", "lora_alpha") if getattr(self, k) is not None]
            lora += [k for k in self.args if k.startswith("lora_")]
            if lora:
                raise ValueError(f"{', '.join(lora)}: LoRA settings, but tuner_type is 'full' (use tuner_type: lora, "
                                 "or remove them)")
        return self

    @field_validator("args")
    @classmethod
    def _args(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key, value in v.items():
            if key == "train_type":
                raise ValueError("'train_type' was renamed to 'tuner_type' in ms-swift 4; use the typed field tuner_type")
            if key in cls.model_fields:
                raise ValueError(f"'{key}' is a typed field; set it outside args")
            if key in SWIFT_MANAGED:
                raise ValueError(f"'{key}' is managed by the reconciler (artifacts and resume)")
            if not _is_plain(value):
                raise ValueError(f"'{key}' is not a scalar, a list or a map of scalars; only those are passed through")
        return v


def _is_plain(v: Any, depth: int = 0) -> bool:
    if depth > 3:
        return False
    if isinstance(v, (str, int, float, bool)) or v is None:
        return True
    if isinstance(v, list):
        return all(_is_plain(x, depth + 1) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _is_plain(x, depth + 1) for k, x in v.items())
    return False


class SwiftSftTask(SwiftCommon):
    type: Literal["swift-sft"]


RLHF_TYPES = ("dpo", "orpo", "simpo", "kto", "cpo", "rm", "ppo", "grpo", "gkd")


class SwiftRlhfTask(SwiftCommon):
    type: Literal["swift-rlhf"]
    rlhf_type: Literal[RLHF_TYPES] = Field(description="Preference or RL algorithm.", examples=["dpo"])  # type: ignore[valid-type]
    beta: float | None = Field(None, gt=0)
    ref_model: str | None = None
    reward_funcs: list[str] = Field(default_factory=list, description="grpo: reward functions.")

    @model_validator(mode="after")
    def _rlhf(self):
        if self.rlhf_type == "grpo" and not self.reward_funcs and "reward_model" not in self.args:
            raise ValueError("rlhf_type grpo needs reward_funcs (e.g. [accuracy, format]) or args.reward_model")
        if self.reward_funcs and self.rlhf_type != "grpo":
            raise ValueError(f"reward_funcs only apply to rlhf_type grpo, not {self.rlhf_type}")
        if self.beta is not None and self.rlhf_type in ("rm",):
            raise ValueError("beta does not apply to rlhf_type rm")
        return self


Task = Annotated[Union[CommandTask, SwiftSftTask, SwiftRlhfTask], Field(discriminator="type")]

# ---------------------------------------------------------------- run


class CodePin(Strict):
    repo: str = Field(description="Upstream code repository URL or path.", examples=["https://github.com/org/trainer.git"])
    commit: str = Field(description="Exact 40-hex commit; branches and tags move, so they are refused.")
    path: str = Field("code", pattern=r"^[A-Za-z0-9_.][A-Za-z0-9_.\-]*(/[A-Za-z0-9_.][A-Za-z0-9_.\-]*)*$",
                      description="Folder under inputs/ the code is checked out into (relative, no '..').")

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
            raise ValueError("must be exactly 40 lowercase hex characters (a commit, not a branch or tag)")
        return v


class RestartPolicy(Strict):
    maxRetries: int = Field(0, ge=0, le=100, description="Relaunches after a failure.")
    backoffSeconds: float = Field(10, ge=0, le=86400, description="Wait before each relaunch.")


class Overrides(Strict):
    target: str | None = None
    resources: ResourcesOverride | None = None
    runtime_env: dict[Annotated[str, Field(pattern=ENV_NAME)], str] | None = None
    image: str | None = None
    detach: bool | None = None


class Stall(Strict):
    afterSeconds: float = Field(600, gt=0, description="No progress for this long sets the Stalled condition.")
    action: Literal["condition", "terminate"] = "condition"


class RunSpec(Strict):
    template: str = Field(description="Id of an execution template.", examples=["local-host"])
    overrides: Overrides = Field(default_factory=Overrides, description="Only keys the template allows.")
    task: Task
    inputs: list[str] = Field(default_factory=list, description="Repository-relative files or folders staged into inputs/.")
    code: CodePin | None = None
    desiredState: Literal["Running", "Stopped"] = "Running"
    restartPolicy: RestartPolicy = Field(default_factory=RestartPolicy)
    secrets: list[Annotated[str, Field(pattern=ENV_NAME)]] = Field(
        default_factory=list, description="Names resolved on the reconciler host at launch; never values.", examples=[["HF_TOKEN"]]
    )
    stall: Stall | None = None


class Run(Strict):
    """A training run: what to run, where, and what to do when it fails."""

    apiVersion: Literal["reconciler/v1"]
    kind: Literal["Run"]
    metadata: Metadata
    spec: RunSpec


# ---------------------------------------------------------------- execution templates


class Placement(Strict):
    kind: Literal["local", "ssh"] = Field(description="local: this machine; ssh: a Fleet machine.")


class LaunchMode(Strict):
    kind: Literal["host_process", "docker"]
    network: Literal["none", "host"] = Field("none", description="docker: container network.")
    pull: bool = Field(False, description="docker: allow pulling a missing image.")


class TemplateDefaults(Strict):
    target: str | None = Field(None, description="Fleet or machine name for ssh placement.")
    detach: bool = True
    image: str | None = Field(None, description="Container image for docker launches.")
    resources: Resources = Field(default_factory=Resources)
    runtime_env: dict[Annotated[str, Field(pattern=ENV_NAME)], str] = Field(default_factory=dict)
    python: str | None = Field(None, description="Execution plane's python for ms-swift tasks.", examples=["/opt/swift/bin/python"])


class ExecutionTemplate(Strict):
    """How and where runs execute. The backend is chosen by placement.kind and launch_mode.kind only."""

    apiVersion: Literal["reconciler/v1"]
    kind: Literal["ExecutionTemplate"]
    id: str = Field(pattern=DNS_LABEL, max_length=DNS_LABEL_MAX, description="Equals the file name without .yaml.")
    description: str = ""
    placement: Placement
    launch_mode: LaunchMode
    defaults: TemplateDefaults = Field(default_factory=TemplateDefaults)
    allow_overrides: list[Literal[OVERRIDABLE]] = Field(default_factory=list)  # type: ignore[valid-type]

    @property
    def backend_key(self) -> str:
        return f"{self.placement.kind}_{self.launch_mode.kind}"


# ---------------------------------------------------------------- fleets


class SshEndpoint(Strict):
    host: str = Field(examples=["127.0.0.1"])
    port: int = Field(22, ge=1, le=65535)
    user: str
    identity_file: str | None = Field(None, description="Private key path on the reconciler host.")
    host_key: str | None = Field(
        None, description="Pinned public host key ('ssh-ed25519 AAAA...'); or use the fleet's known_hosts.",
    )


class GpuGroup(Strict):
    type: str = Field(examples=["H100"])
    count: int = Field(ge=1, le=64)
    memory_gb: float | None = Field(None, gt=0)


class MachineResources(Strict):
    gpus: list[GpuGroup] = Field(default_factory=list)
    cpu_count: int | None = Field(None, ge=1)
    memory_gb: float | None = Field(None, gt=0)


class Machine(Strict):
    name: str = Field(pattern=DNS_LABEL, max_length=DNS_LABEL_MAX)
    ssh: SshEndpoint
    resources: MachineResources = Field(default_factory=MachineResources)
    max_tasks: int = Field(1, ge=0, description="0 drains the machine: nothing new starts, running work finishes.")
    labels: dict[str, str] = Field(default_factory=dict)
    workspace_root: str = Field("reconciler-work", description="Where run workspaces live (relative to the login's home).")
    docker_host: str | None = Field(None, description="DOCKER_HOST on the machine, when not the default socket.")
    python: str | None = Field(None, description="Execution plane python for ms-swift tasks on this machine.")


class FleetSpec(Strict):
    machines: list[Machine] = Field(min_length=1)
    known_hosts: str | None = Field(None, description="known_hosts file on the reconciler host, for machines without host_key.")


class Fleet(Strict):
    """Registered machines: in-house servers and long-lived rentals."""

    apiVersion: Literal["reconciler/v1"]
    kind: Literal["Fleet"]
    metadata: Metadata
    spec: FleetSpec


KINDS: dict[str, type[BaseModel]] = {"Run": Run, "ExecutionTemplate": ExecutionTemplate, "Fleet": Fleet}

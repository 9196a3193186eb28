"""The desired-state objects users write: Run, ExecutionTemplate and Fleet.

These models are strict on write: unknown keys are errors, and values are not coerced (``"2"`` is
not a GPU count). Every field carries a description (and examples where they help) because
``reconcile schema`` turns the models into the JSON Schemas that editors use to complete, explain
and check specs (tests/spec/test_schema.py asserts that no property goes without one).

Some rules are validators here or checks in ``checks.py``, because they give located messages of
their own; where JSON Schema can say the same thing, the field also carries it for the schema only
(``json_schema_extra``: a pattern, ``uniqueItems``), so an editor shows it as you type. The rules that
span fields of one file (a docker template needs an image) are added by ``schema.py``. Checks that
need more than one file (does the template exist, is the name unique) live in ``checks.py`` only.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Annotated, Any, Iterable, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

API_VERSION = "reconciler/v1"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
SHA1_HEX = re.compile(r"^[0-9a-f]{40}$")
DNS_LABEL_MAX = 63

OVERRIDABLE = ("target", "resources", "runtime_env", "image", "detach", "selector")
# ms-swift arguments the reconciler sets itself (artifacts location and resume); never in args.
SWIFT_MANAGED = ("output_dir", "add_version", "resume_from_checkpoint")

# ---------------------------------------------------------------- schema-only rules
# Patterns and messages the JSON Schemas carry for rules the code checks itself (with its own,
# located message). ``patternErrorMessage`` is what yaml-language-server (VS Code, Neovim, ...)
# shows instead of the bare pattern; other validators ignore the keyword.

DNS_LABEL_MESSAGE = ("not a DNS label: lowercase letters, digits and '-', starting and ending with a letter or "
                     "digit, at most 63 characters")
ENV_NAME_MESSAGE = "not a valid environment variable name (letters, digits and '_', not starting with a digit)"
COMMIT_MESSAGE = "must be exactly 40 lowercase hex characters (a commit, not a branch or tag)"
# No '..' segment anywhere ("..", "../x", "x/..", "x/../y").
_NO_DOTDOT = r"(?!(?:.*/)?\.\.(?:/|$))"
# spec.inputs: relative, no '..', '/' separators, no surrounding spaces, not into status/, .git/ or
# .reconciler/ (checks.input_problem says the same, and also that the path exists).
INPUT_PATH = (r"^(?!/)" + _NO_DOTDOT + r"(?!(?:\./)*(?:status|\.git|\.reconciler)(?:/|$))(?!\s)(?![\s\S]*\s$)"
              r"[^\\\x00]+$")
INPUT_PATH_MESSAGE = ("must be a path relative to the repository root, with '/' separators, no '..' and no "
                      "surrounding spaces, outside status/, .git/ and .reconciler/")
CODE_PATH = _NO_DOTDOT.join(("^", r"[A-Za-z0-9_.][A-Za-z0-9_.\-]*(/[A-Za-z0-9_.][A-Za-z0-9_.\-]*)*$"))
SWIFT_FORK = "^inputs/" + _NO_DOTDOT + r".*\.json$"


def is_dns_label(value: Any) -> bool:
    """What ``Metadata.name`` accepts. Status files are named after runs, so only such a name may
    ever become part of a path (``fullmatch``: ``$`` alone would let a trailing newline through)."""
    return isinstance(value, str) and len(value) <= DNS_LABEL_MAX and re.fullmatch(DNS_LABEL, value) is not None


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=False)


EnvName = Annotated[str, Field(pattern=ENV_NAME)]
# Maps of environment variables: schema.py turns their key pattern into ``propertyNames`` (so a bad
# name is refused, not just left unchecked) and adds the literal-secret rules of checks.py.
EnvMap = dict[EnvName, str]


class Metadata(Strict):
    """Who the object is: its name, and labels and notes for people and tools."""

    name: str = Field(
        pattern=DNS_LABEL,
        max_length=DNS_LABEL_MAX,
        description="DNS label (lowercase letters, digits, '-'; at most 63 characters); equals the file name "
                    "without .yaml, and names the status file status/<name>.yaml.",
        examples=["llama-sft-v2"],
        json_schema_extra={"patternErrorMessage": DNS_LABEL_MESSAGE},
    )
    labels: dict[str, str] = Field(default_factory=dict, description="Free-form string labels (key: value), "
                                   "for people and tools; the reconciler does not interpret them.",
                                   examples=[{"team": "nlp"}])
    annotations: dict[str, str] = Field(default_factory=dict, description="Free-form notes (key: value); never "
                                        "a secret.", examples=[{"ticket": "ML-123"}])


class Resources(Strict):
    """What one run needs on its machine."""

    gpu_type: str | None = Field(None, description="GPU model wanted (matched without regard to case against a "
                                 "machine's GPU types), e.g. H100; any GPU when unset. Needs gpu_count >= 1.",
                                 examples=["H100"])
    gpu_types: list[str] | None = Field(None, min_length=1, description="Any of these GPU models (instead of "
                                        "gpu_type); all of a run's GPUs are of one model.",
                                        examples=[["H100", "A100"]])
    gpu_count: int = Field(0, ge=0, le=64, description="GPUs per run (0: no GPU).", examples=[1])
    gpu_memory_gb: float | None = Field(None, gt=0, le=1024, description="Least memory per GPU, in GB (a machine "
                                        "or offer that does not say how much its GPUs have does not fit).",
                                        examples=[80])
    cpu_count: int | None = Field(None, ge=1, le=1024, description="CPU cores per run.", examples=[8])
    memory_gb: float | None = Field(None, gt=0, le=16384, description="Host memory per run, in GB.", examples=[64])
    nodes: int = Field(1, ge=1, le=64, description="Machines the run spans, all started together or none "
                       "(ssh or slurm placement); gpu_count, cpu_count and memory_gb are per machine.", examples=[2])

    @model_validator(mode="after")
    def _any_of(self):
        if self.gpu_types is not None and self.gpu_type is not None:
            raise ValueError("gpu_type and gpu_types both set: use one (gpu_types is any of several models)")
        if self.gpu_types is not None and self.gpu_count == 0:
            raise ValueError("gpu_types is set but gpu_count is 0")
        return self

    def wanted_types(self) -> list[str | None]:
        """The GPU models the run may have, in its order of preference; [None] for any model."""
        if self.gpu_types:
            return list(self.gpu_types)
        return [self.gpu_type]


class ResourcesOverride(Strict):
    """Resources as an override: only the keys given replace the template's."""

    gpu_type: str | None = Field(None, description="Replaces the template's gpu_type; needs GPUs (here or in "
                                 "the template's defaults).", examples=["H100"])
    gpu_types: list[str] | None = Field(None, min_length=1, description="Replaces the template's GPU model(s) "
                                        "with any of these.", examples=[["H100", "A100"]])
    gpu_count: int | None = Field(None, ge=0, le=64, description="Replaces the template's gpu_count.", examples=[2])
    gpu_memory_gb: float | None = Field(None, gt=0, le=1024, description="Replaces the template's gpu_memory_gb "
                                        "(least GB per GPU).")
    cpu_count: int | None = Field(None, ge=1, le=1024, description="Replaces the template's cpu_count.")
    memory_gb: float | None = Field(None, gt=0, le=16384, description="Replaces the template's memory_gb (GB).")
    nodes: int | None = Field(None, ge=1, le=64, description="Replaces the template's nodes (machines per run).")


# ---------------------------------------------------------------- tasks


class CommandTask(Strict):
    """A program started from the bundle's root (staged inputs are under inputs/), without a shell."""

    type: Literal["command"] = Field(description="Task type: a plain command.")
    argv: list[str] = Field(min_length=1, description="Program and arguments; no shell (write ['sh', '-c', "
                            "'...'] for one).", examples=[["python", "train.py", "--epochs", "3"]])
    env: EnvMap = Field(default_factory=dict, description="Plain environment variables for the command. Secrets "
                        "belong in spec.secrets (names only), never here.", examples=[{"WANDB_MODE": "offline"}])


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
        json_schema_extra={"pattern": SWIFT_FORK, "patternErrorMessage": "must be a staged JSON file: "
                           "inputs/<path listed in spec.inputs>/FORK_MANIFEST.json, without '..'"},
    )

    @field_validator("swift_fork")
    @classmethod
    def _staged(cls, v: str | None) -> str | None:
        if v is not None and (not v.startswith("inputs/") or not v.endswith(".json") or ".." in v.split("/")):
            raise ValueError(f"'{v}' must be a staged JSON file: inputs/<path listed in spec.inputs>/FORK_MANIFEST.json")
        return v


TUNER_TYPES = ("full", "lora", "longlora", "adalora", "llamapro", "adapter", "vera", "boft", "fourierft", "reft")
_STEPS = "Optimizer steps"


class SwiftCommon(Strict):
    model: str = Field(description="Model id (hub) or path on the execution plane; a staged model folder is "
                       "inputs/<path>.", examples=["Qwen/Qwen2.5-7B-Instruct"])
    model_type: str | None = Field(None, description="ms-swift model type; needed for local model folders.",
                                   examples=["qwen2"])
    template: str | None = Field(None, description="ms-swift chat template; needed for local model folders.",
                                 examples=["qwen"])
    dataset: list[str] = Field(min_length=1, description="Training datasets: hub ids or paths (inputs/... for "
                               "staged files); ms-swift's 'path#N' samples N rows.",
                               examples=[["inputs/data/train.jsonl"]])
    val_dataset: list[str] = Field(default_factory=list, description="Validation datasets, written like dataset.",
                                   examples=[["inputs/data/val.jsonl"]])
    tuner_type: Literal[TUNER_TYPES] = Field("lora", description="How the model is tuned: full fine-tuning or an "
                                             "adapter (ms-swift 4's name; ms-swift 3 called it train_type).")  # type: ignore[valid-type]
    max_steps: int | None = Field(None, ge=1, description=f"{_STEPS} to train for; overrides num_train_epochs.",
                                  examples=[2000])
    num_train_epochs: float | None = Field(None, gt=0, description="Passes over the training data.", examples=[3])
    learning_rate: float | None = Field(None, gt=0, lt=1, description="Peak learning rate.", examples=[1.0e-4])
    per_device_train_batch_size: int | None = Field(None, ge=1, description="Training batch size per GPU.",
                                                    examples=[1])
    per_device_eval_batch_size: int | None = Field(None, ge=1, description="Evaluation batch size per GPU.")
    gradient_accumulation_steps: int | None = Field(None, ge=1, description="Batches accumulated per optimizer "
                                                    "step.", examples=[16])
    max_length: int | None = Field(None, ge=1, description="Longest sequence in tokens; longer rows are truncated "
                                   "or dropped (ms-swift's truncation_strategy).", examples=[2048])
    torch_dtype: Literal["bfloat16", "float16", "float32"] | None = Field(None, description="Dtype the model is "
                                                                          "loaded in.")
    lora_rank: int | None = Field(None, ge=1, description="LoRA rank (LoRA tuner types only).", examples=[8])
    lora_alpha: int | None = Field(None, ge=1, description="LoRA alpha (LoRA tuner types only).", examples=[32])
    save_steps: int | None = Field(None, ge=1, description=f"{_STEPS} between checkpoints (what a relaunch "
                                   "resumes from).", examples=[100])
    eval_steps: int | None = Field(None, ge=1, description=f"{_STEPS} between evaluations.")
    logging_steps: int | None = Field(None, ge=1, description=f"{_STEPS} between log lines (the run's progress "
                                      "in its status).", examples=[5])
    save_total_limit: int | None = Field(None, ge=1, description="Checkpoints kept; older ones are deleted.",
                                         examples=[2])
    seed: int | None = Field(None, description="Random seed.", examples=[42])
    requires: SwiftRequires | None = Field(None, description="Declared ms-swift version or fork; a mismatch fails "
                                           "the run before training, with the reason in its status.")
    resume: Literal["auto", "never"] = Field(
        "auto", description="auto: a relaunch resumes from the latest checkpoint of the previous attempt; never: "
                            "every attempt starts from scratch."
    )
    args: dict[str, Any] = Field(
        default_factory=dict,
        description="Any other argument of the ms-swift command, passed through unchanged (scalars, lists, or "
                    "maps of scalars). Not the typed fields above, nor output_dir, add_version and "
                    "resume_from_checkpoint, which the reconciler sets.",
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


PLAIN_DEPTH = 3  # how deep _is_plain lets args values nest (schema.py writes the same limit)


def _is_plain(v: Any, depth: int = 0) -> bool:
    if depth > PLAIN_DEPTH:
        return False
    if isinstance(v, (str, int, float, bool)) or v is None:
        return True
    if isinstance(v, list):
        return all(_is_plain(x, depth + 1) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _is_plain(x, depth + 1) for k, x in v.items())
    return False


class SwiftSftTask(SwiftCommon):
    """Supervised fine-tuning with ms-swift (``swift sft``)."""

    type: Literal["swift-sft"] = Field(description="Task type: ms-swift supervised fine-tuning (swift sft).")


RLHF_TYPES = ("dpo", "orpo", "simpo", "kto", "cpo", "rm", "ppo", "grpo", "gkd")


class SwiftRlhfTask(SwiftCommon):
    """Preference or reinforcement learning with ms-swift (``swift rlhf``)."""

    type: Literal["swift-rlhf"] = Field(description="Task type: ms-swift preference or RL training (swift rlhf).")
    rlhf_type: Literal[RLHF_TYPES] = Field(description="Preference or RL algorithm.", examples=["dpo"])  # type: ignore[valid-type]
    beta: float | None = Field(None, gt=0, description="KL or preference strength (not for rlhf_type rm).",
                               examples=[0.1])
    ref_model: str | None = Field(None, description="Reference model id or path (defaults to the model itself).")
    reward_funcs: list[str] = Field(default_factory=list, description="grpo only: reward functions (or set "
                                    "args.reward_model).", examples=[["accuracy", "format"]])

    @model_validator(mode="after")
    def _rlhf(self):
        if self.rlhf_type == "grpo" and not self.reward_funcs and "reward_model" not in self.args:
            raise ValueError("rlhf_type grpo needs reward_funcs (e.g. [accuracy, format]) or args.reward_model")
        if self.reward_funcs and self.rlhf_type != "grpo":
            raise ValueError(f"reward_funcs only apply to rlhf_type grpo, not {self.rlhf_type}")
        if self.beta is not None and self.rlhf_type in ("rm",):
            raise ValueError("beta does not apply to rlhf_type rm")
        return self


TASK_TYPES = {"command": CommandTask, "swift-sft": SwiftSftTask, "swift-rlhf": SwiftRlhfTask}
Task = Annotated[Union[CommandTask, SwiftSftTask, SwiftRlhfTask], Field(discriminator="type")]

# ---------------------------------------------------------------- run


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


class Run(Strict):
    """A training run: what to run, where, and what to do when it fails."""

    apiVersion: Literal["reconciler/v1"] = Field(description="Version of the spec language.")
    kind: Literal["Run"] = Field(description="What this file describes: a training run.")
    metadata: Metadata = Field(description="The run's name (its file name) and labels.")
    spec: RunSpec = Field(description="The run's desired state.")


# ---------------------------------------------------------------- execution templates


class SlurmSettings(Strict):
    """A Slurm cluster that runs are handed to: where its commands run and what they ask for."""

    login: str = Field("local", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="Where sbatch, squeue, "
                       "scontrol and scancel run: local (this machine) or the name of a Fleet machine (the "
                       "cluster's login node, reached over SSH).", examples=["login1"],
                       json_schema_extra={"patternErrorMessage": "local, or a Fleet machine's name"})
    workspace_root: str = Field(min_length=1, description="A folder on the cluster's shared file system, at the "
                                "same path on the login host and every compute node: bundles are staged there "
                                "and jobs write their runtime/ files there.", examples=["/shared/reconciler"])
    partition: str | None = Field(None, description="The partition jobs are submitted to (the cluster's default "
                                  "when unset).", examples=["gpu"])
    time_limit: Annotated[str, Field(pattern=r"^[0-9:-]+$", json_schema_extra={
        "patternErrorMessage": "minutes, or [days-]hours:minutes:seconds"})] | None = Field(
        None, description="sbatch --time (minutes, or [days-]hours:minutes:seconds); the partition's limit when "
                          "unset.", examples=["24:00:00"])
    gres: str = Field("gpu", pattern=r"^[A-Za-z0-9_]+(:[A-Za-z0-9_.-]+)?$", description="The GRES that GPUs are "
                      "requested as: gpu, or gpu:<type> (--gres=<gres>:<gpu_count>).", examples=["gpu:h100"],
                      json_schema_extra={"patternErrorMessage": "gpu, or gpu:<type>"})
    sbatch_args: list[str] = Field(default_factory=list, description="More sbatch options, as is (for example "
                                   "--account=ml or --qos=high).", examples=[["--account=ml"]])
    env: EnvMap = Field(default_factory=dict, description="Environment of the Slurm commands (for example "
                        "SLURM_CONF); never secrets.", examples=[{"SLURM_CONF": "/etc/slurm/slurm.conf"}])


class Placement(Strict):
    """Where runs go."""

    kind: Literal["local", "ssh", "rental", "slurm"] = Field(
        description="local: this machine; ssh: a machine of a Fleet; rental: a machine rented from a Provider "
                    "for the run (the cheapest offer that fits its resources), given back when it ends; slurm: "
                    "submitted to a Slurm cluster (placement.slurm), which chooses the machines.")
    fallback: Literal["rental"] | None = Field(
        None, description="ssh placement only: when no fleet machine has room now, rent one (from any Provider; "
                          "the cheapest offer that fits). A run that fits a free fleet machine never rents.")
    slurm: SlurmSettings | None = Field(None, description="slurm placement: the cluster (required there, and only "
                                        "there).")

    @model_validator(mode="after")
    def _fallback(self):
        if self.fallback is not None and self.kind != "ssh":
            raise ValueError("fallback: rental is for ssh placement (in-house first, then rented)")
        if (self.kind == "slurm") != (self.slurm is not None):
            raise ValueError("slurm placement needs placement.slurm (login, workspace_root), and only it may "
                             "have one")
        return self


class LaunchMode(Strict):
    """How runs are started on their machine."""

    kind: Literal["host_process", "docker"] = Field(description="host_process: a process group on the machine; "
                                                    "docker: a container (needs an image).")
    network: Literal["none", "host"] = Field("none", description="docker: the container's network (none, or the "
                                             "host's).")
    pull: bool = Field(False, description="docker: allow pulling a missing image (otherwise it must be on the "
                       "machine already).")


class TemplateDefaults(Strict):
    """Settings every run of the template gets, unless it overrides them."""

    target: str | None = Field(None, description="ssh placement: a Fleet or machine name (any fleet machine "
                               "when unset); rental placement: a Provider name (any provider when unset); not for "
                               "local placement.", examples=["lab"])
    detach: bool = Field(True, description="Run detached from the reconciler: the run keeps going when the "
                         "reconciler or its connection goes away.")
    image: str | None = Field(None, description="Container image for docker launches.",
                              examples=["registry.example/trainer:1.4"])
    resources: Resources = Field(default_factory=Resources, description="What each run needs: GPUs, CPUs, "
                                 "memory.")
    runtime_env: EnvMap = Field(default_factory=dict, description="Environment variables of every run; never "
                                "secrets (those are spec.secrets of a run).", examples=[{"PYTHONUNBUFFERED": "1"}])
    python: str | None = Field(None, description="Execution plane's python for ms-swift tasks.",
                               examples=["/opt/swift/bin/python"])
    selector: dict[str, str] = Field(default_factory=dict, description="ssh placement: only fleet machines with "
                                     "these labels (key: value).", examples=[{"site": "basement"}])


class ExecutionTemplate(Strict):
    """How and where runs execute. The backend is chosen by placement.kind and launch_mode.kind only."""

    apiVersion: Literal["reconciler/v1"] = Field(description="Version of the spec language.")
    kind: Literal["ExecutionTemplate"] = Field(description="What this file describes: how and where runs "
                                               "execute.")
    id: str = Field(pattern=DNS_LABEL, max_length=DNS_LABEL_MAX, description="The template's id, which runs name "
                    "in spec.template; a DNS label equal to the file name without .yaml.", examples=["ssh-docker"],
                    json_schema_extra={"patternErrorMessage": DNS_LABEL_MESSAGE})
    description: str = Field("", description="What the template is for, for people.")
    placement: Placement = Field(description="Where runs go: this machine or a Fleet machine.")
    launch_mode: LaunchMode = Field(description="How runs start: a host process or a docker container.")
    defaults: TemplateDefaults = Field(default_factory=TemplateDefaults, description="Settings of every run, "
                                       "unless overridden.")
    allow_overrides: list[Literal[OVERRIDABLE]] = Field(  # type: ignore[valid-type]
        default_factory=list, description="Keys of defaults a run may override (spec.overrides).",
        examples=[["resources", "runtime_env"]], json_schema_extra={"uniqueItems": True})

    @model_validator(mode="after")
    def _slurm_host_process(self):
        if self.placement.kind == "slurm" and self.launch_mode.kind != "host_process":
            raise ValueError("slurm placement runs the job as a host process on the nodes Slurm gives it "
                             "(launch_mode.kind: host_process)")
        return self

    @property
    def backend_key(self) -> str:
        return f"{self.placement.kind}_{self.launch_mode.kind}"


# ---------------------------------------------------------------- fleets


class SshEndpoint(Strict):
    """How the reconciler logs in to a machine."""

    host: str = Field(description="Host name or address.", examples=["gpu1.lab.example", "127.0.0.1"])
    port: int = Field(22, ge=1, le=65535, description="SSH port.")
    user: str = Field(description="Login user.", examples=["train"])
    identity_file: str | None = Field(None, description="Private key path on the reconciler host.",
                                      examples=["~/.ssh/lab"])
    host_key: str | None = Field(
        None, description="Pinned public host key, '<key-type> <base64>' as in the host's "
                          "/etc/ssh/ssh_host_*_key.pub (a trailing comment is ignored); or use the fleet's "
                          "known_hosts.",
        examples=["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHabkw7ILXAgq2JQD8TN++zRtBACjuiUiEZ99iJmmjZl"],
    )


class GpuGroup(Strict):
    """GPUs of one type on a machine."""

    type: str = Field(description="GPU model, as runs ask for it in gpu_type.", examples=["H100"])
    count: int = Field(ge=1, le=64, description="How many of them.", examples=[8])
    memory_gb: float | None = Field(None, gt=0, le=1024, description="Memory per GPU, in GB.", examples=[80])


class MachineResources(Strict):
    """What a machine offers; runs are placed where their resources fit."""

    gpus: list[GpuGroup] = Field(default_factory=list, description="GPU groups, one per GPU type.")
    cpu_count: int | None = Field(None, ge=1, le=4096, description="CPU cores.", examples=[64])
    memory_gb: float | None = Field(None, gt=0, le=65536, description="Host memory, in GB.", examples=[512])


class Machine(Strict):
    """One registered machine."""

    name: str = Field(pattern=DNS_LABEL, max_length=DNS_LABEL_MAX, description="Machine name, unique across all "
                      "fleets (a DNS label).", examples=["lab-1"],
                      json_schema_extra={"patternErrorMessage": DNS_LABEL_MESSAGE})
    ssh: SshEndpoint = Field(description="How to log in.")
    resources: MachineResources = Field(default_factory=MachineResources, description="GPUs, CPUs and memory.")
    max_tasks: int = Field(1, ge=0, le=1024, description="Runs at once; 0 drains the machine: nothing new starts, "
                           "running work finishes.")
    labels: dict[str, str] = Field(default_factory=dict, description="Free-form string labels.",
                                   examples=[{"site": "basement"}])
    workspace_root: str = Field("reconciler-work", description="Where run workspaces live (relative to the "
                                "login's home, or absolute).")
    docker_host: str | None = Field(None, description="DOCKER_HOST on the machine, when not the default socket.",
                                    examples=["unix:///run/user/1000/docker.sock"])
    python: str | None = Field(None, description="Execution plane python for ms-swift tasks on this machine.",
                               examples=["/opt/swift/bin/python"])
    connect: Literal["ssh", "tunnel"] = Field(
        "ssh", description="ssh: the reconciler dials ssh.host:ssh.port. tunnel: the machine accepts no inbound "
                           "connections; its `reconcile agent` holds a reverse tunnel to the reconciler's host, "
                           "reached on 127.0.0.1:tunnel_port (ssh.host is then only the machine's name for "
                           "people; pin ssh.host_key).")
    tunnel_port: int | None = Field(None, ge=1, le=65535, description="connect: tunnel only: the port on the "
                                    "reconciler host's loopback where the agent's tunnel listens.",
                                    examples=[30024])
    foreign_gpus: Literal["ignore", "avoid"] = Field(
        "ignore", description="avoid: a GPU that a process the reconciler did not start is using (an engineer's, "
                              "by hand) is not handed to a run; the probe reads the GPUs' process list "
                              "(nvidia-smi) each pass. ignore: only the reconciler's own runs count.")

    @model_validator(mode="after")
    def _tunnel(self):
        if self.connect == "tunnel" and self.tunnel_port is None:
            raise ValueError("connect: tunnel needs tunnel_port (the agent's listen port on the reconciler host)")
        if self.connect != "tunnel" and self.tunnel_port is not None:
            raise ValueError("tunnel_port is only for connect: tunnel")
        return self


class FleetSpec(Strict):
    """The machines of the fleet."""

    machines: list[Machine] = Field(min_length=1, description="The machines; at least one.")
    known_hosts: str | None = Field(None, description="known_hosts file on the reconciler host, for machines "
                                    "without ssh.host_key.", examples=["~/.ssh/known_hosts"])


class Fleet(Strict):
    """Registered machines: in-house servers and long-lived rentals."""

    apiVersion: Literal["reconciler/v1"] = Field(description="Version of the spec language.")
    kind: Literal["Fleet"] = Field(description="What this file describes: registered machines.")
    metadata: Metadata = Field(description="The fleet's name (its file name) and labels.")
    spec: FleetSpec = Field(description="The fleet's machines.")


# ---------------------------------------------------------------- providers


class Offer(Strict):
    """One machine shape a provider rents out, and its price."""

    id: str = Field(pattern=DNS_LABEL, max_length=DNS_LABEL_MAX, description="The offer's name in this catalog "
                    "(a DNS label); the plan and the status name it.", examples=["h100x1"],
                    json_schema_extra={"patternErrorMessage": DNS_LABEL_MESSAGE})
    resource: str | None = Field(None, description="The provider's own name for the shape, when it has one (Targon "
                                 "resource_name, Lambda instance_type_name); defaults to id.",
                                 examples=["h200-small"])
    gpu_type: str | None = Field(None, description="GPU model (matched without regard to case against a run's "
                                 "gpu_type); none for a CPU machine.", examples=["H100"])
    gpu_count: int = Field(0, ge=0, le=64, description="GPUs in the machine.", examples=[1])
    gpu_memory_gb: float | None = Field(None, gt=0, le=1024, description="Memory per GPU, in GB (checked when "
                                        "the rental's GPUs are verified).", examples=[80])
    cpu_count: int | None = Field(None, ge=1, le=4096, description="CPU cores.", examples=[16])
    memory_gb: float | None = Field(None, gt=0, le=65536, description="Host memory, in GB.", examples=[128])
    region: str | None = Field(None, description="Where the machine is, as the provider names it.",
                               examples=["us-east-1"])
    price_per_hour: float = Field(ge=0, le=100000, description="What the machine costs per hour, in the currency "
                                  "of the provider's bills; cheapest fitting offer wins.", examples=[2.4])

    @model_validator(mode="after")
    def _gpus(self):
        if self.gpu_type and self.gpu_count == 0:
            raise ValueError("gpu_type is set but gpu_count is 0")
        return self


class RateLimit(Strict):
    """How fast the reconciler may call the provider's API (one token bucket, shared by every thread)."""

    requestsPerSecond: float = Field(2.0, gt=0, le=1000, description="Sustained calls per second.")
    burst: int = Field(5, ge=1, le=1000, description="Calls allowed at once after a quiet spell.")


class ProviderLimits(Strict):
    """What the reconciler may spend at this provider; reaching a limit stops new provisioning only."""

    maxMachines: int | None = Field(None, ge=0, le=100000, description="Rentals alive at once (provisioning "
                                    "included).", examples=[8])
    maxPricePerHour: float | None = Field(None, ge=0, description="Sum of the hourly prices of the rentals alive "
                                          "at once.", examples=[40])
    budget: float | None = Field(None, ge=0, description="Total the runs' rentals at this provider may cost, "
                                 "counted from their status files (cost.so_far); reached: no new rental.",
                                 examples=[1000])


class RentalSsh(Strict):
    """How the reconciler logs in to this provider's machines."""

    user: str = Field("root", description="Login user on a rental.", examples=["ubuntu"])
    port: int = Field(22, ge=1, le=65535, description="SSH port inside the rental (the provider maps it).")
    identity_file: str | None = Field(None, description="Private key on the reconciler host; its .pub is what "
                                      "the provider installs. The local provider makes one when unset.",
                                      examples=["~/.ssh/rentals"])
    image: str | None = Field(None, description="Machine or container image to boot, for providers that take one "
                              "(it must run sshd).", examples=["ghcr.io/acme/trainer-sshd:1.2"])
    workspace_root: str = Field("reconciler-work", description="Where run workspaces live on a rental (relative "
                                "to the login's home, or absolute).")
    python: str | None = Field(None, description="Python for ms-swift tasks on the rental.",
                               examples=["/opt/swift/bin/python"])
    docker_host: str | None = Field(None, description="DOCKER_HOST on the rental, for docker launches, when not "
                                    "the default socket.", examples=["unix:///run/docker.sock"])


class LocalProviderSettings(Strict):
    """type local: rentals are sshd servers on this machine's loopback (no account, nothing billed)."""

    stateDir: str | None = Field(None, description="Where the local provider keeps its rentals (default "
                                 "~/.reconciler/local-provider/<provider name>).")
    delaySeconds: float = Field(0, ge=0, le=3600, description="Provisioning takes this long.")
    failureRate: float = Field(0, ge=0, le=1, description="Share of provisionings that fail (for tests of the "
                               "retry path).")
    seed: int | None = Field(None, description="Seed of the failure draws (reproducible tests).")
    login: Literal["own", "self"] = Field("own", description="own: each rental has a unix user of its own (when "
                                          "the reconciler runs as root; otherwise as self); self: rentals log in as "
                                          "the reconciler's own user (its tools, e.g. an ms-swift environment, "
                                          "are then usable on them).")
    misreport: dict[str, str] = Field(default_factory=dict, description="Offer id → the GPU model its rentals "
                                      "report (a test of GPU verification: the run must not land there).",
                                      examples=[{"h100x1": "A10"}])


class CommandProviderSettings(Strict):
    """type command: any provider, through executables of your own that print JSON (see docs/rentals.md)."""

    provision: list[str] = Field(min_length=1, description="Reads {name, offer} as JSON on stdin; prints the "
                                 "rental as JSON.", examples=[["./providers/acme.py", "provision"]])
    inventory: list[str] = Field(min_length=1, description="Prints every rental of the account as a JSON list.",
                                 examples=[["./providers/acme.py", "list"]])
    terminate: list[str] = Field(min_length=1, description="Gets the rental id as its last argument; exit 0 "
                                 "when it is gone (also when it was gone already).",
                                 examples=[["./providers/acme.py", "terminate"]])
    timeoutSeconds: float = Field(60, gt=0, le=3600, description="Each call is killed after this long.")
    env: EnvMap = Field(default_factory=dict, description="Plain settings for the executables (a state folder, "
                        "a region), set in their environment; never secrets: the provider's secret is "
                        "spec.credentials, and no other variable of the reconciler host reaches them.",
                        examples=[{"ACME_REGION": "eu-west"}])


PROVIDER_TYPES = ("local", "targon", "lambda", "command")


class ProviderSpec(Strict):
    """A rental provider: its account, catalog, limits and how long its machines are kept."""

    type: Literal[PROVIDER_TYPES] = Field(description="Which adapter talks to it: local (sshd servers on this "  # type: ignore[valid-type]
                                          "machine), targon, lambda, or command (executables of your own).")
    credentials: Annotated[str, Field(pattern=ENV_NAME, json_schema_extra={"patternErrorMessage": ENV_NAME_MESSAGE})] | None = Field(
        None, description="Name of the secret holding the API key, set on the reconciler host; never the value.",
        examples=["TARGON_API_KEY"])
    endpoint: str | None = Field(None, description="API base URL, when not the provider's public one.",
                                 examples=["https://api.targon.com/tha/v2"])
    project: str | None = Field(None, description="Provider project or account scope the rentals go in "
                                "(Targon project_id).")
    rateLimit: RateLimit = Field(default_factory=RateLimit, description="API call rate (a token bucket).")
    offers: list[Offer] = Field(min_length=1, description="The catalog: shapes and prices runs may rent.")
    limits: ProviderLimits = Field(default_factory=ProviderLimits, description="Machines, hourly spend and "
                                   "budget; reaching one stops new provisioning, with a condition saying so.")
    idle: float = Field(0, ge=0, le=7 * 86400, description="Seconds a rental stays up after its run ended, for the "
                        "next run that fits it; then it is terminated. 0: terminated as soon as the run is collected.")
    maxDuration: float | None = Field(None, gt=0, description="A rental older than this many seconds is "
                                      "terminated, whatever runs on it (a runaway guard).", examples=[172800])
    orphanGrace: float = Field(600, ge=0, le=30 * 86400, description="A rental named as this repository's that no "
                               "run claims is terminated once it is this many seconds old.")
    provisionTimeout: float = Field(900, gt=0, le=86400, description="A rental not running this long after it was "
                                    "asked for is given back and another is provisioned.")
    ssh: RentalSsh = Field(default_factory=RentalSsh, description="Login details of the provider's machines.")
    local: LocalProviderSettings | None = Field(None, description="type local only.")
    command: CommandProviderSettings | None = Field(None, description="type command only: the executables.")

    @model_validator(mode="after")
    def _settings(self):
        if self.type == "command" and self.command is None:
            raise ValueError("type command needs command: {provision, inventory, terminate}")
        for key in ("local", "command"):
            if getattr(self, key) is not None and self.type != key:
                raise ValueError(f"'{key}' settings are for type {key}, not {self.type}")
        ids = [o.id for o in self.offers]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"offer id(s) {', '.join(dup)} listed twice")
        return self


class Provider(Strict):
    """A rental provider the reconciler may rent machines from."""

    apiVersion: Literal["reconciler/v1"] = Field(description="Version of the spec language.")
    kind: Literal["Provider"] = Field(description="What this file describes: a rental provider.")
    metadata: Metadata = Field(description="The provider's name (its file name) and labels.")
    spec: ProviderSpec = Field(description="The provider's account, catalog and limits.")


# ---------------------------------------------------------------- policy


class PriorityClass(Strict):
    """A named priority: runs of higher classes are placed first."""

    name: str = Field(pattern=DNS_LABEL, max_length=DNS_LABEL_MAX, description="What runs name in spec.priority.",
                      examples=["urgent"], json_schema_extra={"patternErrorMessage": DNS_LABEL_MESSAGE})
    value: int = Field(ge=-1000000, le=1000000, description="Higher is placed first.", examples=[1000])
    default: bool = Field(False, description="The class of runs that name none (at most one class).")


class TeamQuota(Strict):
    """What one team's runs may hold at once."""

    name: str = Field(min_length=1, description="The team: the value of the runs' team label.", examples=["nlp"])
    maxGpus: int | None = Field(None, ge=0, description="GPUs held at once by the team's live runs.", examples=[8])
    maxPricePerHour: float | None = Field(None, ge=0, description="Sum of the hourly prices of the rentals the "
                                          "team's live runs hold.", examples=[20])
    borrow: bool = Field(False, description="May go past maxGpus while other teams leave theirs unused (the sum "
                         "of every team's maxGpus still holds).")


class Preemption(Strict):
    """Whether a pending run may stop lower-priority runs to get an owned machine."""

    enabled: bool = Field(False, description="A pending run that fits nowhere may stop runs of lower priority on "
                          "one owned machine where that makes room (never for a run that still would not fit).")
    graceSeconds: float = Field(60, ge=0, le=3600, description="Between SIGTERM and SIGKILL of a preempted run: "
                                "time to write a checkpoint.")
    minRuntimeSeconds: float = Field(0, ge=0, le=30 * 86400, description="A run that has run less than this is "
                                     "not preempted.", examples=[600])


SECRET_PATTERN = r"^[A-Za-z0-9_*?]+$"
RUN_PATTERN = r"^[a-z0-9*?-]+$"
# Names the reconciler itself uses (its settings, the webhook secret, git's and ssh's settings, the
# deploy key's) are never a run's secret, whatever a Policy says; nor is a Provider's credential
# (see reserved_secret).
RESERVED_SECRET_PREFIXES = ("RECONCILER_", "GIT_", "SSH_")


class SecretGrant(Strict):
    """Which runs may ask for which secret names: a run gets a name when some rule that selects it
    lists the name."""

    names: list[Annotated[str, Field(pattern=SECRET_PATTERN, json_schema_extra={
        "patternErrorMessage": "a variable name, or a glob of one (* and ?)"})]] = Field(
        min_length=1, description="Secret names the selected runs may list in spec.secrets; globs allowed (NLP_*).",
        examples=[["HF_TOKEN", "WANDB_API_KEY"], ["NLP_*"]])
    teams: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list, description="Runs whose team label (teamLabel) is one of these. Unset: any team.",
        examples=[["nlp"]])
    runs: list[Annotated[str, Field(pattern=RUN_PATTERN, json_schema_extra={
        "patternErrorMessage": "a run name, or a glob of one (* and ?)"})]] = Field(
        default_factory=list, description="Runs whose name matches one of these globs. Unset: any run (with "
                                          "teams: the team's runs).", examples=[["nlp-*"]])


class PolicySpec(Strict):
    """Priorities and quotas for every run of the repository."""

    teamLabel: str = Field("team", min_length=1, description="The run label that names a run's team.")
    priorityClasses: list[PriorityClass] = Field(default_factory=list, description="Named priorities.")
    teams: list[TeamQuota] = Field(default_factory=list, description="Per-team limits; a team not listed has none.")
    preemption: Preemption = Field(default_factory=Preemption, description="Preemption of lower-priority runs "
                                   "(off unless enabled).")
    secrets: list[SecretGrant] | None = Field(
        None, description="Which runs may ask for which secrets. Unset: any run may ask for any name but the "
                          "reconciler's own (RECONCILER_*, GIT_*, SSH_*, Providers' credentials); set (even "
                          "empty): only what a rule grants.",
        examples=[[{"names": ["HF_TOKEN"], "teams": ["nlp"]}, {"names": ["NLP_*"], "runs": ["nlp-*"]}]])

    @model_validator(mode="after")
    def _unique(self):
        for what, names in (("priority class", [c.name for c in self.priorityClasses]),
                            ("team", [t.name for t in self.teams])):
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise ValueError(f"{what} {', '.join(dup)} listed twice")
        if sum(c.default for c in self.priorityClasses) > 1:
            raise ValueError("more than one priority class is the default")
        return self


class Policy(Strict):
    """Priorities, team quotas and secret grants: policy as code, validated in the pull request."""

    apiVersion: Literal["reconciler/v1"] = Field(description="Version of the spec language.")
    kind: Literal["Policy"] = Field(description="What this file describes: priorities, quotas and secret grants.")
    metadata: Metadata = Field(description="The policy's name (its file name); one Policy per repository.")
    spec: PolicySpec = Field(description="Priority classes, team quotas and which runs may have which secrets.")


def reserved_secret(name: str, reserved: Iterable[str] = ()) -> bool:
    """A name the reconciler itself uses: never delivered to a run. ``reserved``: more such names
    (the credentials Providers declare)."""
    return name.startswith(RESERVED_SECRET_PREFIXES) or name in set(reserved)


def secret_refusal(rules: list | None, run: str, team: str | None, name: str, reserved: Iterable[str] = (),
                   team_label: str = "team") -> str | None:
    """Why run ``run`` (of ``team``) may not have the secret ``name`` under ``rules`` (the Policy's
    spec.secrets, raw dicts or SecretGrant), or None when it may.

    No rules (no Policy, or no spec.secrets): any name that is not reserved. Rules: only a name
    that some rule selecting the run lists; a rule selects a run by every selector it gives
    (teams, runs), and every run when it gives none."""
    if reserved_secret(name, reserved):
        return f"secret '{name}' is the reconciler's own and is never given to runs"
    if rules is None:
        return None
    for rule in rules:
        get = rule.get if isinstance(rule, dict) else (lambda k, r=rule: getattr(r, k, None))
        names = [n for n in get("names") or [] if isinstance(n, str)]
        teams = [t for t in get("teams") or [] if isinstance(t, str)]
        runs = [r for r in get("runs") or [] if isinstance(r, str)]
        if teams and team not in teams:
            continue
        if runs and not any(fnmatch.fnmatchcase(run, g) for g in runs):
            continue
        if any(fnmatch.fnmatchcase(name, g) for g in names):
            return None
    who = f"run '{run}'" + (f" ({team_label} {team})" if team else f" (no {team_label} label)")
    return f"secret '{name}' is not granted to {who} by the Policy's spec.secrets"


KINDS: dict[str, type[BaseModel]] = {"Run": Run, "ExecutionTemplate": ExecutionTemplate, "Fleet": Fleet,
                                     "Provider": Provider, "Policy": Policy}

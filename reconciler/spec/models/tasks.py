"""The task a run executes: a plain command, or ms-swift training (``swift sft``, ``swift rlhf``).

The ms-swift tasks type the arguments people set most and pass any other through ``args``, which
is why the arguments the reconciler sets itself are refused there.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Field, field_serializer, field_validator, model_validator

from .common import SWIFT_FORK, EnvMap, Strict

# ms-swift arguments the reconciler sets itself (artifacts location and resume); never in args.
SWIFT_MANAGED = ("output_dir", "add_version", "resume_from_checkpoint")
# Task fields that are the reconciler's, not ms-swift arguments (swift.TYPED_SKIP renders none of them).
SWIFT_OWN = ("type", "args", "resume", "requires")


def _as_swift_parses(cls, v: Any, info) -> Any:
    from .swift_values import typed_value
    return typed_value(cls.command(), info.field_name, v)


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


def _tuner_types() -> list[str]:
    # The built-in tuners (ms-swift's get_supported_tuners, recorded in swift_args.json): editor suggestions
    # only; ms-swift takes any name (plugin tuners register their own), and so does the spec.
    from reconciler.tasks.swift import swift_tuner_types
    return swift_tuner_types()


_STEPS = "Optimizer steps"


def _swift_choices(command: str, name: str) -> tuple:
    from reconciler.tasks.swift import swift_argument_specs
    return tuple(swift_argument_specs(command)[name]["choices"])


class SwiftCommon(Strict):
    """Typed ms-swift arguments: their types and choices are ms-swift's own (swift_args.json), nothing stricter.

    Each value is parsed as ms-swift's parser would parse it (``swift_values.typed_value``), so a
    typed field refuses exactly what ms-swift refuses, with ms-swift's reason.
    """

    model: str = Field(description="Model id (hub) or path on the execution plane; a staged model folder is "
                       "inputs/<path>.", examples=["Qwen/Qwen2.5-7B-Instruct"])
    model_type: str | None = Field(None, description="ms-swift model type; needed for local model folders.",
                                   examples=["qwen2"])
    template: str | None = Field(None, description="ms-swift chat template; needed for local model folders.",
                                 examples=["qwen"])
    dataset: list[str] = Field(default_factory=list, description="Training datasets: hub ids or paths (inputs/... "
                               "for staged files); ms-swift's 'path#N' samples N rows. Needed unless "
                               "args.cached_dataset is set.", examples=[["inputs/data/train.jsonl"]])
    val_dataset: list[str] = Field(default_factory=list, description="Validation datasets, written like dataset.",
                                   examples=[["inputs/data/val.jsonl"]])
    tuner_type: str = Field("lora", min_length=1, description="How the model is tuned: full fine-tuning or an "
                            "adapter (ms-swift 4's name; ms-swift 3 called it train_type). Any tuner ms-swift or a "
                            "plugin registers.", json_schema_extra={"examples": _tuner_types()})
    max_steps: int | None = Field(None, description=f"{_STEPS} to train for; overrides num_train_epochs "
                                  "(-1: not set).", examples=[2000])
    num_train_epochs: float | None = Field(None, description="Passes over the training data.", examples=[3])
    learning_rate: float | None = Field(None, description="Peak learning rate.", examples=[1.0e-4])
    per_device_train_batch_size: int | None = Field(None, description="Training batch size per GPU.",
                                                    examples=[1])
    per_device_eval_batch_size: int | None = Field(None, description="Evaluation batch size per GPU.")
    gradient_accumulation_steps: int | None = Field(None, description="Batches accumulated per optimizer step.",
                                                    examples=[16])
    max_length: int | None = Field(None, description="Longest sequence in tokens; longer rows are truncated "
                                   "or dropped (ms-swift's truncation_strategy).", examples=[2048])
    torch_dtype: Literal[_swift_choices("sft", "torch_dtype")] = Field(  # type: ignore[valid-type]
        None, description="Dtype the model is loaded in.")
    lora_rank: int | None = Field(None, description="LoRA rank (LoRA tuner types only).", examples=[8])
    lora_alpha: float | None = Field(None, description="LoRA alpha (LoRA tuner types only).", examples=[32])
    save_steps: float | None = Field(None, description=f"{_STEPS} between checkpoints (what a relaunch "
                                     "resumes from); below 1, a fraction of the total steps.", examples=[100])
    eval_steps: float | None = Field(None, description=f"{_STEPS} between evaluations (below 1: a fraction).")
    logging_steps: int | None = Field(None, description=f"{_STEPS} between log lines (the run's progress "
                                      "in its status).", examples=[5])
    save_total_limit: int | None = Field(None, description="Checkpoints kept; older ones are deleted.",
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

    @field_serializer("lora_alpha", "save_steps", "eval_steps")
    def _whole_as_int(self, v: float | None) -> float | int | None:
        """These were integers before they took ms-swift's float type: a whole value is written as
        one, so the spec digest of a run that sets one (and with it its generation) does not move."""
        return int(v) if isinstance(v, float) and v.is_integer() and abs(v) < 2**53 else v

    @field_validator("model", "model_type", "template", "dataset", "val_dataset", "tuner_type", "max_steps",
                     "num_train_epochs", "learning_rate", "per_device_train_batch_size", "per_device_eval_batch_size",
                     "gradient_accumulation_steps", "max_length", "torch_dtype", "lora_rank", "lora_alpha",
                     "save_steps", "eval_steps", "logging_steps", "save_total_limit", "seed", mode="before")
    @classmethod
    def _as_swift_parses(cls, v: Any, info) -> Any:
        return _as_swift_parses(cls, v, info)

    @classmethod
    def command(cls) -> str:
        return "rlhf" if "rlhf_type" in cls.model_fields else "sft"

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


class SwiftRlhfTask(SwiftCommon):
    """Preference or reinforcement learning with ms-swift (``swift rlhf``)."""

    type: Literal["swift-rlhf"] = Field(description="Task type: ms-swift preference or RL training (swift rlhf).")
    rlhf_type: Literal[_swift_choices("rlhf", "rlhf_type")] = Field(  # type: ignore[valid-type]
        "dpo", description="Preference or RL algorithm (ms-swift's default: dpo).", examples=["dpo"])
    beta: float | None = Field(None, description="KL or preference strength (0 turns the KL term off in grpo).",
                               examples=[0.1])
    ref_model: str | None = Field(None, description="Reference model id or path (defaults to the model itself).")
    reward_funcs: list[str] = Field(default_factory=list, description="grpo: reward functions; a grpo run may "
                                    "instead use args.reward_model, a teacher or a gym environment.",
                                    examples=[["accuracy", "format"]])

    @field_validator("rlhf_type", "beta", "ref_model", "reward_funcs", mode="before")
    @classmethod
    def _rlhf_as_swift_parses(cls, v: Any, info) -> Any:
        return _as_swift_parses(cls, v, info)


TASK_TYPES = {"command": CommandTask, "swift-sft": SwiftSftTask, "swift-rlhf": SwiftRlhfTask}
Task = Annotated[Union[CommandTask, SwiftSftTask, SwiftRlhfTask], Field(discriminator="type")]

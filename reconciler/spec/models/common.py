"""What every kind of spec shares: names, the strict base model, metadata and resources.

The models are strict on write: unknown keys are errors, and values are not coerced (``"2"`` is
not a GPU count). Every field carries a description (and examples where they help) because
``reconcile schema`` turns the models into the JSON Schemas that editors use to complete, explain
and check specs (tests/spec/test_schema.py asserts that no property goes without one).

Some rules are validators in the models or checks in ``spec/checks/``, because they give located
messages of their own; where JSON Schema can say the same thing, the field also carries it for the
schema only (``json_schema_extra``: a pattern, ``uniqueItems``), so an editor shows it as you type.
The rules that span fields of one file (a docker template needs an image) are added by
``schema.py``. Checks that need more than one file (does the template exist, is the name unique)
live in ``spec/checks/`` only. The patterns and messages several kinds use live here, once.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

API_VERSION = "reconciler/v1"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
SHA1_HEX = re.compile(r"^[0-9a-f]{40}$")
DNS_LABEL_MAX = 63


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
# .reconciler/ (checks.inputs.input_problem says the same, and also that the path exists).
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
# name is refused, not just left unchecked) and adds the literal-secret rules of checks/secrets.py.
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

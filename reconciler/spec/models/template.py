"""The ExecutionTemplate kind: how and where runs execute, and what a run may override."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .common import DNS_LABEL, DNS_LABEL_MAX, DNS_LABEL_MESSAGE, EnvMap, Resources, Strict
from .slurm import SlurmAccount, SlurmQos, SlurmSignal, SlurmTime

OVERRIDABLE = ("target", "resources", "runtime_env", "image", "detach", "selector")


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
    time_limit: SlurmTime | None = Field(
        None, description="sbatch --time (minutes, or [days-]hours:minutes:seconds); the partition's limit when "
                          "unset. A run's spec.slurm.time_limit replaces it.", examples=["24:00:00"])
    account: SlurmAccount | None = Field(
        None, description="sbatch --account, unless a run's spec.slurm sets its own.", examples=["ml-team"])
    qos: SlurmQos | None = Field(
        None, description="sbatch --qos, unless a run's spec.slurm sets its own.", examples=["normal"])
    signal: SlurmSignal | None = Field(None, description="A warning signal before the time limit (sbatch "
                                       "--signal=B:<name>@<before_s>), unless a run's spec.slurm sets its own.")
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

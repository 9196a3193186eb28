"""The Fleet kind: registered machines (in-house servers and long-lived rentals) and how to reach them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .common import DNS_LABEL, DNS_LABEL_MAX, DNS_LABEL_MESSAGE, Metadata, Strict


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

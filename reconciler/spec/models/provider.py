"""The Provider kind: a rental provider's account, catalog of offers, limits and machines' login."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from .common import DNS_LABEL, DNS_LABEL_MAX, DNS_LABEL_MESSAGE, ENV_NAME, ENV_NAME_MESSAGE, EnvMap, Metadata, Strict


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
    price_per_hour: float | None = Field(None, ge=0, le=100000, description="What the machine costs per hour, in "
                                         "the currency of the provider's bills; cheapest fitting offer wins. Required "
                                         "for local and command providers; elsewhere it overrides the live price, "
                                         "and when unset the provider's live price is used.", examples=[2.4])
    spot: bool = Field(False, description="Rent it interruptible (Vast.ai bid): cheaper, and the provider may take "
                       "it away; a run opts in by being placed on such an offer. A lost spot machine is replaced like "
                       "any machine that evaporated.")

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


class RunpodSettings(Strict):
    """type runpod: where pods are placed and how much disk they get."""

    cloud: Literal["SECURE", "COMMUNITY"] = Field("SECURE", description="RunPod's cloud tier (REST v2 Cloud).")
    containerDiskGb: int = Field(50, ge=1, le=65536, description="Container disk per pod, in GB.")


class VastSettings(Strict):
    """type vastai: disk and the SSH path of Vast.ai instances."""

    diskGb: float = Field(50, gt=0, le=65536, description="Disk per instance, in GB (priced by the host).")
    direct: bool = Field(False, description="SSH straight to the host's public IP and mapped port (runtype "
                         "'ssh_direc ssh_proxy') instead of Vast's SSH proxy (sshN.vast.ai), the default.")


PROVIDER_TYPES = ("local", "targon", "lambda", "runpod", "vastai", "command")
CATALOG_ONLY = ("local", "command")  # no live offers: the catalog is all there is


class ProviderSpec(Strict):
    """A rental provider: its account, catalog, limits and how long its machines are kept."""

    type: Literal[PROVIDER_TYPES] = Field(description="Which adapter talks to it: local (sshd servers on this "  # type: ignore[valid-type]
                                          "machine), targon, lambda, runpod, vastai, or command (executables of "
                                          "your own).")
    credentials: Annotated[str, Field(pattern=ENV_NAME, json_schema_extra={"patternErrorMessage": ENV_NAME_MESSAGE})] | None = Field(
        None, description="Name of the secret holding the API key, set on the reconciler host; never the value.",
        examples=["TARGON_API_KEY"])
    endpoint: str | None = Field(None, description="API base URL, when not the provider's public one.",
                                 examples=["https://api.targon.com/tha/v2"])
    project: str | None = Field(None, description="Provider project or account scope the rentals go in "
                                "(Targon project_id).")
    rateLimit: RateLimit = Field(default_factory=RateLimit, description="API call rate (a token bucket).")
    offers: list[Offer] = Field(default_factory=list, description="The catalog. Local and command providers: the "
                                "shapes and prices runs may rent (at least one). Targon, Lambda, RunPod, Vast.ai: "
                                "optional filters and price overrides over the provider's live offers (an entry "
                                "matches by resource, else by gpu_type and gpu_count, else by id); without a "
                                "catalog every live on-demand offer may be rented.")
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
    runpod: RunpodSettings | None = Field(None, description="type runpod only.")
    vastai: VastSettings | None = Field(None, description="type vastai only.")

    @model_validator(mode="after")
    def _settings(self):
        if self.type == "command" and self.command is None:
            raise ValueError("type command needs command: {provision, inventory, terminate}")
        for key in ("local", "command", "runpod", "vastai"):
            if getattr(self, key) is not None and self.type != key:
                raise ValueError(f"'{key}' settings are for type {key}, not {self.type}")
        if self.type in CATALOG_ONLY:
            if not self.offers:
                raise ValueError(f"type {self.type} has no live offers: offers (the catalog) needs at least one")
            unpriced = [o.id for o in self.offers if o.price_per_hour is None]
            if unpriced:
                raise ValueError(f"type {self.type} has no live prices: offer(s) {', '.join(unpriced)} need "
                                 "price_per_hour")
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

"""The Policy kind: priorities, team quotas and secret grants, and who may have which secret.

``secret_refusal`` reads the grants both from a validated Policy and from raw mappings, so the
pull-request checks and the launch give the same answer.
"""

from __future__ import annotations

import fnmatch
from typing import Annotated, Iterable, Literal

from pydantic import Field, model_validator

from .common import DNS_LABEL, DNS_LABEL_MAX, DNS_LABEL_MESSAGE, Metadata, Strict


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
    defaultStorage: Annotated[str, Field(pattern=DNS_LABEL, max_length=DNS_LABEL_MAX, json_schema_extra={
        "patternErrorMessage": DNS_LABEL_MESSAGE})] | None = Field(
        None, description="The Storage (specs/storage/<name>.yaml) of runs whose spec.outputs names none. Unset: "
                          "such runs' outputs come back to the reconciler host.", examples=["s3-outputs"])

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

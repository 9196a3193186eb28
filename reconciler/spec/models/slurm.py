"""What a run asks of Slurm beyond its resources: time limit, account, QOS and a warning signal.

A template sets the defaults (placement.slurm) and a run may set its own (spec.slurm): the time a
run needs differs from run to run, and a limit left at the partition's maximum defeats Slurm's
backfill. No allow_overrides key gates them: Slurm itself enforces who may charge which account
or use which QOS, and a partition's MaxTime (an sbatch it refuses fails the run with its words).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from .common import Strict

# man sbatch, --time: "Acceptable time formats include "minutes", "minutes:seconds",
# "hours:minutes:seconds", "days-hours", "days-hours:minutes" and "days-hours:minutes:seconds"";
# 0, UNLIMITED and INFINITE mean no limit (the partition's own still applies).
SLURM_TIME = r"^([0-9]{1,7}(:[0-9]{1,2}){0,2}|[0-9]{1,5}-[0-9]{1,2}(:[0-9]{1,2}){0,2}|UNLIMITED|INFINITE)$"
SLURM_TIME_MESSAGE = ("minutes, minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes or "
                      "days-hours:minutes:seconds (man sbatch, --time)")
SLURM_NAME = r"^[A-Za-z0-9_.-]{1,64}$"


def _slurm_time(v: str) -> str:
    if not re.match(SLURM_TIME, v):
        raise ValueError(f"{v!r} is not a Slurm time limit: {SLURM_TIME_MESSAGE}")
    return v


# A string in one of sbatch's --time formats; the schema carries the same pattern for editors.
SlurmTime = Annotated[str, AfterValidator(_slurm_time),
                      Field(json_schema_extra={"pattern": SLURM_TIME, "patternErrorMessage": SLURM_TIME_MESSAGE})]

SlurmAccount = Annotated[str, Field(pattern=SLURM_NAME, json_schema_extra={"patternErrorMessage": "a Slurm account name"})]
SlurmQos = Annotated[str, Field(pattern=SLURM_NAME, json_schema_extra={"patternErrorMessage": "a Slurm QOS name"})]


class SlurmSignal(Strict):
    """A signal Slurm sends the job before its time limit (sbatch --signal=B:<name>@<before_s>),
    which the launch wrapper passes on to the job so it can save a checkpoint."""

    name: Literal["USR1", "USR2"] = Field(description="The signal: USR1 or USR2 (TERM and KILL are Slurm's own "
                                          "at the limit).", examples=["USR1"])
    # man sbatch, --signal: "sig_time must have an integer value between 0 and 65535"; Slurm may
    # send it up to 60 seconds earlier than asked.
    before_s: int = Field(ge=0, le=65535, description="Seconds before the time limit (Slurm may send it up to 60 s "
                          "earlier).", examples=[300])


class SlurmRequest(Strict):
    """A run's own Slurm requests; unset keys keep the template's."""

    time_limit: SlurmTime | None = Field(None, description="sbatch --time for this run (the template's when "
                                         "unset).", examples=["2:00:00"])
    account: SlurmAccount | None = Field(None, description="sbatch --account: the account charged.",
                                         examples=["ml-team"])
    qos: SlurmQos | None = Field(None, description="sbatch --qos: the quality of service.", examples=["high"])
    signal: SlurmSignal | None = Field(None, description="A warning signal before the time limit, passed on to the "
                                       "job (a checkpoint is saved on it).")


def merged(template, run: SlurmRequest | None) -> SlurmRequest:
    """The run's requests over the template's (SlurmSettings has the same four keys)."""
    out = {k: getattr(template, k) for k in ("time_limit", "account", "qos", "signal")}
    if run is not None:
        out.update({k: v for k, v in run.__dict__.items() if v is not None})
    return SlurmRequest.model_construct(**out)

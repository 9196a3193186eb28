"""How a Slurm job ended, as a machine reports it: bounded, or refused at the trust boundary.

The probe reads Slurm's end state of a job (runtime/slurm_end.py) and the planner decides retries
on it (an admin's cancel is respected, a time limit retried only when the run can resume), so
every field is an enum, a user name of the shape login names have, or a small number; no free
text from the machine reaches a decision or the status.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# Slurm's job end states (man squeue, JOB STATE CODES) that the planner tells apart; OTHER for the rest.
SlurmState = Literal["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                     "BOOT_FAIL", "DEADLINE", "OTHER"]
# A login name (useradd's default NAME_REGEX, with '.' as many sites allow) or a numeric uid.
USER = r"^([a-z_][a-z0-9_.-]{0,31}|[0-9]{1,10})$"
MAX_RANK = 1024


class SlurmEnd(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    state: SlurmState
    ours: bool = False  # cancelled by the reconciler itself (a stop it was asked for)
    by: str | None = Field(None, pattern=USER)  # who cancelled it, when Slurm's accounting says
    rank: int | None = Field(None, ge=0, lt=MAX_RANK)  # the first rank that failed on its own
    rank_exit: int | None = Field(None, ge=0, le=255)

    def record(self) -> dict:
        return self.model_dump(exclude_none=True, exclude_defaults=True) | {"state": self.state}

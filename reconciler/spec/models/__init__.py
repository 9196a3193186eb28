"""The desired-state objects users write, one module per kind (``common`` holds what they share),
and ``KINDS``: the model of each kind a spec file may declare."""

from __future__ import annotations

from pydantic import BaseModel

from .fleet import Fleet
from .policy import Policy
from .provider import Provider
from .run import Run
from .storage import Storage
from .template import ExecutionTemplate

KINDS: dict[str, type[BaseModel]] = {"Run": Run, "ExecutionTemplate": ExecutionTemplate, "Fleet": Fleet,
                                     "Provider": Provider, "Policy": Policy, "Storage": Storage}

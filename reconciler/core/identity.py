"""Run identities: ``<name>-g<generation>-a<attempt>``, and ``<identity>-n<rank>`` for each
node of a run that spans several machines.

Everything a run creates on a machine (workspace folder, process group command line, container
name and labels) carries its identity, so that a pass can always ask "does this instance already
exist?" before creating it. That question, asked every time, is what makes launches idempotent
across crashes and across reconciler hosts.
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple

IDENTITY = re.compile(r"^(?P<name>[a-z0-9]([-a-z0-9]*[a-z0-9])?)-g(?P<gen>[0-9]+)-a(?P<attempt>[0-9]+)"
                      r"(-n(?P<node>[0-9]+))?\Z")  # \Z: "$" would let a trailing newline through


class Identity(NamedTuple):
    name: str
    generation: int
    attempt: int

    def __str__(self) -> str:
        return f"{self.name}-g{self.generation}-a{self.attempt}"


def parse(text: str) -> Identity | None:
    """The attempt an identity names; a node's identity names its run's attempt (see ``node_of``)."""
    return split(text)[0]


# Memoised: a steady pass over 10,000 runs splits the same identities some 60,000 times (the
# planner, the fences, the exposure checks); the answers are immutable and the set is bounded.
@functools.lru_cache(maxsize=32768)
def split(text: str) -> tuple[Identity | None, int | None]:
    """The attempt an identity names and, for a node of a run on several machines, its rank."""
    m = IDENTITY.match(text)
    if not m:
        return None, None
    node = m.group("node")
    return Identity(m.group("name"), int(m.group("gen")), int(m.group("attempt"))), int(node) if node else None


def node_of(text: str) -> int | None:
    """The rank of a node's identity (``...-n<rank>``); None for a one-machine attempt."""
    return split(text)[1]


def node_identity(identity: str, rank: int) -> str:
    return f"{identity}-n{rank}"


def make(name: str, generation: int, attempt: int) -> str:
    return str(Identity(name, generation, attempt))

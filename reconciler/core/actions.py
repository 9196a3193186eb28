"""What a plan's change does: the ``Change.action`` vocabulary.

In core, beside the plan's value types, because every layer above names actions: the planner
makes them, the engine carries them out, status summarizes them, the command line prints them.
"""

from __future__ import annotations

from enum import Enum


class Action(str, Enum):
    """One change's effect on the world.

    - LAUNCH: stage a new instance (generation 1 or a new generation) on a machine and start it.
    - RELAUNCH: start a further attempt, or a new generation replacing a stale one.
    - TERMINATE: stop live instances (a removed or stopped run, a fenced or preempted instance).
    - COLLECT: fetch a finished instance's logs and outputs, and clean up its workspace.
    - MARK_INVALID: record the run as Invalid; nothing on a machine changes.
    - WAIT: do nothing yet (no capacity, a backoff, a missing secret, a machine not answering).
    - ADOPT: take over an instance found running that the status does not record.
    - NONE: nothing to do; the machines already match.
    - PROVISION: rent a machine from a provider.
    - RELEASE: give a rented machine back.
    - SAVE: copy a running instance's newest checkpoint off its machine.

    A ``str`` mixin, so a member equals, hashes and sorts as its value. ``__str__`` and
    ``__format__`` return the plain value, so f-strings, ``%s``, JSON and YAML show the same text
    on every Python version (3.11 changed how mixed-in enums format).
    """

    LAUNCH = "launch"
    RELAUNCH = "relaunch"
    TERMINATE = "terminate"
    COLLECT = "collect"
    MARK_INVALID = "mark_invalid"
    WAIT = "wait"
    ADOPT = "adopt"
    NONE = "none"
    PROVISION = "provision"
    RELEASE = "release"
    SAVE = "save"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


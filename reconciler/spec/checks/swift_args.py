"""ms-swift arguments: every key of a task's ``args`` must be an argument of the command it runs."""

from __future__ import annotations

import difflib


def _check_swift_args(f, task: dict, add) -> None:
    """Every ``args`` key must be an argument of the ms-swift command the task runs.

    ms-swift refuses an unknown argument only once the run has started on a machine (and a typo in a
    rarely read one, say ``lora_dropuot``, may pass unnoticed), so the names are checked here,
    against the list in ``reconciler/tasks/swift_args.json`` (regenerated from ms-swift itself by
    ``scripts/swift_args.py``). Keys the model refuses for another reason (managed, typed,
    renamed) keep that error alone.
    """
    from reconciler.tasks.swift import COMMANDS, swift_arguments
    from ..models.tasks import SWIFT_MANAGED, SwiftRlhfTask, SwiftSftTask

    command = COMMANDS.get(task.get("type"))
    args = task.get("args")
    if command is None or not isinstance(args, dict):
        return
    known = swift_arguments(command)
    model = SwiftSftTask if command == "sft" else SwiftRlhfTask
    own = set(model.model_fields) | set(SWIFT_MANAGED) | {"train_type"}
    for key in args:
        if not isinstance(key, str) or key in known or key in own:
            continue
        close = difflib.get_close_matches(key, sorted(known), n=1)
        others = [c for c in COMMANDS.values() if c != command and key in swift_arguments(c)]
        if others:
            hint = f" (it is one of 'swift {others[0]}'; this task runs 'swift {command}')"
        elif close:
            hint = f" (did you mean '{close[0]}'?)"
        else:
            hint = ""
        add(f, ("spec", "task", "args", key), f"'{key}' is not an argument of ms-swift's 'swift {command}'{hint}")

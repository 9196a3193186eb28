"""ms-swift arguments: names and values, checked against what ms-swift's own parser accepts.

ms-swift refuses an unknown argument or a bad value only once the run has started on a machine (and
a typo in a rarely read one, say ``lora_dropuot``, may pass unnoticed), so both are checked here,
against ``reconciler/tasks/swift_args.json``: the options ms-swift's HfArgumentParser builds, read
from the installed ms-swift by ``scripts/swift_args.py`` (the reconciler never imports swift).

Values, typed fields' and ``args``', are held to the same rules (``models/swift_values.py``: how
ms-swift's parser reads a value); the typed fields are checked by the model, ``args`` here, so each
error is located at its key.
"""

from __future__ import annotations

from ..models.swift_values import suggest, value_problem


def _check_swift_args(f, task: dict, add) -> None:
    """Every ``args`` key must be an argument of the ms-swift command the task runs, with a value it accepts.

    Keys the model refuses for another reason (managed, typed, renamed) keep that error alone.
    """
    from reconciler.tasks.swift import COMMANDS, swift_argument_specs, swift_arguments
    from ..models.tasks import SWIFT_MANAGED, SwiftRlhfTask, SwiftSftTask

    command = COMMANDS.get(task.get("type"))
    args = task.get("args", {})
    if command is None or not isinstance(args, dict):
        return
    _check_data(f, task, args, add)
    specs = swift_argument_specs(command)
    model = SwiftSftTask if command == "sft" else SwiftRlhfTask
    own = set(model.model_fields) | set(SWIFT_MANAGED) | {"train_type"}
    for key, value in args.items():
        if not isinstance(key, str) or key in own:
            continue
        loc = ("spec", "task", "args", key)
        if key in specs:
            problem, _ = value_problem(key, specs[key], value)
            if problem:
                add(f, loc, problem)
            continue
        others = [c for c in COMMANDS.values() if c != command and key in swift_arguments(c)]
        if others:
            hint = f" (it is one of 'swift {others[0]}'; this task runs 'swift {command}')"
        else:
            hint = suggest(key, sorted(specs))
        add(f, loc, f"'{key}' is not an argument of ms-swift's 'swift {command}'{hint}")


def _check_data(f, task: dict, args: dict, add) -> None:
    # SftArguments.__post_init__ (swift/arguments/sft_args.py) refuses a run with neither, for sft and rlhf.
    dataset = task.get("dataset")
    if dataset or args.get("cached_dataset") or not isinstance(dataset, (list, type(None))):
        return
    loc = ("spec", "task", "dataset") if "dataset" in task else ("spec", "task")
    add(f, loc, "no training data: set dataset or args.cached_dataset (ms-swift refuses a run with neither)")

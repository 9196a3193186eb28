"""A run's effective settings: its template's defaults with the run's allowed overrides applied.

Pure and shared by the planner (capacity, placement) and the bundle builder, so both see the same
numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .models import ExecutionTemplate, Resources, Run


@dataclass(frozen=True)
class Effective:
    backend: str  # "<placement>_<launch_mode>"
    placement: str
    launch_mode: str
    target: str | None
    image: str | None
    detach: bool
    network: str
    pull: bool
    python: str | None
    resources: Resources
    runtime_env: dict[str, str] = field(default_factory=dict)
    selector: dict[str, str] = field(default_factory=dict)


def effective(run: Run, template: ExecutionTemplate) -> Effective:
    d, o = template.defaults, run.spec.overrides
    res = d.resources.model_dump()
    if o.resources is not None:
        given = {k: v for k, v in o.resources.model_dump().items() if v is not None}
        # A model named one way replaces a model named the other way.
        if "gpu_type" in given:
            res["gpu_types"] = None
        if "gpu_types" in given:
            res["gpu_type"] = None
        res.update(given)
    env = dict(d.runtime_env)
    env.update(o.runtime_env or {})
    return Effective(
        backend=template.backend_key,
        placement=template.placement.kind,
        launch_mode=template.launch_mode.kind,
        target=o.target if o.target is not None else d.target,
        image=o.image if o.image is not None else d.image,
        detach=o.detach if o.detach is not None else d.detach,
        network=template.launch_mode.network,
        pull=template.launch_mode.pull,
        python=d.python,
        resources=Resources.model_validate(res),
        runtime_env=env,
        selector={**d.selector, **(o.selector or {})},
    )

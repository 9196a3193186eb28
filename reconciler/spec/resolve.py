"""A run's effective settings: its template's defaults with the run's allowed overrides applied.

Pure and shared by the planner (capacity, placement) and the bundle builder, so both see the same
numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .models.common import Resources
from .models.run import Run
from .models.template import ExecutionTemplate


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


def effective(run: Run, template: ExecutionTemplate, memo: dict | None = None) -> Effective:
    """``memo``: a dict the caller keeps for as long as the templates do not change (one plan):
    runs of one template whose overrides are equal share one Effective (treat it as read-only),
    since building it (dumping and revalidating the models) is most of the cost when thousands
    of runs are resolved."""
    if memo is None:
        return _effective(run, template)
    key = _key(run, template)
    if key is None:
        return _effective(run, template)
    found = memo.get(key)
    if found is None or found[0] is not template:  # the template object pins id(template)
        found = memo[key] = (template, _effective(run, template))
    return found[1]


# Effectives by template content, then by the run's spec digest, kept from one plan to the next:
# a queue of thousands of unchanged runs is resolved once, not on every pass. Bounded: a map
# that is full is emptied, which costs one resolution per run on the next pass.
_BY_DIGEST: dict[str, dict[str, Effective]] = {}
BY_DIGEST_MAX = 50_000  # runs of one template content
TEMPLATES_MAX = 16  # template contents (each edit of a template is one more: the old ones go at the bound)


def template_key(template: ExecutionTemplate) -> str:
    """The template's content, as the key its runs' Effectives are kept under across plans."""
    return template.model_dump_json()


def effectives_of(template: ExecutionTemplate) -> dict[str, Effective]:
    """The kept Effectives of the runs of ``template`` (its content: an edited template starts
    afresh), by spec digest: what ``effective_by_digest`` reads and fills."""
    key = template_key(template)
    found = _BY_DIGEST.get(key)
    if found is None:
        if len(_BY_DIGEST) >= TEMPLATES_MAX:
            _BY_DIGEST.clear()
        found = _BY_DIGEST[key] = {}
    return found


def effective_by_digest(run: Run, digest: str, template: ExecutionTemplate, kept: dict[str, Effective],
                        memo: dict | None = None) -> Effective:
    """``effective(run, template, memo)``, looked up in ``kept`` (``effectives_of(template)``)
    by ``digest``, the run's spec content digest (load.run_digest, which covers every override:
    equal digests, equal Effectives). Only a sha256 content digest is looked up."""
    if not digest.startswith("sha256:"):
        return effective(run, template, memo)
    found = kept.get(digest)
    if found is None:
        found = effective(run, template, memo)
        if len(kept) >= BY_DIGEST_MAX:
            kept.clear()
        kept[digest] = found
    return found


_KEYED = {"target", "resources", "runtime_env", "image", "detach", "selector"}  # what _key reads of Overrides


def _key(run: Run, template: ExecutionTemplate) -> tuple | None:
    """Everything of the run its Effective depends on (the template aside), hashable; None when
    a value is not, or the overrides have fields _key does not know (that run is resolved on its
    own)."""
    o = run.spec.overrides
    if o.__dict__.keys() != _KEYED:
        return None
    r = o.resources
    res = None
    if r is not None:
        res = tuple(r.__dict__.values())
        if r.gpu_types is not None:
            res = tuple(tuple(x) if isinstance(x, list) else x for x in res)
    key = (id(template), o.target, o.image, o.detach, res,
           None if o.runtime_env is None else tuple(o.runtime_env.items()),
           None if o.selector is None else tuple(o.selector.items()))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _effective(run: Run, template: ExecutionTemplate) -> Effective:
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

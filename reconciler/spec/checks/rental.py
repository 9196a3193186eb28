"""A rental run must fit some offer of the providers it may use: caught in the pull request, not when
the reconciler first tries to rent."""

from __future__ import annotations

from ..models.template import ExecutionTemplate


def _check_rental(f, overrides: dict, template: ExecutionTemplate, providers: dict, add) -> None:
    """A rental run must fit some offer of the providers it may use: caught in the pull request,
    not when the reconciler first tries to rent. Located at the override that asks too much, else
    at the template reference (its defaults do)."""
    from ..models.provider import Provider
    from ..models.run import Run
    from ..resolve import effective
    from ..offers import fitting_offers

    try:
        run = Run.model_validate(f.data)
    except Exception:  # noqa: BLE001 - the schema reports what is wrong with the run itself
        return
    eff = effective(run, template)
    target = eff.target
    usable = {}
    for name, pf in providers.items():
        if target is not None and name != target:
            continue
        try:
            usable[name] = Provider.model_validate(pf.data)
        except Exception:  # noqa: BLE001 - the provider file reports its own errors
            continue
    loc = ("spec", "overrides", "resources") if isinstance(overrides.get("resources"), dict) else ("spec", "template")
    if target is not None and target not in providers:
        known = ", ".join(sorted(providers)) or "none in specs/"
        where = ("spec", "overrides", "target") if overrides.get("target") is not None else ("spec", "template")
        add(f, where, f"provider '{target}' not found (known: {known})")
        return
    if not providers:
        add(f, ("spec", "template"), f"template '{template.id}' rents machines, but no Provider is defined "
                                     "(add one under specs/, e.g. specs/providers/local.yaml)")
        return
    if usable and not any(fitting_offers(p, eff.resources) for p in usable.values()):
        res = eff.resources
        want = f"{res.gpu_count} x {res.gpu_type or 'any GPU'}" if res.gpu_count else "no GPU"
        if res.memory_gb:
            want += f", {res.memory_gb:g} GB memory"
        if res.cpu_count:
            want += f", {res.cpu_count} CPUs"
        offers = "; ".join(f"{n}: " + ", ".join(o.id for o in p.spec.offers) for n, p in sorted(usable.items()))
        add(f, loc, f"no provider offer fits {want} (offers: {offers})")

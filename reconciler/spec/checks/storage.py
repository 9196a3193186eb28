"""Storages across files: a run's (or the Policy's default) Storage exists, its credentials are
secrets the run may have, and a checkpoint a run starts from lies in that Storage."""

from __future__ import annotations

from typing import Any

from .raw import _at, _dict, _text


def storages_of(by_name: dict[tuple[str, str], Any]) -> dict[str, Any]:
    """The Storage files by name."""
    return {name: f for (kind, name), f in by_name.items() if kind == "Storage"}


def check_storage(checked: list, storages: dict[str, Any], policy, add) -> None:
    from .secrets import provider_credentials

    spec = _dict(policy.data.get("spec")) if policy is not None else {}
    default = _text(spec.get("defaultStorage"))
    if default is not None and default not in storages:
        add(policy, ("spec", "defaultStorage"), f"Storage '{default}' does not exist (no file of kind Storage "
                                                f"named {default})")
    rules = spec.get("secrets")
    grants = ([r for r in rules if isinstance(r, dict)] if isinstance(rules, list) else None,
              provider_credentials(checked), spec.get("teamLabel") if isinstance(spec.get("teamLabel"), str) else "team")
    for f in checked:
        if f.kind != "Run":
            continue
        named = _text(_at(f.data, "spec", "outputs", "storage"))
        name = named or default
        if name is None:
            continue
        loc = ("spec", "outputs", "storage") if named else ("spec",)
        target = storages.get(name)
        if target is None:
            if named:
                add(f, loc, f"Storage '{name}' does not exist (no file of kind Storage named {name})")
            continue
        if target.diags:
            add(f, loc, f"Storage '{name}' ({target.rel}) is invalid")
        _check_grants(f, target, loc, grants, add)
        _check_start_from(f, target, add)


def _check_grants(f, storage, loc: tuple, grants: tuple, add) -> None:
    """The machine gets the Storage's credentials, so the run must be one the Policy grants them to."""
    from ..models.policy import secret_refusal

    rules, reserved, label = grants
    run = _text(_at(f.data, "metadata", "name")) or ""
    team = _at(f.data, "metadata", "labels", label)
    for option, secret in sorted(_dict(_at(storage.data, "spec", "credentials")).items()):
        if not isinstance(secret, str):
            continue
        why = secret_refusal(rules, run, team if isinstance(team, str) else None, secret, reserved, label)
        if why:
            add(f, loc, f"Storage '{_at(storage.data, 'metadata', 'name')}' credential {option}: {why}")


def _check_start_from(f, storage, add) -> None:
    uri = _text(_at(f.data, "spec", "outputs", "start_from", "uri"))
    if uri is None or ":" not in uri:
        return
    name = _text(_at(storage.data, "metadata", "name")) or ""
    remote, _, path = uri.partition(":")
    sspec = _dict(storage.data.get("spec"))
    root = "/".join(p for p in (_text(sspec.get("bucket")), _text(sspec.get("prefix"))) if p)
    if remote not in (name, name.replace("-", "_")):
        add(f, ("spec", "outputs", "start_from", "uri"), f"'{uri}' is not in Storage '{name}' (its URIs start "
                                                          f"with {name.replace('-', '_')}:)")
    elif root and not path.startswith(root + "/"):
        add(f, ("spec", "outputs", "start_from", "uri"), f"'{uri}' is outside Storage '{name}' (bucket and "
                                                          f"prefix {root}/)")
    else:
        ckpt = _text(_at(f.data, "spec", "outputs", "start_from", "checkpoint"))
        if ckpt is not None and path.rsplit("/", 1)[-1] != ckpt:
            add(f, ("spec", "outputs", "start_from", "checkpoint"), f"'{ckpt}' is not the last part of the uri")

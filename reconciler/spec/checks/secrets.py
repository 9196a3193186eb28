"""Secrets: literal values that are or look like credentials, and the secret names a run may ask for
(the Policy's grants, never the reconciler's own)."""

from __future__ import annotations

import re
from typing import Any, Iterator

from .raw import _at, _dict, _list

SECRET_KEY = re.compile(r"(?:^|[_\-.])(TOKEN|KEY|SECRET|PASSWORD|PASSWD|APIKEY|CREDENTIALS?)$", re.IGNORECASE)
CREDENTIAL = re.compile(
    r"^(?:hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_\-]{20,}|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}"
    r"|AKIA[0-9A-Z]{16}|xox[abpr]-[A-Za-z0-9\-]{10,}|glpat-[A-Za-z0-9_\-]{20,})"
)
# Keys whose values are public or are references, never secrets.
NOT_SECRET_PATHS = {("spec", "machines", "*", "ssh", "host_key"), ("spec", "machines", "*", "ssh", "identity_file"),
                    ("spec", "credentials")}  # a Provider's credentials: the name of a secret


def _walk(data: Any, loc: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _walk(v, loc + (k,))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _walk(v, loc + (i,))
    else:
        yield loc, data


def _generic(loc: tuple) -> tuple:
    return tuple("*" if isinstance(p, int) else p for p in loc)


# A cheap look at the raw text decides whether the walk below is needed at all. Key names are
# matched in any case (as SECRET_KEY is); credential prefixes in their case (as CREDENTIAL is), so
# that naming a secret (``secrets: [HF_TOKEN]``) does not look like holding one.
MAYBE_SECRET = re.compile(
    r"(?i:token|key|secret|passw(?:or)?d|apikey|credentials?)[\"']?\s*:|hf_|sk-|gh[pousr]_|github_pat_|AKIA|xox|glpat-"
)


def secret_values(data: Any, text: str | None = None) -> list[tuple[tuple, str]]:
    """Literal values that are, or look like, credentials. The fix is always a name under secrets:."""
    if text is not None and not MAYBE_SECRET.search(text):
        return []
    found = []
    for loc, value in _walk(data):
        if not isinstance(value, str) or not value or _generic(loc) in NOT_SECRET_PATHS:
            continue
        key = next((p for p in reversed(loc) if isinstance(p, str)), "")
        if CREDENTIAL.match(value.strip()):
            found.append((loc, "this value looks like a credential; never commit one: list its name under "
                               "spec.secrets and set it on the reconciler host"))
        elif loc and isinstance(loc[-1], str) and SECRET_KEY.search(key) and "secrets" not in loc \
                and not _names_a_secret(loc, value):
            name = key if re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key) else "NAME"
            found.append((loc, f"'{key}' holds a literal secret; remove the value, list '{name}' under "
                               "spec.secrets and set it on the reconciler host"))
    return found


def provider_credentials(files: list) -> set[str]:
    """The secret names Providers' files declare as their credentials (an invalid file's too: it
    still names it): the reconciler's own, never given to a run."""
    return {c for f in files if f.kind == "Provider" for c in [_at(f.data, "spec", "credentials")]
            if isinstance(c, str)}


def _check_secret_grants(checked: list, policy, add) -> None:
    """Each secret a run lists must be one the Policy grants it (spec.secrets of the Policy; no
    rules: any name), and never one the reconciler uses itself (its settings, git's and ssh's,
    a Provider's credential). Reported at the run's spec.secrets entry; a rule that lists a
    reserved name literally is reported at the Policy."""
    from ..models.policy import reserved_secret, secret_refusal

    reserved = provider_credentials(checked)
    spec = _dict(policy.data.get("spec")) if policy is not None else {}
    rules = spec.get("secrets")
    rules = [r for r in rules if isinstance(r, dict)] if isinstance(rules, list) else None
    label = spec.get("teamLabel") if isinstance(spec.get("teamLabel"), str) else "team"
    for i, rule in enumerate(rules or []):
        for j, name in enumerate(_list(rule.get("names"))):
            if isinstance(name, str) and not any(c in name for c in "*?") and reserved_secret(name, reserved):
                add(policy, ("spec", "secrets", i, "names", j),
                    f"'{name}' is the reconciler's own secret and is never given to runs; remove it")
    for f in checked:
        if f.kind != "Run":
            continue
        name = _at(f.data, "metadata", "name")
        team = _at(f.data, "metadata", "labels", label)
        for i, secret in enumerate(_list(_at(f.data, "spec", "secrets"))):
            if not isinstance(secret, str):
                continue
            why = secret_refusal(rules, name if isinstance(name, str) else "", team if isinstance(team, str) else None,
                                 secret, reserved, label)
            if why:
                granted = policy is not None and rules is not None and not reserved_secret(secret, reserved)
                where = f" ({policy.rel})" if granted else ""
                add(f, ("spec", "secrets", i), why + where)


def _names_a_secret(loc: tuple, value: str) -> bool:
    """A Storage's spec.credentials maps rclone options (secret_access_key, ...) to the names of
    secrets: a variable name there is a reference, not a value."""
    return len(loc) == 3 and loc[:2] == ("spec", "credentials") and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value) is not None

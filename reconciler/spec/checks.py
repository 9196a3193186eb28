"""Checks a schema cannot express: they look across files, at the repository, or for leaked secrets.

Each check returns located diagnostics for the file at fault, so a pull request that breaks a
reference (a run naming a template that was renamed) is pointed at the line that now dangles.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import os
import re
from collections import defaultdict
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

from reconciler.core.diagnostics import Diagnostic
from .models import OVERRIDABLE, ExecutionTemplate, is_dns_label

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
        elif loc and isinstance(loc[-1], str) and SECRET_KEY.search(key) and "secrets" not in loc:
            name = key if re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key) else "NAME"
            found.append((loc, f"'{key}' holds a literal secret; remove the value, list '{name}' under "
                               "spec.secrets and set it on the reconciler host"))
    return found


def cross_checks(root: Path, files: list, locator, given: set[str] | None = None) -> dict[str, list[Diagnostic]]:
    """Every check beyond one file's schema, by repository-relative path.

    The checks read each file's parsed mapping (``SpecFile.data``), not its validated object, so that
    a file the schema refused still gets them: one ``validate`` shows a misspelt key and the template
    that does not exist, not the one and then, once fixed, the other. A value the schema refuses
    (wrong type, bad pattern) is left alone here; its schema error says what is wrong with it.

    ``given``: the files named on the command line. A name or id defined twice is reported against a
    given file rather than against the tree's copy, which would be filtered out of what is shown.
    """
    out: dict[str, list[Diagnostic]] = defaultdict(list)

    def add(f, loc: tuple, message: str) -> None:
        out[f.rel].append(locator.diag(f, loc, message))

    given = given or set()
    checked = [f for f in files if f.data is not None]
    template_files = [f for f in checked if f.kind == "ExecutionTemplate"]
    lookup: dict[str, Any] = {}  # what a run's spec.template finds: an id, else a file stem
    by_id: dict[str, Any] = {}

    def tid(f) -> str | None:
        value = f.data.get("id")
        return value if is_dns_label(value) else None

    def misnamed(f) -> bool:
        return tid(f) not in (None, f.path.stem)

    # When an id is defined twice, the misnamed copy is at fault, and a run naming the id finds the
    # file named after it; but a file given on the command line is reported before the tree's copy.
    for f in sorted(template_files, key=lambda f: (f.rel in given, misnamed(f))):
        t = tid(f)
        if t is None:
            continue
        if misnamed(f):
            add(f, ("id",), f"id '{t}' must equal the file name '{f.path.stem}'")
        if t in by_id:
            add(f, ("id",), f"template id '{t}' is also defined in {by_id[t].rel}")
        by_id.setdefault(t, f)
    for f in sorted(template_files, key=misnamed):
        if tid(f) is not None:
            lookup.setdefault(tid(f), f)
    for f in template_files:
        lookup.setdefault(f.path.stem, f)  # a run naming the file still finds it (and sees it is invalid)
        _check_template(f, add)

    by_name: dict[tuple[str, str], Any] = {}
    for f in sorted((f for f in checked if f.kind in ("Run", "Fleet", "Provider", "Policy")), key=lambda f: f.rel in given):
        name = _at(f.data, "metadata", "name")
        if not is_dns_label(name):
            continue
        if f.path.stem != name:
            add(f, ("metadata", "name"), f"name '{name}' must equal the file name '{f.path.stem}'")
        other = by_name.get((f.kind, name))
        if other is not None:
            add(f, ("metadata", "name"), f"{f.kind} '{name}' is also defined in {other.rel}")
        else:
            by_name[(f.kind, name)] = f

    # A template with a cross-file error (id != file name, id defined twice) is as invalid as one
    # that failed its schema: the runs that use it must not pass.
    invalid_templates = {f.rel for f in template_files if f.diags or out.get(f.rel)}
    providers = {name: f for (kind, name), f in by_name.items() if kind == "Provider"}
    policies = sorted((f for f in checked if f.kind == "Policy"), key=lambda f: f.rel)
    for extra in policies[1:]:
        add(extra, ("kind",), f"a repository has one Policy; {policies[0].rel} is it")
    classes = None
    if policies:
        classes = {c.get("name") for c in _list(_at(policies[0].data, "spec", "priorityClasses")) if isinstance(c, dict)}
    for f in checked:
        if f.kind == "Run":
            _check_run(root, f, lookup, add, invalid_templates, providers)
            prio = _at(f.data, "spec", "priority")
            if isinstance(prio, str) and prio not in (classes or set()):
                known = ", ".join(sorted(c for c in classes or () if isinstance(c, str))) or "none: no Policy defines any"
                add(f, ("spec", "priority"), f"priority class '{prio}' is not defined (known: {known})")

    _check_secret_grants(checked, policies[0] if policies else None, add)

    machines: dict[str, Any] = {}
    for f in sorted((f for f in checked if f.kind == "Fleet"), key=lambda f: f.rel in given):
        spec = _dict(f.data.get("spec"))
        known_hosts = spec.get("known_hosts")
        for i, m in enumerate(_list(spec.get("machines"))):
            if not isinstance(m, dict):
                continue
            name = m.get("name")
            if is_dns_label(name) and name in machines:
                where = machines[name]
                add(f, ("spec", "machines", i, "name"),
                    f"machine '{name}' is already declared " + ("in this fleet" if where is f else f"in {where.rel}"))
            elif is_dns_label(name):
                machines[name] = f
            ssh = m.get("ssh")
            if isinstance(ssh, dict):
                host_key = ssh.get("host_key")
                if isinstance(host_key, str) and host_key:
                    problem = host_key_problem(host_key)
                    if problem:
                        add(f, ("spec", "machines", i, "ssh", "host_key"), problem)
                elif host_key is None or host_key == "":
                    if not known_hosts:
                        add(f, ("spec", "machines", i, "ssh"),
                            "no host key: set ssh.host_key or the fleet's known_hosts (keys are never accepted blindly)")
            types = [g.get("type") for g in _list(_at(m, "resources", "gpus")) if isinstance(g, dict)]
            types = [t for t in types if isinstance(t, str)]
            if len(set(types)) != len(types):
                add(f, ("spec", "machines", i, "resources", "gpus"), "a GPU type is listed twice; add the counts")
    _check_slurm_logins(template_files, machines, add)
    return out


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
    from .models import reserved_secret, secret_refusal

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


def _check_slurm_logins(template_files: list, machines: dict[str, Any], add) -> None:
    """A Slurm template's login host is this machine or a Fleet machine, and one login host has
    one workspace root (the cluster is observed as one machine, under that root)."""
    roots: dict[str, tuple[str, Any]] = {}  # login host → its workspace root, and the file naming it
    for f in sorted(template_files, key=lambda f: f.rel):
        if _at(f.data, "placement", "kind") != "slurm":
            continue
        login = _at(f.data, "placement", "slurm", "login")
        login = login if isinstance(login, str) else "local"
        if login != "local" and login not in machines:
            known = ", ".join(sorted(machines)[:8]) or "no Fleet declares any"
            add(f, ("placement", "slurm", "login"), f"login host '{login}' is not a Fleet machine (known: {known}); "
                                                    "use local for this machine")
        root_dir = _at(f.data, "placement", "slurm", "workspace_root")
        if not isinstance(root_dir, str):
            continue
        first = roots.setdefault(login, (root_dir, f))
        if first[0] != root_dir:
            add(f, ("placement", "slurm", "workspace_root"), f"login host '{login}' has workspace_root "
                f"'{first[0]}' in {first[1].rel}: one cluster, one root")


# ---------------------------------------------------------------- reading raw mappings


def _at(data: Any, *path: str) -> Any:
    """The value at ``path`` in a parsed mapping, or None where a part is missing or not a mapping."""
    for part in path:
        if not isinstance(data, dict):
            return None
        data = data.get(part)
    return data


def _dict(v: Any) -> dict:
    return v if isinstance(v, dict) else {}


def _list(v: Any) -> list:
    return v if isinstance(v, list) else []


def _text(v: Any) -> str | None:
    """A non-empty string, or None (a missing value, or one of another type: the schema reports that)."""
    return v if isinstance(v, str) and v else None


def _count(v: Any, default: int = 0) -> int | None:
    """A GPU count as the schema reads it: an int (not a bool), the default when absent, else None."""
    if v is None:
        return default
    return v if type(v) is int else None


# ---------------------------------------------------------------- templates


def _check_template(f, add) -> None:
    t = f.data
    mode = _at(t, "launch_mode", "kind")
    defaults = _dict(t.get("defaults"))
    allow = [k for k in _list(t.get("allow_overrides")) if isinstance(k, str)]
    image = _text(defaults.get("image"))
    if mode == "docker" and not image and "image" not in allow:
        add(f, ("launch_mode",), "docker launches need defaults.image (or allow_overrides: [image])")
    if mode == "host_process" and image:
        add(f, ("defaults", "image"), "an image only applies to docker launches")
    if _at(t, "placement", "kind") == "local" and _text(defaults.get("target")):
        add(f, ("defaults", "target"), "local placement runs on this machine; target is for ssh placement")
    if len(set(allow)) != len(allow):
        add(f, ("allow_overrides",), "lists a key twice")
    resources = defaults.get("resources")
    if isinstance(resources, dict) and _text(resources.get("gpu_type")) and _count(resources.get("gpu_count")) == 0:
        add(f, ("defaults", "resources", "gpu_type"), "gpu_type is set but gpu_count is 0")
    if isinstance(resources, dict) and type(resources.get("nodes")) is int and resources["nodes"] > 1 \
            and _at(t, "placement", "kind") not in MULTI_NODE_PLACEMENTS:
        add(f, ("defaults", "resources", "nodes"), MULTI_NODE_PLACEMENT)


# ---------------------------------------------------------------- fleets

# Public host key types and the fields of their wire-format blob after the type name (RFC 4253,
# 5656, 8709, and OpenSSH's PROTOCOL.u2f for the security-key types).
HOST_KEY_FIELDS = {
    "ssh-ed25519": ("key",),
    "ecdsa-sha2-nistp256": ("curve", "point"),
    "ecdsa-sha2-nistp384": ("curve", "point"),
    "ecdsa-sha2-nistp521": ("curve", "point"),
    "ssh-rsa": ("e", "n"),
    "sk-ssh-ed25519@openssh.com": ("key", "application"),
    "sk-ecdsa-sha2-nistp256@openssh.com": ("curve", "point", "application"),
}
HOST_KEY_FORMAT = "expected '<key-type> <base64>', as in the host's /etc/ssh/ssh_host_*_key.pub"


def host_key_problem(value: str) -> str | None:
    """Why a pinned ``ssh.host_key`` is not a public key line, or None.

    Checked here rather than at the first connection: a malformed pin would otherwise pass review and
    fail the machine's every launch, and a truncated copy-paste is the usual way to get one wrong.
    A trailing comment (the third field of a .pub line) is allowed: the SSH transport ignores it.
    """
    parts = value.split()
    if not parts:
        return f"is empty; {HOST_KEY_FORMAT}"
    kind = parts[0]
    if kind not in HOST_KEY_FIELDS:
        if len(parts) > 1 and parts[1] in HOST_KEY_FIELDS:
            return (f"starts with '{kind}', a known_hosts host field: keep only '{parts[1]} <base64>' "
                    "(the host comes from ssh.host)")
        return f"unknown key type '{kind[:40]}'; {HOST_KEY_FORMAT} (known types: {', '.join(HOST_KEY_FIELDS)})"
    if len(parts) < 2:
        return f"'{kind}' without its key data; {HOST_KEY_FORMAT}"
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        return f"the key data is not valid base64; {HOST_KEY_FORMAT}"
    fields = _ssh_strings(blob)
    if not fields:
        return f"the key data is not an SSH public key (truncated?); {HOST_KEY_FORMAT}"
    embedded = fields[0].decode("utf-8", "replace")[:40]
    if embedded != kind:
        return f"the key data holds a '{embedded}' key, but the line says '{kind}'"
    want = HOST_KEY_FIELDS[kind]
    body = dict(zip(want, fields[1:]))
    if (len(fields) - 1 != len(want) or ("key" in body and len(body["key"]) != 32)
            or ("curve" in body and kind.removeprefix("sk-").split("@")[0] != f"ecdsa-sha2-{body['curve'].decode('latin-1')}")):
        return f"the '{kind}' key data is truncated or malformed; {HOST_KEY_FORMAT}"
    return None


def _ssh_strings(blob: bytes) -> list[bytes] | None:
    """An SSH wire-format blob as its length-prefixed strings, or None unless they fill it exactly."""
    out, i = [], 0
    while i < len(blob):
        if i + 4 > len(blob):
            return None
        n = int.from_bytes(blob[i:i + 4], "big")
        i += 4
        if i + n > len(blob):
            return None
        out.append(blob[i:i + n])
        i += n
    return out


# ---------------------------------------------------------------- runs


def _check_run(root: Path, f, templates: dict, add, invalid_templates: set[str], providers: dict) -> None:
    spec = f.data.get("spec")
    if not isinstance(spec, dict):
        return
    overrides = _dict(spec.get("overrides"))
    template: ExecutionTemplate | None = None
    name = spec.get("template")
    if isinstance(name, str):
        tf = templates.get(name)
        if tf is None:
            hint = f" (known: {', '.join(sorted(templates)[:8])})" if templates else " (execution_templates/ is empty)"
            add(f, ("spec", "template"), f"template '{name}' not found{hint}")
        elif not tf.ok or tf.rel in invalid_templates:
            add(f, ("spec", "template"), f"template '{name}' is invalid (see {tf.rel})")
        else:
            template = tf.obj
    if template is not None:
        for key in OVERRIDABLE:
            if overrides.get(key) is not None and key not in template.allow_overrides:
                allowed = ", ".join(template.allow_overrides) or "nothing"
                add(f, ("spec", "overrides", key), f"template '{template.id}' does not allow overriding '{key}' (allowed: {allowed})")
        if _text(overrides.get("image")) and template.launch_mode.kind != "docker":
            add(f, ("spec", "overrides", "image"), "an image only applies to docker launches")
    _check_gpus(f, overrides, template, add)
    _check_nodes(f, overrides, template, add)
    if template is not None and template.placement.kind == "rental":
        _check_rental(f, overrides, template, providers, add)
    seen = set()
    for i, item in enumerate(_list(spec.get("inputs"))):
        if not isinstance(item, str):
            continue
        problem = input_problem(root, item)
        if problem:
            add(f, ("spec", "inputs", i), problem)
        elif item in seen:
            add(f, ("spec", "inputs", i), f"input '{item}' is listed twice")
        seen.add(item)
    secrets = [s for s in _list(spec.get("secrets")) if isinstance(s, str)]
    if len(set(secrets)) != len(secrets):
        add(f, ("spec", "secrets"), "a secret is named twice")
    task = spec.get("task")
    if not isinstance(task, dict):
        return
    _check_staged_paths(root, f, spec, task, add)
    _check_swift_args(f, task, add)
    env = task.get("env") if task.get("type") == "command" else None
    for name in secrets:
        if isinstance(env, dict) and name in env:
            add(f, ("spec", "task", "env", name), f"'{name}' is a secret; remove it from env")


MULTI_NODE_PLACEMENTS = ("ssh", "slurm")
MULTI_NODE_PLACEMENT = "a run across several machines (nodes > 1) needs ssh or slurm placement"


def _check_nodes(f, overrides: dict, template: ExecutionTemplate | None, add) -> None:
    res = _dict(overrides.get("resources"))
    nodes = res.get("nodes")
    if template is None or type(nodes) is not int or nodes <= 1 or "resources" not in template.allow_overrides:
        return
    if template.placement.kind not in MULTI_NODE_PLACEMENTS:
        add(f, ("spec", "overrides", "resources", "nodes"), f"{MULTI_NODE_PLACEMENT}; template '{template.id}' "
                                                            f"has {template.placement.kind} placement")


def _check_gpus(f, overrides: dict, template: ExecutionTemplate | None, add) -> None:
    """A GPU type with no GPU, whether the run or its template sets which half.

    The template's own defaults are checked with the template; here the run's override, alone and
    applied to the template's defaults (what ``resolve.effective`` computes and the planner places).
    """
    res = overrides.get("resources")
    if not isinstance(res, dict):
        return
    loc = ("spec", "overrides", "resources")
    gpu_type, gpu_count = res.get("gpu_type"), res.get("gpu_count")
    if not isinstance(gpu_type, (str, type(None))) or not (gpu_count is None or type(gpu_count) is int):
        return  # the schema reports the value
    if gpu_type and gpu_count == 0:
        add(f, loc + ("gpu_type",), "gpu_type is set but gpu_count is 0")
        return
    if template is None or "resources" not in template.allow_overrides:
        return  # no template to apply it to, or the override is refused (and reported) already
    base = template.defaults.resources
    if gpu_type and gpu_count is None and base.gpu_count == 0:
        add(f, loc + ("gpu_type",), f"gpu_type is set but the effective gpu_count is 0 (template '{template.id}' "
                                    "defaults to 0 GPUs): set overrides.resources.gpu_count")
    elif gpu_type is None and gpu_count == 0 and base.gpu_type:
        add(f, loc + ("gpu_count",), f"gpu_count is 0 but template '{template.id}' sets gpu_type "
                                     f"'{base.gpu_type}': a GPU type needs a GPU (override gpu_type too, or use a "
                                     "template without one)")


def _check_rental(f, overrides: dict, template: ExecutionTemplate, providers: dict, add) -> None:
    """A rental run must fit some offer of the providers it may use: caught in the pull request,
    not when the reconciler first tries to rent. Located at the override that asks too much, else
    at the template reference (its defaults do)."""
    from .models import Provider, Run
    from .resolve import effective
    from .offers import fitting_offers

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


def input_problem(root: Path, item: str) -> str | None:
    """Why an input path cannot be staged, or None. Inputs never leave the repository."""
    if not item or item.strip() != item:
        return "input path is empty or has surrounding spaces"
    if "\\" in item or "\x00" in item:
        return f"input '{item}' must use '/' separators"
    p = PurePosixPath(item)
    if p.is_absolute():
        return f"input '{item}' must be relative to the repository, not absolute"
    if ".." in p.parts:
        return f"input '{item}' must not contain '..'"
    if p.parts and p.parts[0] in ("status", ".git", ".reconciler"):
        return f"input '{item}' points into {p.parts[0]}/, which is not user content"
    full = root / item
    if not os.path.lexists(full):
        return f"input '{item}' does not exist in the repository"
    try:
        real = full.resolve(strict=True)
    except (OSError, RuntimeError):
        return f"input '{item}' is a broken or looping symlink"
    real_root = root.resolve()
    if not real.is_relative_to(real_root):
        return f"input '{item}' is a symlink that escapes the repository"
    into = not_user_content(real_root, real)
    if into:  # a committed link must not bring the reconciler's own state into a bundle
        return f"input '{item}' is or goes through a symlink to {into}, which is not user content"
    if real.is_dir():
        return _tree_problem(real_root, real, PurePosixPath(item), item, (real,))
    return None


def _tree_problem(real_root: Path, folder: Path, shown: PurePosixPath, item: str,
                  holding: tuple[Path, ...]) -> str | None:
    """The first link under ``folder`` that staging would refuse, or None. Staging follows links
    into folders (bundle._copy_input), so this walk does too, under the same rules: a link inside
    a linked folder is judged here, in the pull request, not first at launch. ``shown`` is the
    folder as the spec names it; ``holding`` the resolved folders above, to catch loops."""
    for name in sorted(os.listdir(folder)):
        child, where = folder / name, shown / name
        target = child
        if child.is_symlink():
            try:
                target = child.resolve(strict=True)
            except (OSError, RuntimeError):
                return f"input '{item}' contains a broken or looping symlink: {where}"
            if not target.is_relative_to(real_root):
                return f"input '{item}' contains a symlink that escapes the repository: {where}"
            into = not_user_content(real_root, target)
            if into:
                return f"input '{item}' contains a symlink to {into}: {where}"
            if target.is_dir() and (target in holding or holding[0].is_relative_to(target)):
                return f"input '{item}' contains a symlink to a folder that holds it (a loop): {where}"
        if target.is_dir():
            problem = _tree_problem(real_root, target, where, item, holding + (target,))
            if problem:
                return problem
    return None


def not_user_content(real_root: Path, real: Path) -> str | None:
    """What a resolved path inside the repository is when it is not user content (the repository
    itself, which holds .git/ and .reconciler/; .git/, .reconciler/ or status/), else None."""
    parts = real.relative_to(real_root).parts
    if not parts:
        return "the repository's root"
    return f"{parts[0]}/" if parts[0] in ("status", ".git", ".reconciler") else None


def _check_staged_paths(root: Path, f, spec: dict, task: dict, add) -> None:
    """Task values that name staged files (``inputs/...``) must be covered by spec.inputs (or the code pin).

    The entrypoint runs from the bundle's root, where ``inputs/<path>`` holds the repository's
    ``<path>`` for each listed input. A value naming a repository file without the ``inputs/`` prefix
    would be looked up on the execution plane's own disk (or the hub), so it gets a hint too.
    """
    from reconciler.tasks.swift import bundle_paths

    if task.get("type") not in ("swift-sft", "swift-rlhf"):
        return
    inputs = [i for i in _list(spec.get("inputs")) if isinstance(i, str)]
    code = spec.get("code")
    code_dir = _text(code.get("path", "code")) if isinstance(code, dict) else None
    if code_dir is not None:
        for item in inputs:
            if item == code_dir or item.startswith(code_dir + "/") or code_dir.startswith(item + "/"):
                add(f, ("spec", "code", "path"), f"code.path '{code_dir}' overlaps input '{item}' (both go under inputs/)")
    named = bundle_paths(task)
    for loc, value in named:
        rel = value[len("inputs/"):].rstrip("/")
        covering = [i for i in inputs if rel == i.rstrip("/") or rel.startswith(i.rstrip("/") + "/")]
        if code_dir is not None and (rel == code_dir or rel.startswith(code_dir + "/")):
            continue
        if not covering:
            listed = ", ".join(inputs) if inputs else "none"
            add(f, ("spec", "task") + loc, f"'{value}' is not staged: add '{rel}' (or a folder holding it) to "
                                           f"spec.inputs (listed: {listed})")
        elif not os.path.lexists(root / rel):
            add(f, ("spec", "task") + loc, f"'{value}': '{rel}' does not exist in the repository "
                                           f"(input '{covering[0]}' does not hold it)")
    staged = {loc for loc, _ in named}
    for key in ("dataset", "val_dataset"):
        for i, value in enumerate(_list(task.get(key))):
            if not isinstance(value, str):
                continue
            path = value.split("#", 1)[0]
            if (key, i) in staged or not path or path.startswith("/"):
                continue
            if input_problem(root, path) is None and (root / path).is_file():
                hint = (f"inputs/{path}" if any(path == x or path.startswith(x.rstrip("/") + "/") for x in inputs)
                        else f"inputs/{path} and list '{path}' in spec.inputs")
                add(f, ("spec", "task", key, i), f"'{value}' is a repository file; the run sees staged files under "
                                                 f"inputs/: use {hint}")


def _check_swift_args(f, task: dict, add) -> None:
    """Every ``args`` key must be an argument of the ms-swift command the task runs.

    ms-swift refuses an unknown argument only once the run has started on a machine (and a typo in a
    rarely read one, say ``lora_dropuot``, may pass unnoticed), so the names are checked here,
    against the list in ``reconciler/tasks/swift_args.json`` (regenerated from ms-swift itself by
    ``scripts/swift_args.py``). Keys the model refuses for another reason (managed, typed,
    renamed) keep that error alone.
    """
    from reconciler.tasks.swift import COMMANDS, swift_arguments
    from .models import SWIFT_MANAGED, SwiftRlhfTask, SwiftSftTask

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

"""JSON Schemas generated from the models, so editors and CI check specs against the same truth.

Schemas are never edited by hand: ``reconcile schema`` writes them and ``reconcile schema --check``
fails when the committed files drifted from the models. Four files:

- ``reconciler.schema.json``: every kind in one schema, chosen by ``kind`` (``if``/``then``), so a
  single editor mapping covers ``specs/**`` and ``execution_templates/**`` (docs/specs.md);
- ``run.schema.json``, ``execution-template.schema.json``, ``fleet.schema.json``: one kind each.

Pydantic writes the fields (with their descriptions, bounds and the schema-only patterns the models
declare); this module adds what pydantic cannot say, each a rule the code also checks with a
located message of its own (``spec/checks/``, the models' validators):

- the task union as ``if``/``then`` on ``type``, so an editor validates a task against the branch
  its ``type`` names (pydantic's ``oneOf`` makes yaml-language-server guess the closest branch
  and report, say, "Value must be 'command'" for a misspelt field of a swift task);
- environment maps: names by ``propertyNames`` (a key pattern in ``patternProperties`` refuses
  nothing), and no literal value under a key that names a secret (``checks.secrets.SECRET_KEY``);
- values that look like credentials (``checks.secrets.CREDENTIAL``) in free-form strings;
- ``ssh.host_key``: ``<key-type> <base64>`` of a known type, the base64 starting with the encoding
  of that same type (``checks.fleets.HOST_KEY_FIELDS``);
- ms-swift ``args``: the argument names of the command (``reconciler/tasks/swift_args.json``, so
  an editor completes them), and values nested at most as deep as ``_is_plain`` allows;
- ms-swift's typed fields: what its parser accepts (``"10"`` for an int), ``schema_typed.py``;
- rules across the fields of one file: a docker template needs an image, a GPU type needs GPUs,
  a machine needs a host key unless its fleet names a known_hosts...

What needs more than one file (does the template exist, is the name unique, does the input exist)
stays in ``spec/checks/`` only.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from pathlib import Path
from typing import Any

from pydantic.json_schema import models_json_schema

from .checks import fleets, secrets
from .models import KINDS
from .models.common import ENV_NAME, ENV_NAME_MESSAGE
from .models.tasks import PLAIN_DEPTH, SWIFT_MANAGED, TASK_TYPES, SwiftRlhfTask, SwiftSftTask
from .schema_typed import NEEDS_DATA, typed_fields

FILE_NAMES = {"Run": "run", "ExecutionTemplate": "execution-template", "Fleet": "fleet", "Provider": "provider",
              "Policy": "policy", "Storage": "storage"}
COMBINED = "reconciler.schema.json"
SCHEMA_BASE = "https://reconciler.dev/schemas/v1/"
DRAFT = "https://json-schema.org/draft/2020-12/schema"
REF = "#/$defs/"

SECRET_MESSAGE = ("this key names a secret: never commit its value; list the name under spec.secrets and set it "
                  "on the reconciler host")
CREDENTIAL_MESSAGE = ("this value looks like a credential; never commit one: list its name under spec.secrets and "
                      "set it on the reconciler host")
HOST_KEY_MESSAGE = ("expected '<key-type> <base64>', as in the host's /etc/ssh/ssh_host_*_key.pub, of a known type "
                    f"({', '.join(fleets.HOST_KEY_FIELDS)}), the key data holding a key of that same type")
NO_HOST_KEY_MESSAGE = ("no host key: set ssh.host_key or the fleet's known_hosts (keys are never accepted "
                       "blindly)")


# ---------------------------------------------------------------- patterns


def _ignore_case(pattern: str) -> str:
    """``pattern`` matching letters in any case, without flags (JSON Schema patterns have none)."""
    return re.sub(r"(?<!\\)[A-Za-z]", lambda m: f"[{m.group().upper()}{m.group().lower()}]", pattern)


# Keys whose string value is a literal secret (checks.secrets.SECRET_KEY, which is case-insensitive).
SECRET_KEY = _ignore_case(secrets.SECRET_KEY.pattern)
# A string that does not start like a credential (checks.secrets.CREDENTIAL, matched after stripping spaces).
NOT_CREDENTIAL = r"^(?!\s*" + secrets.CREDENTIAL.pattern.removeprefix("^") + ")"
_B64 = "[A-Za-z0-9+/]"


def _escape(text: str) -> str:
    """``re.escape`` for ECMA-262 patterns in unicode mode, which refuse escapes like ``\\-``."""
    return re.sub(r"([.+*?^$()\[\]{}|\\/])", r"\\\1", text)


def _ssh_string(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


def _key_data(kind: str) -> str:
    """A pattern for the base64 of a ``kind`` public key blob: the encoding of its known head (the
    type name, and for ECDSA the curve and the point's length and form), then the rest; an
    ssh-ed25519 key has a fixed length, so it is matched exactly (a truncated paste fails)."""
    fields = fleets.HOST_KEY_FIELDS[kind]
    head = _ssh_string(kind.encode())
    if fields[0] == "curve":
        curve = kind.removeprefix("sk-").split("@")[0].removeprefix("ecdsa-sha2-").encode()
        point = {b"nistp256": 65, b"nistp384": 97, b"nistp521": 133}[curve]
        head += _ssh_string(curve) + point.to_bytes(4, "big") + b"\x04"
    elif fields[0] == "key":
        head += (32).to_bytes(4, "big")
    whole = len(head) // 3 * 3
    literal = _escape(base64.b64encode(head[:whole]).decode())
    if fields == ("key",):  # ssh-ed25519: exactly the type and a 32-byte key
        size = len(head) + 32
        pad = -size % 3
        return literal + _B64 + "{%d}" % ((size + pad) // 3 * 4 - len(literal) - pad) + "=" * pad
    return literal + f"(?:{_B64}{{4}})*(?:{_B64}{{2}}==|{_B64}{{3}}=|{_B64}{{4}})"


# '' means "no pinned key" (the fleet's known_hosts is used), as in checks.cross_checks.
HOST_KEY = ("^$|^\\s*(?:" + "|".join(f"{_escape(k)}\\s+{_key_data(k)}" for k in fleets.HOST_KEY_FIELDS)
            + ")(?:\\s[\\s\\S]*)?$")


# ---------------------------------------------------------------- building blocks


def _string(**extra: Any) -> dict:
    return {"type": "string", **extra}


def _plain_string() -> dict:
    return _string(pattern=NOT_CREDENTIAL, patternErrorMessage=CREDENTIAL_MESSAGE)


def _secret_value(base: dict | None = None) -> dict:
    """The value under a key that names a secret: nothing but an empty string."""
    return {**(base or {"type": "string"}), "pattern": "^$", "patternErrorMessage": SECRET_MESSAGE}


def _string_map(schema: dict, names: dict | None = None) -> None:
    """A free-form map of strings: no literal secret, no credential-looking value, keys as ``names``."""
    schema.pop("patternProperties", None)
    if names:
        schema["propertyNames"] = names
    schema["patternProperties"] = {SECRET_KEY: _secret_value()}
    schema["additionalProperties"] = _plain_string()


def _if_then(condition: dict, then: dict) -> dict:
    return {"if": condition, "then": then}


def _tagged(key: str, value: str) -> dict:
    """A condition: a mapping whose ``key`` is ``value`` (a scalar or a list matches no branch)."""
    return {"type": "object", "properties": {key: {"const": value}}, "required": [key]}


def _all_of(schema: dict, *rules: dict) -> None:
    schema.setdefault("allOf", []).extend(rules)


def _at(schema: dict, *path: str) -> dict:
    """``{"properties": {a: {"properties": {b: ...}}}}`` for path (a, b), with ``schema`` innermost."""
    for part in reversed(path):
        schema = {"properties": {part: schema}}
    return schema


def _set_string(*path: str) -> dict:
    """A condition: the key at ``path`` holds a non-empty string (as checks.raw._text reads it)."""
    inner = _string(minLength=1)
    for part in reversed(path):
        inner = {"properties": {part: inner}, "required": [part]}
    return inner


def _unset(message: str) -> dict:
    """A value that must be unset: null or an empty string, else ``message``."""
    return {"pattern": "^$", "type": ["string", "null"], "errorMessage": message}


# ---------------------------------------------------------------- the rules, by definition name


def _walk(node: Any):
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def _env_maps(defs: dict) -> None:
    """Every ``dict[EnvName, str]`` the models declare: names by propertyNames, no secret values."""
    names = {"pattern": ENV_NAME, "patternErrorMessage": ENV_NAME_MESSAGE}
    for node in _walk(defs):
        if node.get("patternProperties") == {ENV_NAME: {"type": "string"}}:
            _string_map(node, names)


def _task_union(defs: dict) -> None:
    """The task: ``type`` picks the branch (``if``/``then``), instead of pydantic's ``oneOf``."""
    task = defs["RunSpec"]["properties"]["task"]
    description = task["description"]
    task.clear()
    task.update({
        "title": "Task",
        "description": description,
        "type": "object",
        "required": ["type"],
        "properties": {"type": {"enum": list(TASK_TYPES), "description": "Task type; picks the task's fields: "
                                "command, swift-sft or swift-rlhf."}},
        "allOf": [_if_then(_tagged("type", name), {"$ref": REF + model.__name__})
                  for name, model in TASK_TYPES.items()],
    })
    defs["CommandTask"]["properties"]["argv"]["items"] = _plain_string()


def _swift(defs: dict) -> None:
    from reconciler.tasks.swift import COMMANDS, swift_arguments, swift_arguments_version

    # Args values: scalars, lists and maps, nested at most PLAIN_DEPTH deep (models._is_plain).
    scalar = ["string", "number", "boolean", "null"]
    for depth in range(PLAIN_DEPTH + 1):
        value: dict = {"type": scalar + ["array", "object"], "pattern": NOT_CREDENTIAL,
                       "patternErrorMessage": CREDENTIAL_MESSAGE}
        if depth < PLAIN_DEPTH:
            value["items"] = value["additionalProperties"] = {"$ref": f"{REF}SwiftArgValue{depth + 1}"}
        else:
            value.update(maxItems=0, additionalProperties=False,
                         errorMessage="nested too deep: args values are scalars, lists or maps of them")
        defs[f"SwiftArgValue{depth or ''}"] = value

    for name, model in (("SwiftSftTask", SwiftSftTask), ("SwiftRlhfTask", SwiftRlhfTask)):
        command = COMMANDS[model.model_fields["type"].annotation.__args__[0]]
        own = set(model.model_fields) | set(SWIFT_MANAGED) | {"train_type"}
        known = sorted(swift_arguments(command) - own)
        task = defs[name]
        args = task["properties"]["args"]
        args["propertyNames"] = {
            "enum": known,
            "errorMessage": f"not an argument args may pass to ms-swift's 'swift {command}' (ms-swift "
                            f"{swift_arguments_version()}): typed fields are set outside args, "
                            f"{', '.join(SWIFT_MANAGED)} are the reconciler's, train_type is now tuner_type",
        }
        args["patternProperties"] = {SECRET_KEY: _secret_value({"$ref": REF + "SwiftArgValue"})}
        args["additionalProperties"] = {"$ref": REF + "SwiftArgValue"}
        typed_fields(defs, task, command, model)
        _all_of(task, NEEDS_DATA)
        task["properties"]["train_type"] = {
            "description": "Renamed tuner_type in ms-swift 4.", "not": {}, "doNotSuggest": True,
            "deprecationMessage": "'train_type' was renamed to 'tuner_type' in ms-swift 4; use tuner_type",
        }


_GPU_TYPE_NEEDS_GPUS = {"properties": {"gpu_type": {"pattern": "^$", "patternErrorMessage": "gpu_type is set but "
                                                                                              "gpu_count is 0"}}}


def _resources(defs: dict) -> None:
    """The template's defaults: an absent gpu_count is 0."""
    _all_of(defs["Resources"], _if_then({"properties": {"gpu_count": {"const": 0}}}, _GPU_TYPE_NEEDS_GPUS))


def _resources_override(defs: dict) -> None:
    """An override: only a gpu_count it sets (else the template's applies: checks.runs looks at both)."""
    _all_of(defs["ResourcesOverride"],
            _if_then({"properties": {"gpu_count": {"const": 0}}, "required": ["gpu_count"]}, _GPU_TYPE_NEEDS_GPUS))


def _template(defs: dict) -> None:
    t = defs["ExecutionTemplate"]
    docker = {"properties": {"launch_mode": {"properties": {"kind": {"const": "docker"}}, "required": ["kind"]}},
              "required": ["launch_mode"]}
    host = {"properties": {"launch_mode": {"properties": {"kind": {"const": "host_process"}}, "required": ["kind"]}},
            "required": ["launch_mode"]}
    local = {"properties": {"placement": {"properties": {"kind": {"const": "local"}}, "required": ["kind"]}},
             "required": ["placement"]}
    slurm = {"properties": {"placement": {"properties": {"kind": {"const": "slurm"}}, "required": ["kind"]}},
             "required": ["placement"]}
    no_image = {"properties": {"allow_overrides": {"not": {"contains": {"const": "image"}}},
                               "defaults": {"not": _set_string("image")}}}
    _all_of(
        t,
        _if_then({"allOf": [docker, no_image]},
                 _at({"const": "host_process", "errorMessage": "docker launches need defaults.image (or "
                                                               "allow_overrides: [image])"},
                     "launch_mode", "kind")),
        _if_then(host, _at(_unset("an image only applies to docker launches"), "defaults", "image")),
        _if_then(local, _at(_unset("local placement runs on this machine; target is for ssh placement"),
                            "defaults", "target")),
        _if_then(slurm, {"allOf": [
            _at({"const": "host_process", "errorMessage": "slurm placement runs jobs as host processes "
                                                          "(launch_mode.kind: host_process)"}, "launch_mode", "kind"),
            {"properties": {"placement": {"required": ["slurm"]}}}]}),
        _if_then({"not": slurm}, _at({"type": "null", "errorMessage": "placement.slurm is for slurm placement"},
                                             "placement", "slurm")),
    )


def _metadata(defs: dict) -> None:
    _string_map(defs["Metadata"]["properties"]["labels"])
    _string_map(defs["Metadata"]["properties"]["annotations"])


def _fleet(defs: dict) -> None:
    defs["SshEndpoint"]["properties"]["host_key"].update(pattern=HOST_KEY, patternErrorMessage=HOST_KEY_MESSAGE)
    _string_map(defs["Machine"]["properties"]["labels"])
    _all_of(defs["FleetSpec"], _if_then(
        {"not": _set_string("known_hosts")},
        _at({"items": {"properties": {"ssh": {
            "required": ["host_key"], "errorMessage": NO_HOST_KEY_MESSAGE,
            "properties": {"host_key": {"type": "string", "minLength": 1, "errorMessage": NO_HOST_KEY_MESSAGE}},
        }}}}, "machines"),
    ))


# Each rule, and the definitions it needs; a kind's own schema holds only the definitions it uses.
RULES = ((_env_maps, ()), (_task_union, ("RunSpec",)), (_swift, ("SwiftSftTask", "SwiftRlhfTask")),
         (_resources, ("Resources",)), (_resources_override, ("ResourcesOverride",)),
         (_template, ("ExecutionTemplate",)), (_metadata, ("Metadata",)), (_fleet, ("FleetSpec",)))


def _storage(defs: dict) -> None:
    """Options rclone treats as secret are refused by name, as the model's validator does."""
    from .models.storage import OPTION, OPTION_MESSAGE, SECRET_OPTIONS

    props = defs["StorageSpec"]["properties"]
    for key in ("options", "credentials"):
        props[key]["propertyNames"] = {"pattern": OPTION, "patternErrorMessage": OPTION_MESSAGE}
    props["options"]["propertyNames"]["not"] = {"enum": sorted(SECRET_OPTIONS)}


RULES += ((_storage, ("StorageSpec",)),)


def _refine(defs: dict) -> None:
    for rule, needs in RULES:
        if all(name in defs for name in needs):
            rule(defs)


# ---------------------------------------------------------------- the files


def _kind_schema(kind: str) -> dict:
    schema = copy.deepcopy(KINDS[kind].model_json_schema(mode="validation"))
    defs = schema.setdefault("$defs", {})
    defs[kind] = {k: schema.pop(k) for k in list(schema) if k != "$defs"}
    _refine(defs)
    top = defs.pop(kind)
    return {"$schema": DRAFT, "$id": SCHEMA_BASE + f"{FILE_NAMES[kind]}.schema.json", **top, "$defs": defs}


def _combined_schema() -> dict:
    _, doc = models_json_schema([(model, "validation") for model in KINDS.values()])
    defs = doc["$defs"]
    _refine(defs)
    kinds = list(KINDS)
    return {
        "$schema": DRAFT,
        "$id": SCHEMA_BASE + COMBINED,
        "title": "Run, ExecutionTemplate, Fleet, Provider, Policy or Storage",
        "description": "Any object of the reconciler's spec language, chosen by its kind: a Run, an "
                       "ExecutionTemplate, a Fleet, a Provider, a Policy or a Storage. One schema for specs/** and "
                       "execution_templates/**.",
        "type": "object",
        "required": ["apiVersion", "kind"],
        "properties": {
            "apiVersion": {"const": "reconciler/v1", "description": "Version of the spec language."},
            "kind": {"enum": kinds, "description": "What this file describes: Run (a training run), "
                                                   "ExecutionTemplate (how and where runs execute), Fleet "
                                                   "(registered machines), Provider (rented machines) or "
                                                   "Policy (priorities and quotas) or Storage (object "
                                                   "storage for outputs)."},
        },
        "allOf": [_if_then(_tagged("kind", kind), {"$ref": REF + kind})
                  for kind in kinds],
        "$defs": defs,
    }


def _text(schema: dict) -> str:
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def generate() -> dict[str, str]:
    """File name → schema text (stable: sorted keys, trailing newline)."""
    out = {f"{FILE_NAMES[kind]}.schema.json": _text(_kind_schema(kind)) for kind in KINDS}
    out[COMBINED] = _text(_combined_schema())
    return out


def _stale(directory: Path) -> dict[str, str]:
    """File name → schema text, for the files that are missing or differ from what the models generate."""
    return {name: text for name, text in generate().items()
            if not (path := directory / name).exists() or path.read_text(encoding="utf-8") != text}


def write(directory: Path) -> list[str]:
    directory.mkdir(parents=True, exist_ok=True)
    stale = _stale(directory)
    for name, text in stale.items():
        tmp = (directory / name).with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(directory / name)
    return list(stale)


def drift(directory: Path) -> list[str]:
    """Names of schema files that are missing or differ from what the models generate."""
    return list(_stale(directory))

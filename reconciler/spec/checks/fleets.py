"""Fleets: machine names unique across fleets, every machine's host key pinned or known, GPU types
listed once, and the pinned host keys well formed."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from ..models.common import is_dns_label
from .raw import _at, _dict, _list


def check_machines(checked: list, given: set[str], add) -> dict[str, Any]:
    """Reports the fleets' machines; returns the file that declares each machine name."""
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
    return machines


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

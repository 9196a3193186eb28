"""The SSH transport's file half: staging bundles, writing secrets files, fetching workspaces.

Each transfer is one command on the connection (``SshTransport._exec``) with the data on stdin or
stdout: a bundle's archive into ``tar``, a secrets file into a ``umask 077`` shell, a workspace's
``runtime/`` and ``artifacts/`` out of ``tar`` and unpacked locally by ``safetar``, never by
tarfile's extraction. Apart from the connection code so each reads on its own.
"""

from __future__ import annotations

import posixpath
import shlex
import tempfile
from pathlib import Path

from reconciler.artifacts import bundle as bundles
from reconciler.artifacts import safetar
from reconciler.core.errors import PermanentError, TemporaryError
from .base import CHECKPOINT_EXCLUDE, WRONG_SPEC, built_for_check, only_runtime_and_artifacts
from .base import without_checkpoints as skip_checkpoints


class SshFiles:
    """The transfers of ``SshTransport``, which provides ``_exec``, ``workspace``, ``where`` and
    ``command_timeout``."""

    def fetch_folder(self, identity: str, rel: str, dest: Path, sink_wrapper=None,
                     limits: safetar.Limits = safetar.Limits()) -> safetar.Result:
        """One folder of the workspace (``rel``, e.g. a checkpoint) as a tar stream into ``dest``.
        ``sink_wrapper`` may wrap the spool file (a bandwidth limit). Only ``rel`` and what is under
        it is taken, as plain files and folders (safetar)."""
        parts = safetar.plain_parts(rel)
        if isinstance(parts, str):
            raise PermanentError(f"refusing to copy {safetar.printable(rel)!r} of {identity}: {parts}")
        ws = self.workspace(identity)
        script = f"cd {shlex.quote(ws)} || exit 97\n{_tar_create(shlex.quote('/'.join(parts)))}"
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)

        def keep(member: tuple[str, ...]) -> str | None:
            return None if member[:len(parts)] == parts else f"outside {'/'.join(parts)}/"

        rc, err, res = self._untar(script, dest, dest, max(self.command_timeout, 3600.0), keep, sink_wrapper, limits)
        if res is None:
            raise TemporaryError(f"copying {rel} of {identity} from {self.where} failed (exit {rc}): {err}")
        return res

    def _untar(self, script: str, spool_dir: Path, dest: Path, timeout: float, keep, sink_wrapper=None,
               limits: safetar.Limits = safetar.Limits()) -> tuple[int, str, safetar.Result | None]:
        """Run ``script`` (a tar on stdout), spool its output to disk (at most what a stream within
        ``limits`` can be), and unpack the members that ``keep`` lets through into ``dest`` with
        safetar, never with tarfile's extraction. Returns (exit code, stderr, result); the result is
        None when the command failed (nothing is unpacked then, except for an exit 1 whose stream
        turns out to be cut short: what came of it are plain files, replaced by the next fetch).

        GNU tar exits 1 when a file changed while it was read (a log still being written): the
        stream is whole all the same, so exit 1 counts when the stream ends with its end marker."""
        with tempfile.TemporaryFile(dir=spool_dir) as spool:
            sink = _BoundedSink(sink_wrapper(spool) if sink_wrapper is not None else spool, limits.spool_bytes())
            try:
                rc, _, err = self._exec("sh -c " + shlex.quote(script), None, timeout, sink=sink)
            except _SpoolFull:
                rc, err = 0, b""  # the channel is closed; what came is unpacked, as far as it goes
            message = err.decode("utf-8", "replace").strip()[:300]
            if rc not in (0, 1):
                return rc, message, None
            spool.seek(0)
            res = safetar.unpack(spool, dest, keep=keep, limits=limits)
            if sink.full:
                res.truncated = True
                res.error = ""  # cut at the limit on purpose, not damaged
            elif rc == 1 and not res.complete:
                return rc, message, None
        return rc, message, res

    def stage(self, bundle: Path, identity: str, spec_digest: str = "") -> str:
        """Unpack the bundle as the identity's workspace, atomically. A workspace already there is
        kept only if it was built for the same spec; one built for another is refused (exit 96)."""
        ws = self.workspace(identity)
        q = shlex.quote(ws)
        tmp = shlex.quote(posixpath.join(posixpath.dirname(ws), f".{identity}.staging"))
        script = (
            f"if [ -f {q}/job.json ]; then cd {q} && {{\n{built_for_check(spec_digest)}}} && echo kept; exit $?; fi\n"
            f"mkdir -p {shlex.quote(posixpath.dirname(ws))} || exit 3\n"
            f"rm -rf {tmp} {q} && mkdir -p {tmp} && tar -xzf - -C {tmp} && mkdir -p {tmp}/runtime {tmp}/artifacts "
            f"&& mv {tmp} {q} && echo staged\n"
        )
        data = bundles.archive(Path(bundle))
        rc, out, err = self._exec("sh -c " + shlex.quote(script), data, self.command_timeout)
        if rc == WRONG_SPEC:
            raise TemporaryError(f"{identity} on {self.where} was built for another spec; not reusing it")
        if rc != 0:
            raise TemporaryError(f"staging {identity} on {self.where} failed (exit {rc}): "
                                 f"{err.decode('utf-8', 'replace').strip()[:300]}")
        return ws

    def put_secret_file(self, workspace: str, content: bytes, name: str = "secrets.env") -> None:
        rt = shlex.quote(posixpath.join(workspace, "runtime"))
        tmp, dst = shlex.quote(f".{name}.tmp"), shlex.quote(name)
        script = f"umask 077 && mkdir -p {rt} && cat > {rt}/{tmp} && mv {rt}/{tmp} {rt}/{dst}"
        rc, _, err = self._exec("sh -c " + shlex.quote(script), content, self.command_timeout)
        if rc != 0:  # the error comes from mkdir/cat/mv and never contains the content
            raise TemporaryError(f"writing the secrets file on {self.where} failed (exit {rc}): "
                                 f"{err.decode('utf-8', 'replace').strip()[:200]}")

    def fetch(self, identity: str, dest: Path, limits: safetar.Limits = safetar.Limits(),
              without_checkpoints: bool = False) -> safetar.Result:
        """runtime/ and artifacts/ of the workspace, as one tar over one command, into ``dest``:
        plain files and folders only (safetar); what was left out is in the result."""
        ws = shlex.quote(self.workspace(identity))
        script = (f"cd {ws} || exit 97\nmkdir -p runtime artifacts\n"
                  + _tar_create("--exclude=runtime/secrets.env --exclude=runtime/.secrets.env.tmp "
                                "--exclude=runtime/storage.env --exclude=runtime/.storage.env.tmp "
                                + (CHECKPOINT_EXCLUDE + " " if without_checkpoints else "") + "runtime artifacts"))
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        rc, err, res = self._untar(script, dest.parent, dest, max(self.command_timeout, 600.0),
                                   skip_checkpoints if without_checkpoints else only_runtime_and_artifacts,
                                   limits=limits)
        if rc == 97:
            raise TemporaryError(f"workspace of {identity} is gone from {self.where}")
        if res is None:
            raise TemporaryError(f"fetching {identity} from {self.where} failed (exit {rc}): {err}")
        return res


class _SpoolFull(Exception):
    """The machine sent more than a transfer within the limits can be: the command is cut off."""


class _BoundedSink:
    """A spool file wrapper that takes at most ``limit`` bytes, then ends the transfer (a machine
    cannot fill the reconciler host's disk by answering with an endless stream)."""

    def __init__(self, f, limit: int):
        self.f, self.limit, self.n, self.full = f, limit, 0, False

    def write(self, data: bytes) -> None:
        room = self.limit - self.n
        if len(data) > room:
            self.f.write(data[:room])
            self.n, self.full = self.limit, True
            raise _SpoolFull()
        self.f.write(data)
        self.n += len(data)


def _tar_create(args: str) -> str:
    """The shell lines that write a tar of ``args`` (already quoted) to stdout. GNU tar is told to
    go on past files it cannot read (a job's chmod 000 file must not hold a collection back); its
    FIFOs, sockets and links are sent or left out by tar and skipped here in any case."""
    return (f"if tar --version 2>/dev/null | grep -q 'GNU tar'; then exec tar -cf - --ignore-failed-read {args}; fi\n"
            f"exec tar -cf - {args}")

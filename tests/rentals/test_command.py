"""The command adapter with the example executables of examples/providers/command_provider.py:
the contract (JSON on stdin and stdout, exit 75 for "later") end to end, on real sshd rentals."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from reconciler.core.errors import PermanentError, TemporaryError
from reconciler.rentals.providers.base import AdapterContext
from reconciler.rentals.providers.command import CommandAdapter
from reconciler.spec.models.provider import Provider
from tests.rentals.conftest import RENTAL_TEMPLATES
from tests.world import TEMPLATES, World, run_spec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "providers" / "command_provider.py"


def provider(argv: list[str], **command) -> dict:
    return {"apiVersion": "reconciler/v1", "kind": "Provider", "metadata": {"name": "acme"},
            "spec": {"type": "command", "offers": [{"id": "small", "cpu_count": 1, "price_per_hour": 0.5}],
                     "command": {"provision": argv + ["provision"], "inventory": argv + ["list"],
                                 "terminate": argv + ["terminate"], **command}}}


def test_a_run_on_a_command_provider(tmp_path) -> None:
    key = tmp_path / "id_acme"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    TEMPLATES.update(RENTAL_TEMPLATES)
    w = World(tmp_path / "w")
    # The executables see only the base environment, their credential and these settings.
    doc = provider([sys.executable, str(EXAMPLE)], env={"COMMAND_PROVIDER_STATE": str(tmp_path / "acme-state"),
                                                        "COMMAND_PROVIDER_IDENTITY_FILE": str(key)})
    doc["spec"]["ssh"] = {"identity_file": str(key)}
    (w.repo / "specs" / "providers").mkdir()
    (w.repo / "specs" / "providers" / "acme.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    w.commit("acme")
    try:
        w.add_run(run_spec("c1", "rental-host", ["sh", "-c", "echo via-command"]))
        st = w.until("c1", lambda s: s.phase == "Succeeded")
        assert st.handle.machine.startswith("acme/lr-") and st.cost["price_per_hour"] == 0.5
        a = CommandAdapter(Provider.model_validate(doc), AdapterContext(repo=w.repo))
        w.until("c1", lambda s: a.inventory() == [])
    finally:
        w.cleanup()
        a = CommandAdapter(Provider.model_validate(doc), AdapterContext(repo=w.repo))
        for r in a.inventory():
            a.terminate(r.id)


def test_exit_75_is_temporary_and_other_failures_are_permanent_with_stderr(tmp_path) -> None:
    script = tmp_path / "p.sh"
    script.write_text("#!/bin/sh\ncase $1 in\n  list) echo 'quota service down' >&2; exit 75;;\n"
                      "  provision) echo 'no such offer' >&2; exit 3;;\n  terminate) exit 0;;\nesac\n")
    script.chmod(0o755)
    a = CommandAdapter(Provider.model_validate(provider([str(script)])), AdapterContext(repo=tmp_path))
    with pytest.raises(TemporaryError, match="quota service down"):
        a.inventory()
    with pytest.raises(PermanentError, match="no such offer"):
        a.provision("rc-x--r-g1-a1-x1", a.offers()[0])
    a.terminate("gone")  # a rental already gone: success
    missing = CommandAdapter(Provider.model_validate(provider([str(tmp_path / "nope")])), AdapterContext(repo=tmp_path))
    with pytest.raises(PermanentError, match="not found"):
        missing.inventory()

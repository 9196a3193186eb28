"""A World with rental templates and a local Provider whose rentals are real sshd servers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from reconciler.rentals.providers.local import LocalAdapter
from reconciler.spec.models.provider import Provider
from tests.world import TEMPLATES, World

RENTAL_TEMPLATES = {
    "rental-host": {"placement": {"kind": "rental"}, "launch_mode": {"kind": "host_process"},
                    "allow_overrides": ["target", "resources", "runtime_env"]},
    "rental-docker": {"placement": {"kind": "rental"}, "launch_mode": {"kind": "docker", "network": "none"},
                      "defaults": {"image": "reconciler-test/busybox:latest"},
                      "allow_overrides": ["target", "resources", "runtime_env", "image"]},
}


def provider_doc(state: Path, name: str = "local", offers: list[dict] | None = None, **spec: Any) -> dict:
    local = dict(spec.pop("local", {}))
    local.setdefault("stateDir", str(state))
    body = {"type": "local", "offers": offers or [{"id": "cpu-small", "cpu_count": 2, "memory_gb": 4,
                                                  "price_per_hour": 0.1}],
            "local": local, **spec}
    return {"apiVersion": "reconciler/v1", "kind": "Provider", "metadata": {"name": name}, "spec": body}


class RentalWorld(World):
    def __init__(self, base: Path, provider: dict, **flags: Any):
        TEMPLATES.update(RENTAL_TEMPLATES)
        super().__init__(base, **flags)
        self.state = Path(provider["spec"]["local"]["stateDir"])
        self.set_provider(provider)

    def set_provider(self, doc: dict) -> None:
        d = self.repo / "specs" / "providers"
        d.mkdir(exist_ok=True)
        (d / f"{doc['metadata']['name']}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        self.commit("provider")
        self.provider_doc = doc

    def adapter(self) -> LocalAdapter:
        return LocalAdapter(Provider.model_validate(self.provider_doc), None)

    def rentals(self):
        return [r for r in self.adapter().inventory() if r.state != "terminated"]

    def cleanup(self) -> None:
        super().cleanup()
        a = self.adapter()
        for r in a.inventory():
            a.terminate(r.id)


@pytest.fixture
def rental_world(tmp_path):
    worlds = []

    def make(**spec: Any) -> RentalWorld:
        flags = spec.pop("flags", {})
        w = RentalWorld(tmp_path / f"w{len(worlds)}", provider_doc(tmp_path / f"provider{len(worlds)}", **spec),
                        **flags)
        worlds.append(w)
        return w

    yield make
    for w in worlds:
        w.cleanup()

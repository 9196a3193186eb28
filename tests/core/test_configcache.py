"""The configuration reused by a fresh process: only for exactly the inputs it was validated
under (file bytes, each setting's variable, flags), never holding a secret."""

from __future__ import annotations

from reconciler.core import config as configs
from reconciler.core import configcache


def _validated(repo, flags=None) -> configcache.Inputs:
    cfg = configs.load(str(repo), flags=flags)
    inputs = configcache.Inputs(repo.resolve(), None, flags)
    configcache.save(inputs, cfg.model_dump(mode="json"))
    return inputs


def test_the_same_inputs_get_the_values_and_any_other_gets_none(tmp_path, monkeypatch):
    monkeypatch.delenv("RECONCILER_PARALLEL_MACHINES", raising=False)
    monkeypatch.setenv("RECONCILER_WEBHOOK_SECRET", "s3cret-value")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "reconciler.yaml").write_text("workspace_root: /tmp/ws\nnamespace: cc\nlocal_gpus: 0\n")
    inputs = _validated(repo)
    got = configcache.cached(configcache.Inputs(repo.resolve(), None, None))
    cfg = configs.load(str(repo))
    assert got is not None and got.repo == cfg.repo and got.local_root == cfg.local_root
    assert (got.workspace_root, got.namespace, got.commit, got.ledger) == ("/tmp/ws", "cc", True, True)
    saved = (repo / ".reconciler" / configcache.NAME).read_text()
    assert "s3cret" not in saved and "webhook_secret" not in saved

    assert configcache.cached(configcache.Inputs(repo.resolve(), None, {"commit": False})) is None  # a flag
    monkeypatch.setenv("RECONCILER_PARALLEL_MACHINES", "4")  # a setting's variable
    assert configcache.cached(configcache.Inputs(repo.resolve(), None, None)) is None
    monkeypatch.delenv("RECONCILER_PARALLEL_MACHINES")
    monkeypatch.setenv("RECONCILER_WEBHOOK_SECRET", "another")  # not a pass's: neither kept nor keyed
    assert configcache.cached(inputs) is not None
    (repo / "reconciler.yaml").write_text("workspace_root: /tmp/ws\nnamespace: cd\nlocal_gpus: 0\n")  # the file
    assert configcache.cached(configcache.Inputs(repo.resolve(), None, None)) is None
    (repo / ".reconciler" / configcache.NAME).write_text("{not json")
    assert configcache.cached(inputs) is None

"""Configuration: defaults < file < environment < flags, with clear refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.core import config as configs
from reconciler.core.errors import UsageError


def test_layers_override_in_order(tmp_path, monkeypatch):
    (tmp_path / "reconciler.yaml").write_text("poll_interval: 5\nresync_interval: 7\nterminate_grace: 2\n")
    monkeypatch.setenv("RECONCILER_RESYNC_INTERVAL", "9")
    monkeypatch.setenv("RECONCILER_COMMIT", "false")
    cfg = configs.load(str(tmp_path), flags={"terminate_grace": 1.5})
    assert (cfg.poll_interval, cfg.resync_interval, cfg.terminate_grace, cfg.commit) == (5, 9, 1.5, False)


def test_unknown_setting_is_named_with_a_hint(tmp_path):
    (tmp_path / "reconciler.yaml").write_text("poll_intervall: 3\n")
    with pytest.raises(UsageError, match="unknown setting 'poll_intervall' \\(did you mean 'poll_interval'\\?\\)"):
        configs.load(str(tmp_path))


def test_malformed_file_is_located(tmp_path):
    (tmp_path / "reconciler.yaml").write_text("workspace_root: [\n")
    with pytest.raises(UsageError, match=r"reconciler\.yaml:2:1: invalid YAML"):
        configs.load(str(tmp_path))


def test_webhook_secret_is_redacted(tmp_path, monkeypatch):
    monkeypatch.setenv("RECONCILER_WEBHOOK_SECRET", "s3cret-value")
    cfg = configs.load(str(tmp_path))
    assert cfg.webhook_secret == "s3cret-value"
    assert cfg.redacted()["webhook_secret"] == "***" and "s3cret-value" not in str(cfg.redacted())


@pytest.mark.skipif(not Path("/proc/self/mem").is_file(), reason="needs a file that cannot be read (/proc/self/mem)")
def test_unreadable_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match=r"^/proc/self/mem: cannot read: "):
        configs.load(str(tmp_path), "/proc/self/mem")

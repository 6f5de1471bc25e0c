"""Settings of the object store, the datasets' limits and the local trainer are read once, in
synth_project/settings.py, strictly: a value that does not parse stops the process at start-up
instead of silently meaning the default."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
from django.core.exceptions import ImproperlyConfigured

SETTINGS_FILE = Path(__file__).resolve().parents[2] / "synth_project" / "settings.py"


def _settings_load(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **env: str) -> ModuleType:
    """Execute settings.py afresh (not the loaded settings) under this environment."""
    monkeypatch.setenv("SYNTH_VAR_DIR", str(tmp_path))
    monkeypatch.setenv("SECRET_KEY", "test-only")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    spec = importlib.util.spec_from_file_location("settings_under_test", SETTINGS_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_defaults(monkeypatch, tmp_path):
    for name in ("SYNTH_S3_CREATE_BUCKET", "SYNTH_S3_VERIFY", "SYNTH_TRAIN_UNEMBED_CHUNK", "SYNTH_TASK_MAX_BYTES"):
        monkeypatch.delenv(name, raising=False)
    loaded = _settings_load(monkeypatch, tmp_path)
    assert loaded.SYNTH_S3_CREATE_BUCKET is False
    assert loaded.SYNTH_S3_VERIFY == "checksum"
    assert loaded.SYNTH_TRAIN_UNEMBED_CHUNK == 512
    assert loaded.SYNTH_TASK_MAX_BYTES == 256 * 1024 * 1024


def test_values_are_parsed(monkeypatch, tmp_path):
    loaded = _settings_load(
        monkeypatch,
        tmp_path,
        SYNTH_S3_CREATE_BUCKET="true",
        SYNTH_S3_VERIFY="download",
        SYNTH_TRAIN_UNEMBED_CHUNK="64",
        SYNTH_TASK_MAX_FILE_BYTES="1024",
    )
    assert loaded.SYNTH_S3_CREATE_BUCKET is True
    assert loaded.SYNTH_S3_VERIFY == "download"
    assert loaded.SYNTH_TRAIN_UNEMBED_CHUNK == 64
    assert loaded.SYNTH_TASK_MAX_FILE_BYTES == 1024


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SYNTH_S3_CREATE_BUCKET", "ture"),
        ("SYNTH_S3_CREATE_BUCKET", "2"),
        ("SYNTH_S3_VERIFY", "hash"),
        ("SYNTH_TRAIN_UNEMBED_CHUNK", "0"),
        ("SYNTH_TRAIN_UNEMBED_CHUNK", "many"),
        ("SYNTH_TASK_MAX_FILE_BYTES", "1e6"),
        ("SYNTH_TASK_MAX_ARCHIVE_BYTES", "-1"),
    ],
)
def test_a_value_that_does_not_parse_is_an_error(monkeypatch, tmp_path, name, value):
    with pytest.raises(ImproperlyConfigured, match=name):
        _settings_load(monkeypatch, tmp_path, **{name: value})

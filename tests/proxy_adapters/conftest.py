"""Tokenizers for the adapter tests: provisioned once per session (about 10 s).

Uses settings.SYNTH_TOKENIZER_DIR when every family there is already up to date (e.g. a
developer ran `manage.py provision_tokenizers`); otherwise provisions into a session temp dir
through the management command itself.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command

from apps.proxy.tokenizers import FAMILIES, provisioned_status, tokenizer_load


@pytest.fixture(scope="session")
def tokenizer_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    configured = Path(settings.SYNTH_TOKENIZER_DIR)
    if all(provisioned_status(f, configured) is None for f in FAMILIES):
        return configured
    root = tmp_path_factory.mktemp("tokenizers")
    call_command("provision_tokenizers", "--dir", str(root), stdout=io.StringIO())
    return root


@pytest.fixture(scope="session")
def load(tokenizer_root: Path) -> Any:
    def _load(family: str) -> Any:
        return tokenizer_load(family, root=tokenizer_root)

    return _load

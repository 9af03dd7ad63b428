from __future__ import annotations

import sys
from pathlib import Path

import pytest

from infra.sandbox import REPO

BIN = Path(sys.executable).parent


def require_binary(name: str) -> Path:
    """Integration tests need real components; a missing one is a failure, never a skip."""
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{name} is not installed at {path}: run `make setup` (pip install -e .[dev])")
    return path


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO

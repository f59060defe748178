"""The type checker over the contract and hand-over modules (``[tool.mypy]`` in pyproject.toml) runs with the unit
tier too, so CI keeps those doors honest, not only ``make lint``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_the_contract_and_hand_over_modules_type_check() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success: no issues found" in done.stdout

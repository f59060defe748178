"""The Helm chart's CRDs are an exact copy of crds/ (hack/gen_crds.py writes both; this fails on drift)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "crds"
CHART_CRDS = ROOT / "charts" / "taskshard-operator" / "crds"


def test_chart_crds_are_identical_to_crds_dir():
    source = {p.name: p.read_bytes() for p in CRDS.glob("*.yaml")}
    chart = {p.name: p.read_bytes() for p in CHART_CRDS.glob("*.yaml")}
    assert set(chart) == set(source), "run python hack/gen_crds.py"
    for name in source:
        assert chart[name] == source[name], f"charts/taskshard-operator/crds/{name} drifted: run hack/gen_crds.py"


def test_check_mode_reports_a_drifted_chart_copy(tmp_path):
    for p in CHART_CRDS.glob("*.yaml"):
        (tmp_path / p.name).write_bytes(p.read_bytes())
    (tmp_path / "taskshard.io_tasks.yaml").write_text("# edited by hand\n")
    (tmp_path / "stray.yaml").write_text("kind: Stray\n")
    result = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "gen_crds.py"), "--check", "--chart-out", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert "taskshard.io_tasks.yaml" in result.stderr and "stray.yaml" in result.stderr

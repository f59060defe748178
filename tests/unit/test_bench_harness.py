"""The benchmark harness (``bench/run_all.py``, ``bench/common.py``): every benchmark the page lists is a script
that takes the flags run_all passes it and has a ``summarize(data)`` next to its measurement; a result file renders
into a section with its tables, findings, missed targets and notes; and bench/ stays one harness (no function over
80 lines, under 7,000 lines)."""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def run_all():
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("run_all")
    finally:
        sys.path.remove(str(BENCH))


def help_text(module) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as stop:
        module.main(["--help"])
    assert stop.value.code == 0
    return out.getvalue()


def test_every_benchmark_takes_its_flags_and_summarizes(run_all):
    scripts = {b.script for b in run_all.ORDER}
    assert len(run_all.ORDER) == len(run_all.BENCHMARKS) == len({b.number for b in run_all.ORDER})
    for script in sorted(scripts):
        module = importlib.import_module(Path(script).stem)
        assert callable(getattr(module, "summarize", None)), f"{script} has no summarize(data)"
        text = help_text(module)
        for bench in (b for b in run_all.ORDER if b.script == script):
            flags = {a for a in bench.full + bench.quick if a.startswith("--")}
            missing = sorted(f for f in flags if f not in text)
            assert not missing, f"{script} does not take {missing} (run_all's {bench.key} passes them)"


def test_a_result_renders_with_its_findings_and_missed_targets(run_all, tmp_path, monkeypatch):
    bench = run_all.BENCHMARKS["windows"]
    result = {
        "tables": [{"title": "Throughput", "columns": ["run", "events/s"], "rows": [["a", 1200.5], ["b", 900]]}],
        "targets": [
            {"name": "fast", "target": ">= 1x", "value": "0.75x", "met": False, "why": "the sort"},
            {"name": "exact", "target": "exact", "value": "exact", "met": True},
        ],
        "plots": [],
        "notes": ["one SparkSession"],
        "load": {"before": [0.5, 0.4, 0.3], "after": [0.6, 0.5, 0.3], "during": {"min": 0.4, "mean": 0.5, "max": 0.7}},
    }
    (tmp_path / f"{bench.result}.json").write_text(json.dumps(result))
    monkeypatch.setattr(type(bench), "summarize", lambda self, data: [f"{len(data['tables'])} table"])
    text, targets = run_all.section(bench, tmp_path, tmp_path / "docs")
    assert text.startswith(f"## {bench.number}. {bench.title}")
    assert "| a | 1200.50 |" in text and "What the numbers say:\n\n- 1 table" in text
    assert "- **missed**: fast: 0.75x (target >= 1x). the sort." in text
    assert "How it is measured:\n\n- one SparkSession" in text
    assert [t["name"] for t in targets] == ["fast", "exact"]


def test_a_summarize_that_does_not_fit_the_data_gives_no_lines(run_all):
    assert run_all.BENCHMARKS["split"].summarize({"raw": {}}) == []


def test_bench_is_one_harness():
    lines = 0
    long = []
    for path in sorted(BENCH.glob("*.py")):
        text = path.read_text()
        lines += len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > 80:
                    long.append(f"{path.name}:{node.name} {length} lines")
    assert not long, f"functions over 80 lines in bench/: {long}"
    assert lines < 7000, f"bench/ holds {lines} lines (at most 6,999)"
    starts = [p.name for p in BENCH.glob("*.py") if "LocalCluster(" in p.read_text()]
    assert not starts, f"{starts} start a control plane of their own (use hack/operator_bed.py's OperatorBed)"

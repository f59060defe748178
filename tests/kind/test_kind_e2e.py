"""TaskShard on a kind cluster from the built images: install the chart, run a Task, split a shard.

Runs ``hack/kind/e2e.sh`` (see its header for every step): kind cluster, ``docker build`` of both Dockerfile
targets, ``kind load docker-image``, ``helm install charts/taskshard-operator``, the Task of
``examples/task-count-journal.yaml`` with its shards Running, a split request by ``kubectl patch``, then the
parent in phase ``Split`` and its two children Running. Skipped with the printed reason where Docker, kind or the
node image is unavailable (see ``conftest.py``).
"""

from __future__ import annotations

import sys

import pytest

from tests.kind.support import run_script, tail

pytestmark = pytest.mark.kind

TIMEOUT_S = 3600


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_task_runs_and_a_shard_splits_on_kind(kind_preflight, tmp_path):
    log = tmp_path / "e2e.log"
    result = run_script([], log, timeout=TIMEOUT_S)
    assert result.returncode == 0, f"hack/kind/e2e.sh failed (exit {result.returncode}); log tail:\n{tail(log, 150)}"
    summary = [line for line in result.stdout.splitlines() if line.startswith("e2e: passed")]
    assert summary, result.stdout
    print(f"\n[kind] {summary[-1]}", file=sys.stderr)
    assert "children=" in summary[-1] and summary[-1].split("children=")[1].count(",") == 1

"""hack/build-binaries.sh fails early and clearly when Go or the module proxy is missing."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[2] / "hack" / "build-binaries.sh"


def run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    full = {"HOME": str(tmp_path), "TASKSHARD_BIN_CACHE": str(tmp_path / "cache"), "PATH": os.environ["PATH"]}
    full.update(env)
    return subprocess.run(["bash", str(SCRIPT), "etcd"], env=full, capture_output=True, text=True, timeout=60)


def test_without_go_it_says_so(tmp_path):
    result = run(tmp_path, PATH="/usr/bin:/bin")
    assert result.returncode != 0
    assert "Go is not installed" in result.stderr


def test_without_a_reachable_proxy_it_says_so(tmp_path):
    result = run(tmp_path, GOPROXY="http://127.0.0.1:9", GOFLAGS="")
    assert result.returncode != 0
    assert "module proxy (http://127.0.0.1:9) is not reachable" in result.stderr


def test_unknown_component_is_refused(tmp_path):
    full = {"HOME": str(tmp_path), "TASKSHARD_BIN_CACHE": str(tmp_path / "c"), "PATH": os.environ["PATH"]}
    result = subprocess.run(["bash", str(SCRIPT), "kubelet"], env=full, capture_output=True, text=True)
    assert result.returncode != 0
    assert "unknown component 'kubelet'" in result.stderr


def test_cached_component_is_reused_without_go(tmp_path):
    versions = dict(
        line.split("=", 1)
        for line in (SCRIPT.parent / "versions.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    done = tmp_path / "cache" / f"etcd-{versions['ETCD_VERSION']}"
    (done / "bin").mkdir(parents=True)
    (done / ".complete").touch()
    result = run(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "cached at" in result.stderr

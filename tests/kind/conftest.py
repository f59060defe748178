"""Fixtures of the kind tier (hosts with Docker and image pulls only).

``kind_preflight`` (session) runs ``hack/kind/e2e.sh --preflight``: a Docker daemon answers, a ``kind`` binary is
found or built (``go install sigs.k8s.io/kind@$KIND_VERSION``), the kind node image is present or pulled, kubectl
and helm exist. When any of that is impossible on this host the script exits 3 with an ``UNAVAILABLE: <reason>``
line and every test of the tier is skipped with that reason (printed, and listed by ``-ra``); any other failure
of the preflight fails the tests.
"""

from __future__ import annotations

import pytest

from tests.kind.support import run_script, tail


@pytest.fixture(scope="session")
def kind_preflight(tmp_path_factory):
    log = tmp_path_factory.mktemp("kind") / "preflight.log"
    result = run_script(["--preflight"], log, timeout=1800)
    assert result.returncode == 0, f"kind preflight failed (exit {result.returncode}):\n{tail(log)}"
    return log

"""Running hack/kind/e2e.sh from tests: progress to a log file, exit 3 (host cannot run it) becomes a skip."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
E2E = REPO / "hack" / "kind" / "e2e.sh"
UNAVAILABLE = 3


def unavailable_reason(stdout: str) -> str | None:
    """The last ``UNAVAILABLE: ...`` line of a script's stdout, if any."""
    lines = [line for line in stdout.splitlines() if line.startswith("UNAVAILABLE:")]
    return lines[-1] if lines else None


def run_script(args: list[str], log: Path, timeout: float) -> subprocess.CompletedProcess:
    """Run ``hack/kind/e2e.sh`` with stderr (progress, diagnostics) to ``log``; skip the test when it exits 3."""
    with log.open("w") as err:
        result = subprocess.run(
            ["bash", str(E2E), *args], cwd=REPO, stdout=subprocess.PIPE, stderr=err, text=True, timeout=timeout
        )
    if result.returncode == UNAVAILABLE:
        reason = unavailable_reason(result.stdout) or "e2e.sh exited 3 without a reason"
        print(f"\n[kind] {reason}", file=sys.stderr)
        pytest.skip(f"the kind tier cannot run on this host: {reason}")
    return result


def tail(path: Path, lines: int = 80) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

"""The image build check: both Dockerfile targets build from a debootstrap'ed Debian base and run.

Runs ``hack/image/check.sh`` (see its header): a Docker daemon (the environment's, else a private dockerd it starts
and stops), the base image, ``docker build --target operator|shard``, then ``--help`` of both entrypoints, the uid,
the absence of build tools, and a Spark smoke run in the shard image under a read-only root with a writable /tmp.

Skipped, with the reason printed, when the host cannot build images at all (the script exits 3: no daemon can
start, no Debian mirror, not root); never passes without building. A cold run (debootstrap, PySpark download,
JRE) takes several minutes; a warm one reuses the cached rootfs and Docker's layer cache (under
``~/.cache/taskshard/image``, or ``TASKSHARD_IMAGE_CACHE``).

Marker: ``kind`` for now (Docker hosts only, outside the default ``make test``). Once ``image`` is declared in
pyproject.toml, this module switches to ``pytest.mark.image``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.image]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "image" / "check.sh"
UNAVAILABLE = 3
TIMEOUT_S = 3600


def _summary(stdout: str) -> dict[str, str]:
    """``check: a=1 b=2`` lines as ``{"a": "1", "b": "2"}``."""
    out: dict[str, str] = {}
    for line in stdout.splitlines():
        if line.startswith("check: "):
            for item in line[len("check: ") :].split():
                key, _, value = item.partition("=")
                out[key] = value
    return out


def _tail(path: Path, lines: int = 60) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_both_images_build_and_run(tmp_path):
    log = tmp_path / "check.log"
    with log.open("w") as err:
        result = subprocess.run(
            ["bash", str(SCRIPT)], cwd=REPO, stdout=subprocess.PIPE, stderr=err, text=True, timeout=TIMEOUT_S
        )
    if result.returncode == UNAVAILABLE:
        reasons = [line for line in result.stdout.splitlines() if line.startswith("UNAVAILABLE:")]
        reason = reasons[-1] if reasons else f"check.sh exited {UNAVAILABLE} without a reason; log tail:\n{_tail(log)}"
        print(f"\n[image] {reason}", file=sys.stderr)
        pytest.skip(f"this host cannot build images: {reason}")
    assert result.returncode == 0, f"hack/image/check.sh failed (exit {result.returncode}); log tail:\n{_tail(log)}"

    summary = _summary(result.stdout)
    print("\n[image] " + " ".join(f"{k}={v}" for k, v in summary.items()), file=sys.stderr)
    assert summary.get("operator_image") and summary.get("shard_image"), result.stdout
    assert int(summary["operator_size_mb"]) > 0 and int(summary["shard_size_mb"]) > int(summary["operator_size_mb"])

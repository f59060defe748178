"""`make images` and `make push-images` (docs/install.md, step 1): the shard image is built with the Kafka and S3
jars by default, both images are tagged under IMAGE_REPO, and push follows the build (read from `make -n`, which
runs nothing)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.unit


def planned(*targets: str) -> list[str]:
    out = subprocess.run(
        ["make", "-n", *targets, "IMAGE_REPO=registry.example.com/taskshard", "IMAGE_TAG=9.9.9"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line for line in out.splitlines() if "testinfra jars" in line or line.startswith("docker ")]


def test_images_fetch_the_jars_before_the_shard_build_and_push_follows():
    steps = planned("push-images")
    assert steps == [
        ".venv/bin/python -m testinfra jars --into hack/image/jars",
        "docker build --target operator -t registry.example.com/taskshard/operator:9.9.9 .",
        "docker build --target shard -t registry.example.com/taskshard/shard:9.9.9 .",
        "docker push registry.example.com/taskshard/operator:9.9.9",
        "docker push registry.example.com/taskshard/shard:9.9.9",
    ]

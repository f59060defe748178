"""Fixtures of the real-node tier (``make test-node``): the project's images on a real kubelet.

- ``node_images`` (session): both Dockerfile targets built as ``make images`` builds them (Kafka and S3 jars in the
  shard image), from a debootstrap'ed base with a private dockerd (:mod:`hack/image/lib.sh`), saved to one archive.
- ``real_node`` (session): the local control plane with a real node (:class:`localkube.realnode.RealNode`:
  containerd, runc, CNI bridge, kubelet, kube-proxy), the images imported into its containerd.
- ``node_kafka`` / ``node_minio`` (session): a broker and MinIO listening on the node's IP, so that pods reach them.

Needs root and Debian packages (installed when missing); a component that cannot be had fails the test with the
reason, never a skip.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from localkube.cluster import LocalCluster
from localkube.realnode import RealNode
from testinfra.jars import spark_jars
from testinfra.kafka import KafkaBroker
from testinfra.minio import MinioServer

ROOT = Path(__file__).resolve().parents[2]
IMAGE_TAG = "node"
OPERATOR_IMAGE = f"taskshard/operator:{IMAGE_TAG}"
SHARD_IMAGE = f"taskshard/shard:{IMAGE_TAG}"

# Build both images with the shared image functions, then save them into one archive for containerd.
BUILD_AND_SAVE = r"""
set -euo pipefail
source hack/image/lib.sh
trap img_cleanup EXIT
img_ensure_docker
img_ensure_base_image
img_build operator "$OPERATOR_IMAGE"
img_build shard "$SHARD_IMAGE"
"$DOCKER" save -o "$ARCHIVE" "$OPERATOR_IMAGE" "$SHARD_IMAGE"
"""


@pytest.fixture(scope="session")
def node_images(tmp_path_factory) -> Path:
    """One ``docker save`` archive of both images (a warm build reuses every layer but the project's wheel)."""
    jars = ROOT / "hack" / "image" / "jars"
    spark_jars()  # into the cache (Maven Central on a cold machine)
    subprocess.run(
        [".venv/bin/python", "-m", "testinfra", "jars", "--into", str(jars)], cwd=ROOT, check=True, capture_output=True
    )
    archive = tmp_path_factory.mktemp("images") / "images.tar"
    log = archive.with_suffix(".log")
    start = time.monotonic()
    env = {"OPERATOR_IMAGE": OPERATOR_IMAGE, "SHARD_IMAGE": SHARD_IMAGE, "ARCHIVE": str(archive)}
    with open(log, "w") as out:
        result = subprocess.run(
            ["bash", "-c", BUILD_AND_SAVE], cwd=ROOT, env={**os.environ, **env}, stdout=out, stderr=out, check=False
        )
    if result.returncode != 0:
        pytest.fail(f"building the images failed (exit {result.returncode}):\n{log.read_text()[-3000:]}")
    print(f"\n[node] images built and saved in {time.monotonic() - start:.0f}s", flush=True)
    return archive


@pytest.fixture(scope="session")
def real_node(tmp_path_factory, node_images):
    run_dir = tmp_path_factory.mktemp("realnode")
    cluster = LocalCluster(run_dir / "cluster", node_agent=False, apiserver_flags=RealNode.apiserver_flags())
    cluster.start()
    node = RealNode(cluster, run_dir / "node")
    try:
        node.start()
        start = time.monotonic()
        node.import_image(node_images)
        print(f"\n[node] images imported into containerd in {time.monotonic() - start:.0f}s", flush=True)
        yield node
    except BaseException:
        node.print_log_tails()
        raise
    finally:
        node.stop()
        cluster.stop()


@pytest.fixture(scope="session")
def node_kafka(tmp_path_factory, real_node):
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"), host=real_node.ip)
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def node_minio(tmp_path_factory, real_node):
    server = MinioServer(tmp_path_factory.mktemp("minio"), host=real_node.ip)
    server.start()
    yield server
    server.stop()

"""The real node's pure parts: the pause image's OCI archive, the iptables rule a cleanup deletes, the build script's
node component. (The node itself runs in ``make test-node``.)"""

from __future__ import annotations

import hashlib
import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from localkube.hostnode import _delete_args
from localkube.ociimage import write_oci_archive

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_oci_archive_is_a_consistent_image_layout(tmp_path):
    archive = tmp_path / "pause.tar"
    write_oci_archive(archive, "registry.k8s.io/pause:3.10", {"pause": b"\x7fELF-not-really"}, entrypoint=["/pause"])
    with tarfile.open(archive) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    for name, data in files.items():  # every blob is stored under its own digest
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    index = json.loads(files["index.json"])
    (entry,) = index["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == "registry.k8s.io/pause:3.10"
    manifest = json.loads(files[f"blobs/sha256/{entry['digest'][7:]}"])
    config = json.loads(files[f"blobs/sha256/{manifest['config']['digest'][7:]}"])
    assert config["config"]["Entrypoint"] == ["/pause"]
    (layer,) = manifest["layers"]
    assert layer["size"] == len(files[f"blobs/sha256/{layer['digest'][7:]}"])


def test_a_printed_rule_becomes_its_deletion():
    rule = '-A POSTROUTING -s 10.244.0.5/32 -m comment --comment "name: \\"taskshard-node\\" id: \\"ab\\"" -j CNI-1f'
    assert _delete_args(rule) == [
        "-D", "POSTROUTING", "-s", "10.244.0.5/32", "-m", "comment", "--comment",
        'name: "taskshard-node" id: "ab"', "-j", "CNI-1f",
    ]  # fmt: skip


def test_build_script_knows_the_node_component():
    """``all`` must not build the node's binaries (the main tiers do not need them); ``node`` names them."""
    script = (ROOT / "hack" / "build-binaries.sh").read_text()
    assert "build_kubernetes kubernetes-node kubelet kube-proxy\n  build_module coredns" in script
    assert "all) build_etcd; build_helm; build_control_plane ;;" in script
    bad = subprocess.run(["bash", str(ROOT / "hack" / "build-binaries.sh"), "nodes"], capture_output=True, text=True)
    assert bad.returncode != 0 and "expected all, kubernetes, node, etcd or helm" in bad.stderr

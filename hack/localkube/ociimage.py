"""The pause image of the real node, made here: no registry can be reached, and the CRI needs one per pod sandbox.

:func:`ensure_pause_image` compiles a static pause (it waits for a signal, exits on SIGINT/SIGTERM, reaps children)
with the host's C compiler and writes it as a one-layer OCI image-layout archive for ``ctr images import``.
The archive is cached; it is rebuilt only when missing.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from localkube.hostnode import NodeUnavailable

PAUSE_C = r"""
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
static void down(int signo) { exit(0); }
static void reap(int signo) { while (waitpid(-1, NULL, WNOHANG) > 0) ; }
int main(void) {
  struct sigaction a = {.sa_handler = down};
  sigaction(SIGINT, &a, NULL); sigaction(SIGTERM, &a, NULL);
  struct sigaction r = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
  sigaction(SIGCHLD, &r, NULL);
  for (;;) pause();
}
"""


def ensure_pause_image(ref: str, cache: Path) -> Path:
    """The cached OCI archive of a pause image named ``ref``; built first when missing."""
    archive = cache / f"pause-{hashlib.sha256(ref.encode()).hexdigest()[:12]}.tar"
    if archive.exists():
        return archive
    cache.mkdir(parents=True, exist_ok=True)
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise NodeUnavailable("no C compiler (cc, gcc) to build the node's pause image")
    with tempfile.TemporaryDirectory() as work:
        source, binary = Path(work) / "pause.c", Path(work) / "pause"
        source.write_text(PAUSE_C)
        subprocess.run([compiler, "-static", "-Os", "-o", str(binary), str(source)], check=True)
        partial = archive.with_suffix(".partial")
        write_oci_archive(partial, ref, {"pause": binary.read_bytes()}, entrypoint=["/pause"])
        partial.rename(archive)
    return archive


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def write_oci_archive(path: Path, ref: str, files: dict[str, bytes], *, entrypoint: list[str]) -> None:
    """An OCI image-layout tar of one image ``ref`` whose only layer holds ``files`` (mode 0755, uid 0)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as layer_tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            layer_tar.addfile(info, io.BytesIO(data))
    layer_raw = raw.getvalue()
    layer = gzip.compress(layer_raw, mtime=0)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": entrypoint, "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [_digest(layer_raw)]},
        }
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": _digest(config),
                "size": len(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": _digest(layer),
                    "size": len(layer),
                }
            ],
        }
    ).encode()
    annotations = {"org.opencontainers.image.ref.name": ref, "io.containerd.image.name": ref}
    index = json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": _digest(manifest),
                    "size": len(manifest),
                    "annotations": annotations,
                }
            ],
        }
    ).encode()
    with tarfile.open(path, "w") as out:
        for name, data in [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", index)] + [
            (f"blobs/sha256/{_digest(blob)[7:]}", blob) for blob in (config, manifest, layer)
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))

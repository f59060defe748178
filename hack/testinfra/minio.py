"""MinIO for the integration tests: built from its Go module (cached by version) and started on loopback.

Build (:func:`ensure_minio`):
- Output: ``$TASKSHARD_BIN_CACHE/minio-<version>/bin/minio`` (default cache ``~/.cache/taskshard/bin``), reused
  whenever the directory holds a ``.complete`` marker.
- Like ``hack/build-binaries.sh`` does for etcd, the build goes through a wrapper module (``go mod init``, a
  ``tools.go`` blank import, ``go mod tidy``, ``go build``) so that a ``replace`` directive in minio's go.mod
  (``go install mod@version`` refuses those) is carried over instead of breaking the build. The wrapper builds in
  a temporary directory under the cache and is moved into place only when complete.
- A cold build downloads a few hundred MB of modules and compiles ~1,000 packages: many minutes on 2 cores;
  progress lines go to stderr. Fails with :class:`MinioUnavailable` when Go or the module proxy is missing.

Server (:class:`MinioServer`): ``minio server <run_dir>/data`` on free 127.0.0.1 ports with test credentials,
health-checked through ``/minio/health/live``, logs in ``<run_dir>/minio.log``; ``stop()`` is idempotent.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from .common import ManagedProcess, bin_cache_dir, free_port, log, run_with_progress, wait_until
from .s3 import S3Client, S3Error
from .versions import MINIO_MODULE, MINIO_VERSION

__all__ = ["MinioServer", "MinioUnavailable", "ensure_minio", "minio_binary_path"]

COMPONENT = "minio"


class MinioUnavailable(RuntimeError):
    """The MinIO binary is not cached and could not be built (no Go, no module proxy, or a failed build)."""


def minio_binary_path(version: str = MINIO_VERSION) -> Path:
    return bin_cache_dir() / f"minio-{version}" / "bin" / "minio"


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(GOFLAGS="-mod=mod", GOTOOLCHAIN="local", CGO_ENABLED="0")
    return env


def _check_proxy(version: str) -> None:
    try:
        out = subprocess.run(["go", "env", "GOPROXY"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as e:
        raise MinioUnavailable(f"Go is not usable ({e}); install Go >= 1.24 and retry") from e
    first = out.split(",")[0].split("|")[0]
    if first in ("direct", "off", ""):
        return
    url = f"{first.rstrip('/')}/{MINIO_MODULE}/@v/{version}.info"
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            r.read()
    except (urllib.error.URLError, OSError) as e:
        raise MinioUnavailable(
            f"the Go module proxy ({first}) did not serve {MINIO_MODULE}@{version} ({e}); MinIO cannot be built. "
            f"Set GOPROXY or pre-fill {minio_binary_path(version).parent.parent}"
        ) from e


def _summarize_go(line: str) -> str | None:
    if line.startswith("go: downloading "):
        _summarize_go.downloads += 1  # type: ignore[attr-defined]
        n = _summarize_go.downloads  # type: ignore[attr-defined]
        return f"downloading modules: {n} so far ({line[len('go: downloading ') :]})" if n % 40 == 1 else None
    if line.startswith(("go: ", "#")) or ".go:" in line:
        return line
    return None


_summarize_go.downloads = 0  # type: ignore[attr-defined]


def ensure_minio(version: str = MINIO_VERSION) -> Path:
    """Return the cached MinIO binary, building it first when it is missing."""
    binary = minio_binary_path(version)
    dest = binary.parent.parent
    if (dest / ".complete").exists() and os.access(binary, os.X_OK):
        log(COMPONENT, f"{version}: cached at {binary}")
        return binary
    if shutil.which("go") is None:
        raise MinioUnavailable("Go is not installed (need go >= 1.24 on PATH); install Go and retry")
    _check_proxy(version)
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-minio.", dir=dest.parent))
    try:
        _build(version, work)
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        (work / "bin").rename(dest / "bin")
        (dest / "VERSION").write_text(f"{MINIO_MODULE}@{version}\n")
        (dest / ".complete").touch()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(COMPONENT, f"{version}: ready at {binary}")
    return binary


def _go(work: Path, *args: str, what: str) -> list[str]:
    rc, tail = run_with_progress(["go", *args], component=COMPONENT, cwd=work, env=_go_env(), what=what)
    if rc != 0:
        raise MinioUnavailable(f"`go {' '.join(args)}` failed (exit {rc}) while {what}:\n" + "\n".join(tail[-25:]))
    return tail


def _build(version: str, work: Path) -> None:
    log(COMPONENT, f"{version}: building {MINIO_MODULE} through a wrapper module in {work} (cold: many minutes)")
    _go(work, "mod", "init", "taskshard.local/miniobuild", what="creating the wrapper module")
    _go(work, "mod", "edit", f"-require={MINIO_MODULE}@{version}", what="pinning minio")
    # Carry minio's own replace directives over: in a dependency they would be ignored.
    info = subprocess.run(
        ["go", "mod", "download", "-json", f"{MINIO_MODULE}@{version}"],
        cwd=work,
        env=_go_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    if info.returncode != 0:
        raise MinioUnavailable(f"could not download {MINIO_MODULE}@{version}: {info.stdout[-800:]}{info.stderr[-800:]}")
    gomod = json.loads(info.stdout)["GoMod"]
    replaces = json.loads(subprocess.run(["go", "mod", "edit", "-json", gomod], capture_output=True, check=True).stdout)
    for rep in replaces.get("Replace") or []:
        old, new = rep["Old"], rep["New"]
        if not new.get("Version"):
            raise MinioUnavailable(f"minio's go.mod replaces {old['Path']} with a local path; cannot build it")
        lhs = old["Path"] + (f"@{old['Version']}" if old.get("Version") else "")
        log(COMPONENT, f"carrying over replace {lhs} => {new['Path']}@{new['Version']}")
        _go(work, "mod", "edit", f"-replace={lhs}={new['Path']}@{new['Version']}", what="adding a replace")
    (work / "tools.go").write_text(f'//go:build tools\n\npackage tools\n\nimport _ "{MINIO_MODULE}"\n')
    log(COMPONENT, "resolving dependencies (go mod tidy; a cold module cache downloads a few hundred MB)")
    _summarize_go.downloads = 0  # type: ignore[attr-defined]
    rc, tail = run_with_progress(
        ["go", "mod", "tidy"], component=COMPONENT, cwd=work, env=_go_env(), summarize=_summarize_go, what="resolving"
    )
    if rc != 0:
        raise MinioUnavailable("go mod tidy failed for the minio wrapper module:\n" + "\n".join(tail[-25:]))
    log(COMPONENT, "compiling (go build -v; one progress line per 100 packages)")
    count = [0]

    def summarize_build(line: str) -> str | None:
        if line.startswith(("go: ", "#")) or ".go:" in line:
            return line
        count[0] += 1
        return f"minio: {count[0]} packages compiled" if count[0] % 100 == 0 else None

    rc, tail = run_with_progress(
        ["go", "build", "-v", "-trimpath", "-ldflags", "-s -w", "-o", "bin/minio", MINIO_MODULE],
        component=COMPONENT,
        cwd=work,
        env=_go_env(),
        summarize=summarize_build,
        what="compiling",
    )
    if rc != 0 or not os.access(work / "bin" / "minio", os.X_OK):
        raise MinioUnavailable(f"go build of {MINIO_MODULE} failed (exit {rc}):\n" + "\n".join(tail[-25:]))
    log(COMPONENT, f"minio: done ({count[0]} packages)")


class MinioServer:
    """A single-drive MinIO on 127.0.0.1 with test credentials.

    ``endpoint`` is ``http://127.0.0.1:<port>``; ``client()`` returns an :class:`~testinfra.s3.S3Client` for it.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        *,
        binary: str | os.PathLike | None = None,
        access_key: str = "taskshard-test",
        secret_key: str = "taskshard-test-secret-key",
        region: str = "us-east-1",
        host: str = "127.0.0.1",
    ) -> None:
        """``host``: the address MinIO listens on (the real-node tier passes the node's IP so that pods reach it)."""
        self.run_dir = Path(run_dir)
        self.host = host
        self.binary = Path(binary) if binary else None
        self.access_key = access_key
        self.secret_key = secret_key
        self.region = region
        self.port: int | None = None
        self.console_port: int | None = None
        self.process = ManagedProcess("minio", self.run_dir / "minio.log")

    @property
    def endpoint(self) -> str:
        if self.port is None:
            raise RuntimeError("MinIO has not been started")
        return f"http://{self.host}:{self.port}"

    def client(self, *, access_key: str | None = None, secret_key: str | None = None) -> S3Client:
        return S3Client(self.endpoint, access_key or self.access_key, secret_key or self.secret_key, region=self.region)

    def start(self, timeout: float = 60.0) -> MinioServer:
        binary = self.binary or ensure_minio()
        data = self.run_dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        if self.port is None:  # keep the ports across restarts: clients keep their endpoint
            self.port, self.console_port = free_port(), free_port()
        env = dict(os.environ)
        env.update(
            MINIO_ROOT_USER=self.access_key,
            MINIO_ROOT_PASSWORD=self.secret_key,
            MINIO_REGION=self.region,
            MINIO_BROWSER="off",
            MINIO_UPDATE="off",
            MINIO_CI_CD="1",
            HOME=str(self.run_dir),
        )
        self.process.start(
            [
                str(binary),
                "server",
                str(data),
                "--address",
                f"{self.host}:{self.port}",
                "--console-address",
                f"127.0.0.1:{self.console_port}",
                "--quiet",
            ],
            env=env,
        )
        wait_until(self._healthy, timeout=timeout, what=f"MinIO health at {self.endpoint}", process=self.process)
        log(COMPONENT, f"up at {self.endpoint} (pid {self.process.pid}, log {self.process.log_path})")
        return self

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint}/minio/health/ready", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, timeout: float = 30.0) -> None:
        if self.process.alive():
            self.process.stop(timeout)
            log(COMPONENT, "stopped")

    def create_bucket(self, name: str, timeout: float = 30.0) -> None:
        """Create ``name``; retried while MinIO still answers 503 ``XMinioServerNotInitialized`` (its readiness
        endpoint can say ready a moment before the object layer is)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.client().create_bucket(name)
                return
            except S3Error as e:
                if e.status != 503 or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def __enter__(self) -> MinioServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

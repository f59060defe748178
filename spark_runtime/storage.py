"""Storage locations: a local directory or an S3-compatible bucket behind one small API.

A :class:`Loc` is a file or directory location. Its string form (:meth:`Loc.uri`) is what Spark and the
manifests use: an absolute local path (``/data/state/orders/...``) or an ``s3a://bucket/key`` URI. Reads and
writes go through ``pyarrow.fs`` (local or S3 file system), so the runtime's own small files (progress,
lineage, drain marker, manifests), the checkpoint's offset log and the Parquet snapshots are handled the same
way in both.

Consistency contract (what the runtime relies on, true for POSIX directories and for S3's strong
read-after-write consistency):

- :meth:`Loc.write_bytes` is all-or-nothing: a reader sees the old object or the new one, never a torn file
  (local: a temporary file renamed into place; S3: a single PUT, which becomes visible only when complete).
- Directories are not renamed on S3 (it has none); instead a snapshot is written in place and its manifest is
  written last: its presence marks the snapshot complete.
- :meth:`Loc.create_exclusive` creates a file only if it does not exist, atomically: of two writers exactly one
  succeeds (local: a complete temporary file hard-linked into place, which fails if the name exists; S3: a
  conditional ``PUT`` with ``If-None-Match: *``, which the service refuses with 412 when the key exists). The
  writer epochs (:mod:`spark_runtime.fencing`), snapshot manifests and drain summaries are written this way.

S3 settings (:class:`S3Settings`): the endpoint and region come from the Task's ``storage.s3`` (or
``$TASKSHARD_S3_ENDPOINT`` / ``$AWS_REGION``); credentials only from the environment (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, which the operator sets from the Secret named in ``storage.s3.credentialsSecret``),
never from the config or the manifests.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from spark_runtime.problems import EnvironmentProblem

__all__ = [
    "Loc",
    "S3Settings",
    "StorageProblem",
    "check_storage",
    "location",
    "remove_tree",
    "s3_settings_from",
    "storage_root",
]

S3_SCHEMES = ("s3a", "s3", "s3n")
ENV_CREDENTIALS_PROVIDER = "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider"
"""s3a's credentials from ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (/ ``AWS_SESSION_TOKEN``) of the JVM's
environment, never from the SparkConf."""


class StorageProblem(EnvironmentProblem):
    """The storage cannot be used (wrong credentials, missing bucket, unreachable endpoint)."""


@dataclass(frozen=True)
class S3Settings:
    """How to reach an S3-compatible service. ``access_key``/``secret_key`` None: the AWS default chain."""

    endpoint: str | None = None
    region: str = "us-east-1"
    access_key: str | None = None
    secret_key: str | None = None

    def filesystem(self) -> Any:
        return _s3_filesystem(self)

    def hadoop_conf(self) -> dict[str, str]:
        """Spark conf for s3a with these settings (endpoint, path-style access for custom endpoints, and, with keys,
        the provider that reads them from the environment: the keys themselves are never in the conf)."""
        conf = {
            "spark.hadoop.fs.s3a.endpoint.region": self.region,
            # Fail within seconds, not minutes, when the service is down: the shard's status says why.
            "spark.hadoop.fs.s3a.attempts.maximum": "3",
            "spark.hadoop.fs.s3a.retry.limit": "3",
            "spark.hadoop.fs.s3a.connection.establish.timeout": "5s",
            "spark.hadoop.fs.s3a.connection.timeout": "30s",
        }
        if self.endpoint:
            conf["spark.hadoop.fs.s3a.endpoint"] = self.endpoint
            conf["spark.hadoop.fs.s3a.path.style.access"] = "true"
            conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(self.endpoint.startswith("https")).lower()
        if self.access_key and self.secret_key:
            # The keys stay in the environment (the pod's, from the Task's Secret; executors get them from their
            # template): a SparkConf is handed to every executor that registers, and shown in the UI and logs.
            conf["spark.hadoop.fs.s3a.aws.credentials.provider"] = ENV_CREDENTIALS_PROVIDER
        return conf

    def options(self) -> dict[str, str]:
        """The non-secret part, for Spark data source options (credentials stay in the environment)."""
        return {"s3endpoint": self.endpoint or "", "s3region": self.region}

    @classmethod
    def from_options(cls, options: Mapping[str, str], env: Mapping[str, str] | None = None) -> S3Settings:
        env = os.environ if env is None else env
        return cls(
            endpoint=options.get("s3endpoint") or None,
            region=options.get("s3region") or "us-east-1",
            access_key=env.get("AWS_ACCESS_KEY_ID") or None,
            secret_key=env.get("AWS_SECRET_ACCESS_KEY") or None,
        )


def s3_settings_from(spec: Any | None, env: Mapping[str, str] | None = None) -> S3Settings:
    """Settings from a config's ``storage.s3`` (or None) plus the environment."""
    env = os.environ if env is None else env
    endpoint = (getattr(spec, "endpoint", None) if spec is not None else None) or env.get("TASKSHARD_S3_ENDPOINT")
    return S3Settings(
        endpoint=endpoint or None,
        region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
        access_key=env.get("AWS_ACCESS_KEY_ID") or None,
        secret_key=env.get("AWS_SECRET_ACCESS_KEY") or None,
    )


@functools.lru_cache(maxsize=8)
def _s3_filesystem(settings: S3Settings) -> Any:
    from pyarrow import fs

    kwargs: dict[str, Any] = {
        "region": settings.region,
        "connect_timeout": 5,
        "request_timeout": 30,
        "retry_strategy": fs.AwsStandardS3RetryStrategy(max_attempts=3),
    }
    if settings.endpoint:
        parsed = urlparse(settings.endpoint)
        kwargs["endpoint_override"] = parsed.netloc or parsed.path
        kwargs["scheme"] = parsed.scheme or "https"
        kwargs["force_virtual_addressing"] = False
    if settings.access_key and settings.secret_key:
        kwargs["access_key"] = settings.access_key
        kwargs["secret_key"] = settings.secret_key
    return fs.S3FileSystem(**kwargs)


@functools.lru_cache(maxsize=8)
def _s3_client(settings: S3Settings) -> Any:
    """A boto3 S3 client for what pyarrow's file system cannot do (conditional puts, reads in one ``GET``)."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=settings.endpoint or None,
        region_name=settings.region,
        aws_access_key_id=settings.access_key,
        aws_secret_access_key=settings.secret_key,
        config=Config(
            s3={"addressing_style": "path" if settings.endpoint else "auto"},
            retries={"max_attempts": 3, "mode": "standard"},
            connect_timeout=5,
            read_timeout=30,
        ),
    )


CONDITIONAL_CONFLICT_RETRIES = 5
"""How often a conditional put that raced another one on the same key (S3's 409 ConditionalRequestConflict) is
retried before giving up."""


@functools.lru_cache(maxsize=1)
def _local_filesystem() -> Any:
    from pyarrow import fs

    return fs.LocalFileSystem()


class Loc:
    """A file or directory in local storage or S3 (see the module docstring). Immutable; ``/`` joins."""

    __slots__ = ("_s3", "path")

    def __init__(self, path: str, s3: S3Settings | None = None) -> None:
        self.path = path.rstrip("/") if len(path) > 1 else path
        """The file system path: an absolute local path, or ``bucket/key`` on S3."""
        self._s3 = s3

    # ---------------------------------------------------------------- naming

    @property
    def is_s3(self) -> bool:
        return self._s3 is not None

    @property
    def fs(self) -> Any:
        return self._s3.filesystem() if self._s3 is not None else _local_filesystem()

    @property
    def s3(self) -> S3Settings | None:
        return self._s3

    def uri(self) -> str:
        """What Spark and manifests use: the local path, or ``s3a://bucket/key``."""
        return f"s3a://{self.path}" if self._s3 is not None else self.path

    def __str__(self) -> str:
        return self.uri()

    def __repr__(self) -> str:
        return f"Loc({self.uri()!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Loc) and (self.path, self._s3) == (other.path, other._s3)

    def __hash__(self) -> int:
        return hash((self.path, self._s3))

    def __truediv__(self, name: str) -> Loc:
        return Loc(f"{self.path}/{str(name).strip('/')}", self._s3)

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def parent(self) -> Loc:
        return Loc(self.path.rsplit("/", 1)[0] or "/", self._s3)

    def __fspath__(self) -> str:
        """Local locations work wherever a path does (``open``, ``Path``); S3 ones do not."""
        if self._s3 is not None:
            raise TypeError(f"{self.uri()} is on S3, not a local path")
        return self.path

    def local_path(self) -> Path:
        """The local :class:`Path` (raises for S3 locations)."""
        if self._s3 is not None:
            raise ValueError(f"{self.uri()} is not a local path")
        return Path(self.path)

    # ---------------------------------------------------------------- queries

    def _info(self) -> Any:
        return self.fs.get_file_info(self.path)

    def exists(self) -> bool:
        from pyarrow import fs

        return self._info().type != fs.FileType.NotFound

    def is_file(self) -> bool:
        from pyarrow import fs

        return self._info().type == fs.FileType.File

    def is_dir(self) -> bool:
        from pyarrow import fs

        return self._info().type == fs.FileType.Directory

    def size(self) -> int:
        return int(self._info().size or 0)

    def iterdir(self) -> list[Loc]:
        """The direct children (files and directories); empty when the directory does not exist."""
        from pyarrow import fs

        infos = self.fs.get_file_info(fs.FileSelector(self.path, allow_not_found=True, recursive=False))
        return sorted((Loc(i.path, self._s3) for i in infos), key=lambda loc: loc.name)

    def child_dirs(self) -> list[Loc]:
        from pyarrow import fs

        infos = self.fs.get_file_info(fs.FileSelector(self.path, allow_not_found=True, recursive=False))
        return sorted((Loc(i.path, self._s3) for i in infos if i.type == fs.FileType.Directory), key=lambda x: x.name)

    # ---------------------------------------------------------------- reads

    def read_bytes(self) -> bytes:
        """The file's bytes. On S3 one ``GET``, which returns one version of the object whole: pyarrow's stream
        reads in ranges, so an object rewritten meanwhile (a parent's ``progress.json``, a ``catch-up.json``) could
        come back as the old bytes spliced with the new. A missing object raises ``FileNotFoundError``."""
        if self._s3 is not None:
            return self._s3_get()
        with self.fs.open_input_stream(self.path) as fh:
            return fh.read()

    def _s3_get(self) -> bytes:
        from botocore.exceptions import ClientError

        assert self._s3 is not None
        bucket, _, key = self.path.partition("/")
        try:
            return bytes(_s3_client(self._s3).get_object(Bucket=bucket, Key=key)["Body"].read())
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in ("NoSuchKey", "404", "NotFound"):
                raise FileNotFoundError(f"{self.uri()}: no such object") from None
            raise

    def read_text(self) -> str:
        return self.read_bytes().decode("utf-8")

    def read_json(self) -> Any:
        return json.loads(self.read_bytes())

    # ---------------------------------------------------------------- writes

    def mkdir(self) -> None:
        """Create the directory and its parents (S3 has no directories: nothing to do)."""
        if self._s3 is None:
            os.makedirs(self.path, exist_ok=True)

    def write_bytes(self, data: bytes, *, fsync: bool = True) -> None:
        """All-or-nothing write (see the module docstring)."""
        if self._s3 is not None:
            with self.fs.open_output_stream(self.path) as fh:
                fh.write(data)
            return
        path = Path(self.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        with open(tmp, "wb") as fh:
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)

    def create_exclusive(self, data: bytes) -> bool:
        """Create the file with ``data`` unless it exists; True when this call created it, False when it existed
        (then nothing was written). Atomic against concurrent writers (see the module docstring)."""
        if self._s3 is not None:
            return self._s3_put_if_absent(data)
        path = Path(self.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            return True
        finally:
            tmp.unlink(missing_ok=True)

    def create_exclusive_json(self, obj: Any) -> bool:
        return self.create_exclusive((json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())

    def _s3_put_if_absent(self, data: bytes) -> bool:
        from botocore.exceptions import ClientError

        assert self._s3 is not None
        bucket, _, key = self.path.partition("/")
        client = _s3_client(self._s3)
        for attempt in range(CONDITIONAL_CONFLICT_RETRIES + 1):
            try:
                client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
                return True
            except ClientError as exc:
                code = str(exc.response.get("Error", {}).get("Code", ""))
                status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
                if code == "PreconditionFailed" or status == 412:
                    return False
                if (code == "ConditionalRequestConflict" or status == 409) and attempt < CONDITIONAL_CONFLICT_RETRIES:
                    time.sleep(0.1 * (attempt + 1))
                    continue
                raise
        raise AssertionError("unreachable")

    def write_text(self, text: str, *, fsync: bool = True) -> None:
        self.write_bytes(text.encode("utf-8"), fsync=fsync)

    def write_json(self, obj: Any, *, fsync: bool = True) -> None:
        self.write_bytes((json.dumps(obj, indent=2, sort_keys=True) + "\n").encode(), fsync=fsync)

    def unlink(self, missing_ok: bool = True) -> None:
        try:
            self.fs.delete_file(self.path)
        except FileNotFoundError:
            if not missing_ok:
                raise
        except OSError:
            if not missing_ok or self.exists():
                raise

    def rmtree(self) -> None:
        """Delete the directory and everything below it (no error when it does not exist)."""
        if self._s3 is None:
            shutil.rmtree(self.path, ignore_errors=True)
            return
        try:
            self.fs.delete_dir(self.path)
        except FileNotFoundError:
            pass
        except OSError:
            if self.exists():
                raise

    def copy_to(self, target: Loc) -> None:
        if self._s3 is None and target._s3 is None:
            Path(target.path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(self.path, target.path)
        else:
            target.write_bytes(self.read_bytes())


def location(uri: str | os.PathLike[str], s3: S3Settings | None = None) -> Loc:
    """The :class:`Loc` of a local path or an ``s3a://`` / ``s3://`` URI (``s3`` settings required for S3)."""
    text = os.fspath(uri)
    parsed = urlparse(text)
    if parsed.scheme in S3_SCHEMES:
        if not parsed.netloc:
            raise ValueError(f"{text!r}: an S3 URI needs a bucket, e.g. s3a://bucket/prefix")
        return Loc(f"{parsed.netloc}{parsed.path}", s3 or S3Settings())
    if parsed.scheme and parsed.scheme != "file":
        raise ValueError(f"{text!r}: unsupported scheme {parsed.scheme!r} (use a local path or s3a://)")
    return Loc(str(Path(parsed.path if parsed.scheme == "file" else text).absolute()))


def remove_tree(uri: str, endpoint: str | None = None) -> str:
    """Delete everything under ``uri`` (a local path or ``s3a://bucket/key``); S3 credentials and region from the
    environment. The operator's cleanup pod runs this for ``checkpointRetention: Delete``. Returns the URI."""
    loc = location(
        uri, s3_settings_from(None, {**os.environ, **({"TASKSHARD_S3_ENDPOINT": endpoint} if endpoint else {})})
    )
    if loc.is_s3 and loc.path.count("/") < 1:
        raise ValueError(f"{uri!r}: refusing to delete a whole bucket; name a prefix")
    loc.rmtree()
    return loc.uri()


def storage_root(spec: Any, s3: S3Settings | None = None) -> Loc:
    """The storage root of a config's ``storage`` (``path`` or ``s3``)."""
    if spec.s3 is not None:
        prefix = (spec.s3.prefix or "").strip("/")
        return location(f"s3a://{spec.s3.bucket}/{prefix}" if prefix else f"s3a://{spec.s3.bucket}", s3)
    return location(spec.path)


def check_storage(root: Loc) -> None:
    """Raise :class:`StorageProblem` when the storage root cannot be written and read back (a probe object
    ``<root>/.taskshard-probe-<random>``, removed again). Local roots are created when missing."""
    if not root.is_s3:
        try:
            root.mkdir()
            probe = root / f".taskshard-probe-{uuid.uuid4().hex[:8]}"
            probe.write_bytes(b"ok", fsync=False)
            probe.unlink()
        except OSError as exc:
            raise StorageProblem(
                "StorageNotWritable", "storage.path", f"storage.path: {root.uri()!r} is not writable: {exc}"
            ) from None
        return
    settings = root.s3
    assert settings is not None
    bucket = root.path.split("/", 1)[0]
    where = f"bucket {bucket!r} at {settings.endpoint or 'the AWS default endpoint'}"
    probe = root / f".taskshard-probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.write_bytes(b"ok")
        if probe.read_bytes() != b"ok":
            raise OSError("the probe object read back different bytes")
        probe.unlink()
        _check_conditional_writes(root, where)
    except OSError as exc:
        text = str(exc)
        compact = re.sub(r"[\s_]", "", text.lower())
        if "nosuchbucket" in compact or "bucketdoesnotexist" in compact:
            raise StorageProblem(
                "StorageBucketMissing", "storage.s3.bucket", f"storage.s3.bucket: {where} does not exist ({text})"
            ) from None
        denied = ("accessdenied", "invalidaccesskeyid", "signaturedoesnotmatch", "forbidden", "invalidtoken")
        if any(code in compact for code in denied):
            raise StorageProblem(
                "StorageAccessDenied",
                "storage.s3.credentialsSecret",
                f"storage.s3.credentialsSecret: {where} denied access with the configured credentials "
                f"(AWS_ACCESS_KEY_ID {'is set' if settings.access_key else 'is not set'}); check the Secret "
                f"named in storage.s3.credentialsSecret ({text})",
            ) from None
        raise StorageProblem(
            "StorageUnreachable",
            "storage.s3.endpoint",
            f"storage.s3.endpoint: cannot reach {where}: {text}",
        ) from None


def _check_conditional_writes(root: Loc, where: str) -> None:
    """The writer fence's claim, manifests and drain summaries are exclusive creates (a ``PUT`` with
    ``If-None-Match: *``): a store that ignores the condition lets two runtimes hold one writer epoch and replace
    each other's summaries. Create a probe object twice; the second create must be refused, else raise
    ``ConditionalWritesUnsupported`` naming the endpoint before anything is written."""
    probe = root / f".taskshard-probe-conditional-{uuid.uuid4().hex[:8]}"
    try:
        first = probe.create_exclusive(b"1")
        second = probe.create_exclusive(b"2")
    finally:
        probe.unlink()
    if first and not second:
        return
    raise StorageProblem(
        "ConditionalWritesUnsupported",
        "storage.s3.endpoint",
        f"storage.s3.endpoint: {where} accepted a second conditional create of one object (PUT with If-None-Match: "
        "*), so it cannot refuse a second writer of a shard; the runtime needs an S3-compatible store that "
        "honours conditional writes, as AWS S3 and the MinIO the integration tier builds do",
    )

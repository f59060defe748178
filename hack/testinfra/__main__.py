"""``python -m testinfra``: fetch, build and run the integration tests' real components by hand.

python -m testinfra fetch            # jars (Maven Central) + MinIO (Go module proxy) into the caches
python -m testinfra jars             # only the jars; prints the Spark jars, comma separated
python -m testinfra jars --into DIR  # and copies Spark's Kafka connector and s3a jars into DIR (for an image)
python -m testinfra minio-build      # only MinIO
python -m testinfra up [--run-dir D] # a Kafka broker and MinIO on loopback until Ctrl-C; prints the endpoints
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from .jars import JarsUnavailable, ensure_jar_set, kafka_broker_set, spark_jars
from .kafka import KafkaBroker
from .minio import MinioServer, MinioUnavailable, ensure_minio


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testinfra", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("fetch", help="jars and MinIO into the caches")
    jars = sub.add_parser("jars", help="the jars only")
    jars.add_argument("--into", type=Path, default=None, help="also copy the Spark jars into this directory")
    sub.add_parser("minio-build", help="MinIO only")
    up = sub.add_parser("up", help="run a Kafka broker and MinIO until interrupted")
    up.add_argument("--run-dir", type=Path, default=None)
    up.add_argument("--bucket", default="taskshard")
    args = parser.parse_args(argv)
    try:
        if args.cmd in ("fetch", "jars"):
            ensure_jar_set(kafka_broker_set())
            found = spark_jars()
            print(",".join(str(p) for p in found))
            into = getattr(args, "into", None)
            if into is not None:
                into.mkdir(parents=True, exist_ok=True)
                for jar in found:
                    target = into / jar.name
                    if not target.exists():
                        shutil.copy2(jar, target)
                print(f"copied {len(found)} jars into {into}", file=sys.stderr)
        if args.cmd in ("fetch", "minio-build"):
            print(ensure_minio())
        if args.cmd == "up":
            return _up(args.run_dir or Path(tempfile.mkdtemp(prefix="testinfra-")), args.bucket)
    except (JarsUnavailable, MinioUnavailable) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def _up(run_dir: Path, bucket: str) -> int:
    broker = KafkaBroker(run_dir / "kafka")
    minio = MinioServer(run_dir / "minio")
    try:
        broker.start()
        minio.start()
        minio.create_bucket(bucket)
        print(f"KAFKA_BOOTSTRAP={broker.bootstrap_servers}")
        print(f"S3_ENDPOINT={minio.endpoint} S3_BUCKET={bucket}")
        print(f"AWS_ACCESS_KEY_ID={minio.access_key} AWS_SECRET_ACCESS_KEY={minio.secret_key}")
        print(f"logs: {broker.process.log_path} {minio.process.log_path}; Ctrl-C stops both", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        while broker.process.alive() and minio.process.alive():
            time.sleep(1)
        print("a server exited; stopping", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        minio.stop()
        broker.stop()


if __name__ == "__main__":
    sys.exit(main())

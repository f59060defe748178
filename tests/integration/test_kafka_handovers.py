"""Hand-overs on a real Kafka broker with state on MinIO, where positions are hardest to trust:

- subscribe mode (every shard reads every partition), a partition added while a hand-over is under way: a split
  child whose parent never read the new partition starts it at offset 0 (it once crash-looped: Spark wants every
  partition of a subscribed topic named); a merged shard whose right parent never read a partition the left one
  did reads the right parent's key groups there from offset 0 (it once started at the left parent's offset and
  lost them) and skips only what the left parent counted;
- ``partitionedByKey`` (each shard assigns its own partitions): a merge of two parents stopped at different
  times is exact and each partition continues from its own parent's position;
- an S3-compatible store that ignores ``If-None-Match`` (real MinIO behind a gateway that drops the condition) is
  refused at start, naming the endpoint (``ConditionalWritesUnsupported``);
- a runtime paused (SIGSTOP) inside a batch across its successor's claim writes nothing that counts when it
  resumes, and ends fenced without a restart.
"""

from __future__ import annotations

import http.server
import io
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from spark_runtime.storage import StorageProblem, check_storage, location, s3_settings_from
from tests.jvm import integration_jvm_conf

from .test_kafka_s3_shards import Reference, Running, Setup, _nested_source, _own, check_results, make_events

pytestmark = pytest.mark.integration


def merge_from(setup: Setup, left: Running, right: Running) -> list[dict[str, str]]:
    return [{"parent": r.runner.config.shard, "manifest": r.runner.paths.drained.uri()} for r in (left, right)]


def test_subscribed_hand_overs_count_a_partition_a_parent_never_read(spark, kafka_broker, minio, tmp_path):
    """Also the Python processor's runs state layout across a split and a merge on Kafka and S3 (the Python twin
    of the builtin sum: the same reference)."""
    python_sum = {"python": "spark_runtime.engine:SumProcessor", "parameters": {"field": "amount"}}
    setup = Setup(kafka_broker, minio, tmp_path, partitions=1, processor=python_sum)
    rng, ref = random.Random(31), Reference()

    def produce(events: list[dict], partition: int | None = None) -> None:
        kafka_broker.produce(setup.topic_in, events, partition=partition)
        ref.add(events)

    produce(make_events(800, rng))
    parent = Running(setup.config("kt-0-16", 0, 16), spark)
    parent.wait_caught_up(kafka_broker.end_offsets(setup.topic_in))
    summary = parent.finish()
    assert list(summary["positions"][setup.topic_in]) == ["0"]

    # Partition 1 appears after the parent stopped: nobody counted it. The children start it at 0.
    kafka_broker.add_partitions(setup.topic_in, 2)
    produce(make_events(400, rng), partition=1)
    restore = {"parent": "kt-0-16", "manifest": summary["manifest"]}
    left, right = (Running(setup.config(n, a, b, restore), spark) for n, a, b in (("kt-0-8", 0, 8), ("kt-8-16", 8, 16)))
    end = kafka_broker.end_offsets(setup.topic_in)
    right.wait_caught_up(end)
    right_summary = right.finish()

    # Partition 2 appears after the right child stopped; only the left one reads it before it stops too.
    kafka_broker.add_partitions(setup.topic_in, 3)
    produce(make_events(400, rng), partition=2)
    end = kafka_broker.end_offsets(setup.topic_in)
    left.wait_caught_up(end)
    left_summary = left.finish()
    assert "2" not in right_summary["positions"][setup.topic_in] and left_summary["positions"][setup.topic_in]["2"] > 0

    merged = Running(setup.config("kt-0-16-m1", 0, 16, mergeFrom=merge_from(setup, left, right)), spark)
    merged.wait_for(lambda: merged.runner.restore is not None, "the merged shard's restore")
    start = merged.runner.restore.start_positions[setup.topic_in]
    assert start["2"] == 0, "the right parent counted nothing in partition 2: it is read from its start"
    assert merged.runner.restore.skip.keeps(3, 2, 0) is False and merged.runner.restore.skip.keeps(12, 2, 0)
    produce(make_events(600, rng))
    merged.wait_caught_up(kafka_broker.end_offsets(setup.topic_in))
    merged.finish()
    check_results(setup, ref)


def test_a_merge_of_key_partitioned_shards_continues_each_partition_from_its_own_parent(
    spark, kafka_broker, minio, tmp_path
):
    setup, rng, ref = Setup(kafka_broker, minio, tmp_path, partitions=2), random.Random(37), Reference()
    source = _nested_source(setup, 2)  # partition p holds key groups [8p, 8p + 8)
    first = make_events(1000, rng)
    kafka_broker.produce(setup.topic_in, first)
    ref.add(first)
    left, right = (
        Running(setup.config(n, a, b, source=source), spark) for n, a, b in (("kt-0-8", 0, 8), ("kt-8-16", 8, 16))
    )
    end = kafka_broker.end_offsets(setup.topic_in)
    left.wait_caught_up(_own(end, left))
    left_summary = left.finish()  # the left parent stops first ...
    second = make_events(600, rng)
    kafka_broker.produce(setup.topic_in, second)
    ref.add(second)
    right.wait_caught_up(_own(kafka_broker.end_offsets(setup.topic_in), right))
    right_summary = right.finish()  # ... the right one 600 events later
    merged = Running(setup.config("kt-0-16-m1", 0, 16, source=source, mergeFrom=merge_from(setup, left, right)), spark)
    merged.wait_for(lambda: merged.runner.restore is not None, "the merged shard's restore")
    assert merged.runner.restore.start_positions == {
        setup.topic_in: {**left_summary["positions"][setup.topic_in], **right_summary["positions"][setup.topic_in]}
    }
    assert merged.runner.restore.skip is None, "each parent read only its own partitions: nothing to skip"
    third = make_events(500, rng)
    kafka_broker.produce(setup.topic_in, third)
    ref.add(third)
    merged.wait_caught_up(kafka_broker.end_offsets(setup.topic_in))
    merged.finish()
    check_results(setup, ref)


# ---------------------------------------------------------------- a store that ignores conditional writes


class _DropsConditions(http.server.BaseHTTPRequestHandler):
    """An S3 gateway in front of MinIO that forwards every request without ``If-None-Match`` (re-signed with the
    same credentials, so MinIO accepts it): what a store that ignores conditional writes does."""

    upstream: str = ""
    settings: Any = None

    def _forward(self) -> None:
        import http.client

        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        if "chunked" in (self.headers.get("Transfer-Encoding") or ""):
            body = _unchunk(self.rfile)  # HTTP chunked transfer encoding
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if (self.headers.get("x-amz-content-sha256") or "").startswith("STREAMING-"):
            body = _unchunk(io.BytesIO(body))  # aws-chunked: the payload between chunk headers
        url = self.upstream + self.path
        headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "content-md5", "range")}
        request = AWSRequest(method=self.command, url=url, data=body, headers=headers)
        creds = Credentials(self.settings.access_key, self.settings.secret_key)
        S3SigV4Auth(creds, "s3", self.settings.region).add_auth(request)
        target = urllib.parse.urlsplit(self.upstream)
        conn = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
        conn.request(self.command, self.path, body=body, headers=dict(request.headers.items()))
        answer = conn.getresponse()
        data = answer.read()
        self.send_response(answer.status)
        for k, v in answer.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        length = answer.getheader("Content-Length") if self.command == "HEAD" else str(len(data))
        self.send_header("Content-Length", length or "0")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        conn.close()

    do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = _forward

    def log_message(self, *args: Any) -> None:  # quiet
        pass


def test_a_store_that_ignores_conditional_writes_is_refused_naming_the_endpoint(minio):
    direct = location(
        f"s3a://{minio.bucket}/conditional",
        s3_settings_from(None, {"TASKSHARD_S3_ENDPOINT": minio.endpoint, **_env(minio)}),
    )
    check_storage(direct)  # MinIO itself refuses a second conditional create: accepted

    handler = type("Gateway", (_DropsConditions,), {"upstream": minio.endpoint, "settings": direct.s3})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        gateway = location(
            f"s3a://{minio.bucket}/conditional",
            s3_settings_from(None, {"TASKSHARD_S3_ENDPOINT": endpoint, **_env(minio)}),
        )
        probe = gateway / "probe-object"
        assert probe.create_exclusive(b"1") and probe.create_exclusive(b"2"), "the gateway drops the condition"
        probe.unlink()
        with pytest.raises(StorageProblem) as refused:
            check_storage(gateway)
        assert refused.value.reason == "ConditionalWritesUnsupported"
        assert refused.value.field == "storage.s3.endpoint" and endpoint in str(refused.value)
    finally:
        server.shutdown()


def test_a_small_file_read_while_it_is_rewritten_on_s3_is_one_version_whole(minio):
    """A child reads its parent's ``progress.json`` (and a source its ``catch-up.json``) while the writer replaces
    it. A read in ranges once spliced two versions ("Extra data", stray bytes) and failed a catch-up child; one
    ``GET`` returns one version whole."""
    loc = location(
        f"s3a://{minio.bucket}/torn/progress.json",
        s3_settings_from(None, {"TASKSHARD_S3_ENDPOINT": minio.endpoint, **_env(minio)}),
    )

    def version(i: int) -> dict[str, Any]:  # lengths vary, so a splice of two versions is never one of them
        return {"batchId": i, "positions": {"t": {str(p): i * 7 for p in range(1 + i % 5)}}, "pad": "x" * (i % 13)}

    loc.write_json(version(0))
    stop, written = threading.Event(), [0]

    def rewrite() -> None:
        while not stop.is_set():
            written[0] += 1
            loc.write_json(version(written[0]))

    writer = threading.Thread(target=rewrite)
    writer.start()
    try:
        reads = [loc.read_json() for _ in range(600)]
    finally:
        stop.set()
        writer.join(30)
    assert written[0] > 50, "the object was rewritten throughout the reads"
    assert all(r == version(r["batchId"]) for r in reads), "every read is one whole version"
    assert not (loc.parent / "absent.json").exists()
    with pytest.raises(FileNotFoundError):
        (loc.parent / "absent.json").read_bytes()


def _unchunk(stream: Any) -> bytes:
    """The payload of a chunked body (HTTP chunked transfer encoding, or S3's ``aws-chunked``: ``<hex size>[;chunk
    extensions]\\r\\n<data>\\r\\n`` ... a size-0 chunk, then optional trailers and an empty line)."""
    out = b""
    while True:
        size = int(stream.readline().split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while stream.readline().strip():  # trailers
                pass
            return out
        out += stream.read(size)
        stream.readline()


def _env(minio: Any) -> dict[str, str]:
    return {
        "AWS_ACCESS_KEY_ID": minio.access_key,
        "AWS_SECRET_ACCESS_KEY": minio.secret_key,
        "AWS_REGION": minio.region,
    }


# ---------------------------------------------------------------- a zombie paused across the fence claim


def test_a_zombie_paused_mid_batch_across_its_successors_claim_writes_nothing_that_counts(
    spark, spark_jars, kafka_broker, minio, tmp_path
):
    """Runtime A (its own process, state on MinIO, results in a directory sink) stops (SIGSTOP) inside batch 1's
    ``foreachBatch``, after its fence check and before its output: a frozen VM. Runtime B starts on the same
    config, claims epoch 2, replays batch 1 from the offset log and goes on. A resumes (SIGCONT): it writes its
    batch 1 into its own epoch's pending directory, meets the fence before Spark commits the batch, and exits 0
    with a ``fenced`` summary. The results are exact; B's first-commit check of the offset log found A's entry
    for batch 1 equal to its own replay."""
    from spark_runtime.faults import PAUSE_IN_BATCH_ENV
    from spark_runtime.results import final_results

    setup, rng, ref = Setup(kafka_broker, minio, tmp_path, partitions=2), random.Random(41), Reference()
    sink = tmp_path / "out"
    config = setup.config(
        "kt-0-16",
        0,
        16,
        sink={"directory": {"path": str(sink)}},
        spark={
            "triggerInterval": "500 milliseconds",
            "conf": {**integration_jvm_conf(), "spark.taskshard.maxRecordsPerTrigger": "300"},
        },
    )
    first = make_events(900, rng, invalid_every=0)
    kafka_broker.produce(setup.topic_in, first)
    ref.add(first)
    path = tmp_path / "a.json"
    path.write_text(json.dumps(config.to_json_dict()))
    log = open(tmp_path / "a.log", "wb")  # noqa: SIM115 - closed below
    env = {**os.environ, PAUSE_IN_BATCH_ENV: "1", "TASKSHARD_EXTRA_JARS": os.pathsep.join(map(str, spark_jars))}
    zombie = subprocess.Popen(
        [sys.executable, "-m", "spark_runtime", "run", "--config", str(path)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while "pausing (SIGSTOP) in batch 1" not in (tmp_path / "a.log").read_text(errors="replace"):
            assert zombie.poll() is None and time.monotonic() < deadline, (tmp_path / "a.log").read_text()[-3000:]
            time.sleep(0.3)
        time.sleep(0.5)  # the SIGSTOP follows the log line
        with open(f"/proc/{zombie.pid}/stat") as fh:
            assert fh.read().split()[2] == "T", "A is stopped"

        successor = Running(config, spark)
        second = make_events(600, rng, invalid_every=0)
        kafka_broker.produce(setup.topic_in, second)
        ref.add(second)
        successor.wait_caught_up(kafka_broker.end_offsets(setup.topic_in))
        assert successor.runner.fence.epoch == 2

        os.killpg(zombie.pid, signal.SIGCONT)
        assert zombie.wait(timeout=240) == 0, (tmp_path / "a.log").read_text()[-3000:]
        fenced = json.loads(Path(config.termination_message_path).read_text())
        assert (fenced["event"], fenced["reason"], fenced["writerEpoch"]) == ("fenced", "WriterFenced", 1)
        third = make_events(300, rng, invalid_every=0)
        kafka_broker.produce(setup.topic_in, third)
        ref.add(third)
        successor.wait_caught_up(kafka_broker.end_offsets(setup.topic_in))
        summary = successor.finish()
        assert summary["writerEpoch"] == 2
        results = final_results(sink, successor.runner.storage, setup.task)
        assert results == {k: pytest.approx(v) for k, v in ref.sums.items()}
    finally:
        try:
            os.killpg(zombie.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        log.close()

"""The whole product with Kafka and S3: the operator on a real local control plane, shard pods that read a real
Kafka topic, write a Kafka topic and keep every checkpoint, snapshot and manifest in MinIO with credentials from
a Secret named in the Task; a split by ``kubectl patch``; per-key results equal a plain-Python reference.

The shard pods get Spark's Kafka connector and hadoop-aws through ``spec.spark.env`` (``TASKSHARD_EXTRA_JARS``),
as an image without the jars baked in would.
"""

from __future__ import annotations

import json
import os
import random
import uuid
from collections import defaultdict

import pytest
import yaml

from spark_runtime.results import final_results_from_records, read_lineage
from spark_runtime.storage import S3Settings, location
from tests.cluster.conftest import kube_cluster, kubectl, namespace  # noqa: F401 - fixtures
from tests.cluster.operator_fixtures import apply, operator_crds, operator_process, wait_phases  # noqa: F401
from tests.jvm import integration_jvm_conf
from tests.waiting import get_json, wait_for

pytestmark = pytest.mark.integration

START = 420  # seconds: JVMs, restore and first batches of three shards on a loaded 2-core machine


def test_operator_splits_a_kafka_to_kafka_task_with_state_on_s3(
    kubectl,  # noqa: F811
    operator_process,  # noqa: F811
    kafka_broker,
    minio,
    spark_jars,
):
    tag = uuid.uuid4().hex[:6]
    task, topic_in, topic_out, prefix = f"ks-{tag}", f"e2e-in-{tag}", f"e2e-out-{tag}", f"e2e-{tag}"
    kafka_broker.create_topic(topic_in, 3)
    kafka_broker.create_topic(topic_out, 2)
    kubectl(
        "apply",
        "-f",
        "-",
        input=yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "minio-creds"},
                "stringData": {"AWS_ACCESS_KEY_ID": minio.access_key, "AWS_SECRET_ACCESS_KEY": minio.secret_key},
            }
        ),
    )
    kafka = {"bootstrapServers": kafka_broker.bootstrap_servers}
    apply(
        kubectl,
        {
            "apiVersion": "taskshard.io/v1alpha1",
            "kind": "Task",
            "metadata": {"name": task},
            "spec": {
                "maxKeyGroups": 16,
                "initialShards": 1,
                "processor": {"builtin": "count"},
                "source": {"kafka": {**kafka, "topic": topic_in}},
                "sink": {"kafka": {**kafka, "topic": topic_out}},
                "storage": {
                    "s3": {
                        "bucket": minio.bucket,
                        "prefix": prefix,
                        "endpoint": minio.endpoint,
                        "credentialsSecret": "minio-creds",
                    }
                },
                "spark": {
                    "image": "taskshard/shard:test",
                    "conf": {
                        **integration_jvm_conf(),
                        "spark.sql.shuffle.partitions": "2",
                        "spark.ui.enabled": "false",
                    },
                    "env": [{"name": "TASKSHARD_EXTRA_JARS", "value": os.pathsep.join(map(str, spark_jars))}],
                    "triggerInterval": "1 second",
                },
            },
        },
    )
    rng = random.Random(1)
    reference: dict[str, int] = defaultdict(int)

    def produce(n: int) -> None:
        events = [{"key": f"k{rng.randrange(200)}", "i": i} for i in range(n)]
        kafka_broker.produce(topic_in, events)
        for e in events:
            reference[e["key"]] += 1

    def results() -> dict[str, int]:
        values = [r.value for r in kafka_broker.consume_all(topic_out)]
        settings = S3Settings(minio.endpoint, minio.region, minio.access_key, minio.secret_key)
        lineage = read_lineage(location(f"s3a://{minio.bucket}/{prefix}", settings), task)
        return {k: int(v) for k, v in final_results_from_records(values, lineage).items()}

    produce(2000)
    parent = f"{task}-0-16"
    wait_phases(kubectl, {parent: "Running"}, START, operator_process)
    wait_for(lambda: results() == reference, START, "the parent's results to equal the reference", interval=3)

    produce(1000)  # arrives around the split: the children (or the parent) count it, never both
    kubectl("patch", "taskshard", parent, "--type=merge", "-p", json.dumps({"spec": {"split": {"requested": True}}}))
    children = {f"{task}-0-8": "Running", f"{task}-8-16": "Running"}
    wait_phases(kubectl, {parent: "Split", **children}, START, operator_process)
    produce(1000)
    wait_for(lambda: results() == reference, START, "per-key results after the split to equal the reference", 3)

    # The parent's manifest is on S3 and the children restored from it at its committed Kafka offsets. They were
    # created on standby, pointed at the parent's drain summary, which names that manifest.
    final = (get_json(kubectl, "taskshard", parent).get("status") or {}).get("finalCheckpoint") or {}
    manifest_uri = final.get("manifest", "")
    assert manifest_uri.startswith(f"s3a://{minio.bucket}/{prefix}/{task}/shards/{parent}/snapshots/")
    settings = S3Settings(minio.endpoint, minio.region, minio.access_key, minio.secret_key)
    manifest = location(manifest_uri, settings).read_json()
    assert set(manifest["positions"]) == {topic_in}
    for child in children:
        spec = get_json(kubectl, "taskshard", child)["spec"]
        summary_uri = f"s3a://{minio.bucket}/{prefix}/{task}/shards/{parent}/drained.json"
        assert spec["restoreFrom"] == {"parent": parent, "manifest": summary_uri}
        assert location(summary_uri, settings).read_json()["manifest"] == manifest_uri
        lineage = location(f"s3a://{minio.bucket}/{prefix}/{task}/shards/{child}/lineage.json", settings).read_json()
        assert lineage["parentBatchId"] == manifest["batchId"]
        assert lineage["restoreManifest"] == manifest_uri

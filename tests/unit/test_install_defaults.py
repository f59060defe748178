"""The release's defaults for a Task's open fields: filled in where they apply, never over the Task's own."""

from __future__ import annotations

import pytest

from taskshard_operator.cache import parse_task
from taskshard_operator.install_defaults import InstallDefaults

from .manifest_cases import base_task, merge_patch

pytestmark = pytest.mark.unit

DEFAULTS = InstallDefaults.from_env(
    {
        "TASKSHARD_DEFAULT_SHARD_SERVICE_ACCOUNT": "taskshard-shard",
        "TASKSHARD_DEFAULT_SHARD_SERVICE_ACCOUNT_NAMESPACES": "team-a, team-b",
        "TASKSHARD_DEFAULT_S3_ENDPOINT": "http://minio:9000",
        "TASKSHARD_DEFAULT_S3_CREDENTIALS_SECRET": "s3-creds",
    }
)
S3 = {"storage": {"path": None, "volume": None, "s3": {"bucket": "state"}}}


def task(namespace: str, patch: dict | None = None) -> dict:
    body = merge_patch(base_task(), {"spec": patch or {}})
    body["metadata"]["namespace"] = namespace
    return body


def test_open_fields_are_filled_and_the_tasks_own_values_win():
    spec = parse_task(task("team-a", S3), DEFAULTS).spec
    assert spec.spark.service_account_name == "taskshard-shard"
    assert (spec.storage.s3.endpoint, spec.storage.s3.credentials_secret) == ("http://minio:9000", "s3-creds")
    own = {
        "spark": {"serviceAccountName": "mine"},
        "storage": {
            **S3["storage"],
            "s3": {"bucket": "state", "endpoint": "https://s3.example.com", "credentialsSecret": "theirs"},
        },
    }
    spec = parse_task(task("team-a", own), DEFAULTS).spec
    assert spec.spark.service_account_name == "mine"
    assert (spec.storage.s3.endpoint, spec.storage.s3.credentials_secret) == ("https://s3.example.com", "theirs")


def test_the_shard_account_applies_only_where_the_chart_created_it():
    assert parse_task(task("elsewhere"), DEFAULTS).spec.spark.service_account_name is None
    assert parse_task(task("team-b"), DEFAULTS).spec.spark.service_account_name == "taskshard-shard"
    assert parse_task(task("team-b"), InstallDefaults()).spec.spark.service_account_name is None


def test_a_new_default_rolls_the_shards_and_no_default_keeps_the_hash():
    plain = parse_task(task("team-a"), InstallDefaults()).template_hash
    assert parse_task(task("elsewhere"), DEFAULTS).template_hash == plain
    assert parse_task(task("team-a"), DEFAULTS).template_hash != plain

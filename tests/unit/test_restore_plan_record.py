"""The restore plan a successor records at its first start (``restore-plan.json``) and reads after its first
commit instead of its parents' snapshots (:func:`spark_runtime.snapshot.restore.recorded_plan`)."""

from __future__ import annotations

import json

import pytest

from spark_runtime.engine.schema import StateSchema
from spark_runtime.protocol import SkipRule
from spark_runtime.snapshot.manifest import RestoreError
from spark_runtime.snapshot.restore import ParentSlice, RestorePlan, recorded_plan
from spark_runtime.storage import location

pytestmark = pytest.mark.unit


def merged_plan(tmp_path) -> RestorePlan:
    slices = [
        ParentSlice("t-0-8", str(tmp_path / "a" / "manifest.json"), {"batchId": 4, "watermarkMs": 10}, 0, 8),
        ParentSlice("t-8-16", str(tmp_path / "b" / "manifest.json"), {"batchId": 2, "watermarkMs": 7}, 8, 16),
    ]
    seeds = [(location(tmp_path / "a" / "state"), 0, 8), (location(tmp_path / "b" / "state"), 8, 16)]
    skip = SkipRule(((8, ((0, 120), (1, 98))), (16, ())))
    schema = StateSchema.from_json({"columns": "total double default 0.0, seen bigint", "retired": ["old"]})
    return RestorePlan(
        slices,
        {"p0.jsonl": 100, "p1.jsonl": 90},
        {"slices": seeds, "report_dir": location(tmp_path / "me" / "restore")},
        skip,
        schema,
    )


def manifests_of(plan: RestorePlan) -> list:
    return [(s.parent, location(s.manifest_uri)) for s in plan.slices]


def test_a_committed_successor_reads_back_exactly_the_plan_it_recorded(tmp_path):
    plan = merged_plan(tmp_path)
    record = location(tmp_path / "me" / "restore-plan.json")
    record.write_json(plan.to_json())
    back = recorded_plan(record, 3, manifests_of(plan), None, location(tmp_path / "me" / "restore"))
    assert back is not None
    assert back.slices == plan.slices and back.start_positions == plan.start_positions
    assert back.skip == plan.skip and back.boundary == 8
    assert back.schema is not None and back.schema.to_json() == plan.schema.to_json()
    assert [(d.uri(), a, b) for d, a, b in back.seed_options["slices"]] == [
        (d.uri(), a, b) for d, a, b in plan.seed_options["slices"]
    ]
    assert back.to_json() == json.loads(json.dumps(plan.to_json()))


def test_the_record_is_not_used_before_the_first_commit_without_a_record_or_for_other_manifests(tmp_path):
    plan = merged_plan(tmp_path)
    record = location(tmp_path / "me" / "restore-plan.json")
    report = location(tmp_path / "me" / "restore")
    assert recorded_plan(record, 3, manifests_of(plan), None, report) is None, "no record"
    record.write_json(plan.to_json())
    assert recorded_plan(record, -1, manifests_of(plan), None, report) is None, "not committed: plan again"
    other = [("t-0-8", location(tmp_path / "a" / "other.json")), manifests_of(plan)[1]]
    assert recorded_plan(record, 3, other, None, report) is None, "planned from other manifests"


def test_an_unreadable_record_names_the_file_and_the_reason(tmp_path):
    plan = merged_plan(tmp_path)
    record = location(tmp_path / "me" / "restore-plan.json")
    record.write_json({**plan.to_json(), "version": 99})
    with pytest.raises(RestoreError) as refused:
        recorded_plan(record, 3, manifests_of(plan), None, location(tmp_path / "me" / "restore"))
    assert refused.value.reason == "RestorePlanUnreadable"
    assert "restore-plan.json" in str(refused.value) and "version 99" in str(refused.value)

"""Offline checks of the generated CRDs: no drift from the models, structural schemas, descriptions, CEL."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from taskshard_operator.models.crd import build_crds, render_crds

from .manifest_cases import CRDS_DIR, ROOT

pytestmark = pytest.mark.unit

EXPECTED_FILES = {"taskshard.io_tasks.yaml", "taskshard.io_taskshards.yaml"}
VALUE_KEYS = {"x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields"}
ALLOWED_KEYS = {
    "type", "description", "properties", "required", "items", "additionalProperties", "enum", "default",
    "minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems", "maxProperties", "pattern",
    "format", "anyOf", "x-kubernetes-validations", "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
}  # fmt: skip


def _schemas():
    for name, crd in build_crds().items():
        (version,) = crd["spec"]["versions"]
        yield name, version["schema"]["openAPIV3Schema"]


def _walk(node, path="<root>"):
    """Yield (path, schema node) for every node of a schema."""
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from _walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}{{}}")


def test_crds_on_disk_match_the_models():
    rendered = render_crds()
    assert set(rendered) == EXPECTED_FILES
    for name, text in rendered.items():
        path = CRDS_DIR / name
        assert path.exists(), f"{path} missing: run python hack/gen_crds.py"
        assert path.read_text(encoding="utf-8") == text, f"{path} drifted: run python hack/gen_crds.py"


def test_generator_check_mode_passes():
    result = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "gen_crds.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_generator_check_mode_fails_on_drift(tmp_path):
    (tmp_path / "taskshard.io_tasks.yaml").write_text("stale\n")
    result = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "gen_crds.py"), "--check", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1 and "stale" in result.stderr


def test_every_property_has_a_description():
    """Every schema node has one, except metadata (the apiserver forbids anything there but its type and
    restrictions of the name)."""
    missing = [
        f"{name}:{path}"
        for name, schema in _schemas()
        for path, node in _walk(schema)
        if not node.get("description") and not path.startswith("<root>.metadata")
    ]
    assert not missing, missing


def test_schemas_are_structural():
    for name, schema in _schemas():
        for path, node in _walk(schema):
            where = f"{name}:{path}"
            assert set(node) <= ALLOWED_KEYS, (where, set(node) - ALLOWED_KEYS)
            assert "type" in node or VALUE_KEYS & set(node), f"{where}: no type"
            if "anyOf" in node:
                assert node.get("x-kubernetes-int-or-string"), f"{where}: anyOf outside int-or-string"
            assert not ("properties" in node and "additionalProperties" in node), where
            if node.get("type") == "object" and "properties" not in node:
                assert (
                    "additionalProperties" in node
                    or node.get("x-kubernetes-preserve-unknown-fields")
                    or path.endswith(".metadata")
                ), where
            for req in node.get("required", []):
                assert req in node.get("properties", {}), f"{where}: required {req} is not a property"


def _iterated(node: dict, rule: str) -> list[tuple[str, dict]]:
    """The schema nodes a rule iterates: ``self.a.b.all(`` / ``.exists(`` / ``.exists_one(`` / ``.filter(``
    resolved from ``node`` through ``properties``; a bare ``self.all(`` is the node itself."""
    found = []
    for match in re.finditer(r"\bself((?:\.\w+)*)\.(?:all|exists|exists_one|filter)\(", rule):
        target = node
        for name in match.group(1).split(".")[1:]:
            target = target["properties"][name]
        found.append((f"self{match.group(1)}", target))
    return found


def test_every_string_list_and_map_is_bounded_where_cel_reads_it():
    """CEL cost: every map or list a rule iterates needs maxProperties/maxItems on it."""
    checked = 0
    for name, schema in _schemas():
        for path, node in _walk(schema):
            for rule in node.get("x-kubernetes-validations", []):
                for what, target in _iterated(node, rule["rule"]):
                    checked += 1
                    assert "maxProperties" in target or "maxItems" in target, f"{name}:{path}: {what}"
    assert checked >= 10


def test_cel_rules_have_messages_naming_a_field():
    rules = [
        (name, path, rule) for name, schema in _schemas() for path, node in _walk(schema)
        for rule in node.get("x-kubernetes-validations", [])
    ]  # fmt: skip
    assert len(rules) >= 15
    for name, path, rule in rules:
        assert set(rule) <= {"rule", "message", "fieldPath", "reason", "messageExpression"}, (name, path)
        assert rule["message"] and any(f in rule["message"] for f in ("spec.", "status.", "keyGroups.")), (name, path)
        if rule.get("reason"):
            assert rule["reason"] in {
                "FieldValueInvalid",
                "FieldValueRequired",
                "FieldValueForbidden",
                "FieldValueDuplicate",
            }


def test_transition_rules_cover_the_immutable_fields():
    immutable = {
        (name, path) for name, schema in _schemas() for path, node in _walk(schema)
        for rule in node.get("x-kubernetes-validations", []) if "oldSelf" in rule["rule"]
    }  # fmt: skip
    tasks, shards = "taskshard.io_tasks.yaml", "taskshard.io_taskshards.yaml"
    assert {
        (tasks, "<root>.spec.maxKeyGroups"),
        (tasks, "<root>.spec.initialShards"),  # scale by splitting, not by re-tiling a live Task
        (tasks, "<root>.spec.keyField"),
        (tasks, "<root>.spec.storage"),
        (tasks, "<root>.spec.source"),  # no journal <-> kafka switch with partitionedByKey
        (tasks, "<root>.spec.source.journal"),  # partitionedByKey, and partitions with it
        (tasks, "<root>.spec.source.kafka"),
        (tasks, "<root>.spec"),  # eventTime present or absent for good (the checkpoints keep their time mode)
        (shards, "<root>.spec.keyGroups"),
        (shards, "<root>.spec.taskRef"),
        (shards, "<root>.spec.restoreFrom"),
        (shards, "<root>.spec.mergeFrom"),
        (shards, "<root>.spec"),
    } == immutable


def test_names_printer_columns_and_subresources():
    crds = build_crds()
    task = crds["taskshard.io_tasks.yaml"]["spec"]
    shard = crds["taskshard.io_taskshards.yaml"]["spec"]
    assert (task["group"], task["scope"], task["names"]["plural"], task["names"]["shortNames"]) == (
        "taskshard.io", "Namespaced", "tasks", ["tsk"],
    )  # fmt: skip
    assert (shard["names"]["kind"], shard["names"]["plural"], shard["names"]["shortNames"]) == (
        "TaskShard", "taskshards", ["tss"],
    )  # fmt: skip
    for spec in (task, shard):
        (version,) = spec["versions"]
        assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
        assert all(col.get("description") for col in version["additionalPrinterColumns"])
    assert shard["versions"][0]["subresources"] == {"status": {}}
    # kubectl scale task NAME --replicas N sets spec.shards; it reads back the active shards and the pods' selector
    assert task["versions"][0]["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.shards",
            "statusReplicasPath": ".status.shards",
            "labelSelectorPath": ".status.selector",
        },
    }
    columns = lambda spec: [c["name"] for c in spec["versions"][0]["additionalPrinterColumns"] if not c.get("priority")]  # noqa: E731
    assert columns(task) == ["Shards", "Desired", "Phase", "Ready", "Rate", "Lag", "Age"]
    desired = next(c for c in task["versions"][0]["additionalPrinterColumns"] if c["name"] == "Desired")
    assert desired["jsonPath"] == ".spec.shards"
    assert columns(shard) == ["Task", "Range", "Phase", "Ready", "Rate", "Lag", "Last Batch", "Age"]
    paths = {c["name"]: c["jsonPath"] for c in shard["versions"][0]["additionalPrinterColumns"]}
    assert paths["Last Batch"] == ".status.live.batchId" and paths["Rate"] == ".status.live.rate"


def test_crd_files_are_plain_yaml_documents():
    for name in EXPECTED_FILES:
        docs = list(yaml.safe_load_all((CRDS_DIR / name).read_text(encoding="utf-8")))
        assert len(docs) == 1 and docs[0]["kind"] == "CustomResourceDefinition"
        assert "&id" not in (CRDS_DIR / name).read_text(encoding="utf-8"), "YAML anchors in a CRD"

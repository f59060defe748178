"""Every value in the chart's values.yaml does something: a template reads it (or a whole object above it, as
``toYaml .Values.podSecurityContext`` does), so no value a user sets is silently ignored."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.unit

CHART = Path(__file__).resolve().parents[2] / "charts" / "taskshard-operator"


def leaf_paths(values: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Dotted paths of the leaves (a list or an empty object is a leaf: it is set as a whole)."""
    if isinstance(values, dict) and values:
        return [p for k, v in values.items() for p in leaf_paths(v, (*prefix, k))]
    return [prefix]


def read_by_templates(path: tuple[str, ...], templates: str) -> bool:
    """A template reads ``.Values.<path>`` or one of its ancestors as a whole (not only as a step to a child)."""
    for n in range(len(path), 0, -1):
        dotted = re.escape(".".join(path[:n]))
        if re.search(rf"\.Values\.{dotted}(?![\w.])", templates):
            return True
    return False


def test_every_value_is_read_by_a_template():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    templates = "\n".join(p.read_text() for p in sorted((CHART / "templates").iterdir()) if p.is_file())
    unread = [".".join(p) for p in leaf_paths(values) if not read_by_templates(p, templates)]
    assert not unread, f"values.yaml sets values no template reads: {unread}"


def test_the_check_finds_a_value_nothing_reads():
    templates = "{{ .Values.storage.s3.endpoint }} {{ toYaml .Values.podSecurityContext }}"
    assert read_by_templates(("storage", "s3", "endpoint"), templates)
    assert read_by_templates(("podSecurityContext", "runAsUser"), templates)
    assert not read_by_templates(("storage", "s3", "bucket"), templates)

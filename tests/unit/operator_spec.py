"""The small Task spec the operator's unit tests build their worlds from (one definition for all of them)."""

from __future__ import annotations

from typing import Any

NS = "ns"
SPEC: dict[str, Any] = {
    "maxKeyGroups": 16,
    "initialShards": 1,
    "processor": {"builtin": "count"},
    "source": {"journal": {"path": "/data/journal/t", "partitions": 2}},
    "sink": {"directory": {"path": "/data/out/t"}},
    "storage": {"path": "/data/state", "volume": {"hostPath": "/tmp/x"}},
    "spark": {"image": "img:1"},
}

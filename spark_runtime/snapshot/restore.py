"""A split child's restore: check the parent's manifest, verify the child's slice, and plan the seed.

Before anything is processed, a child restoring from its parent's snapshot refuses (with
:class:`~spark_runtime.snapshot.manifest.RestoreError`, exit 2, the reason on the TaskShard):

- a manifest of another task or shard, another ``maxKeyGroups``, a range outside the parent's, or another
  state format or schema (:func:`~spark_runtime.snapshot.manifest.check_restore`);
- positions its source cannot start from (the source's ``validate_positions``);
- a slice whose files differ from what the manifest lists (:func:`~spark_runtime.snapshot.manifest.verify_snapshot`).

Then the child's query starts at the parent's positions (only the partitions it reads) and its first batch
seeds its state store with the slice (:mod:`spark_runtime.sources.seed`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from spark_runtime.snapshot.manifest import check_restore, load_manifest, verify_snapshot
from spark_runtime.storage import Loc, S3Settings, location

__all__ = ["RestorePlan", "plan_restore"]

log = logging.getLogger("taskshard.shard")


@dataclass(frozen=True)
class RestorePlan:
    """What a verified restore starts from."""

    manifest_uri: str
    manifest: dict[str, Any]
    start_positions: dict[str, Any]
    """The parent's positions, nested: only the partitions this shard reads."""
    seed_options: dict[str, Any]
    """The keyword arguments of :func:`spark_runtime.sources.seed.seed_stream` except ``mode``/``schema_ddl``."""


def plan_restore(
    config: Any, plan: Any, source: Any, manifest_uri: str, s3: S3Settings | None, report_dir: Loc
) -> RestorePlan:
    """Check and verify the restore of ``config``'s range from the manifest at ``manifest_uri`` (see the module
    docstring); ``plan`` is the shard's :class:`spark_runtime.pipeline.Plan`, ``source`` its source."""
    manifest = load_manifest(location(manifest_uri, s3))
    assert config.restore_from is not None
    kg = config.key_groups
    check_restore(
        manifest,
        task=config.task,
        parent=config.restore_from.parent,
        max_key_groups=config.max_key_groups,
        start=kg.start,
        end=kg.end,
        state_format=plan.state_format,
        state_schema=plan.state_schema,
    )
    own_positions = source.validate_positions(manifest["positions"])
    state_dir = location(manifest["snapshot"]["path"], s3)
    verified = verify_snapshot(manifest, state_dir, kg.start, kg.end)
    log.info("shard %s: snapshot slice verified against the manifest: %s", config.shard, verified)
    return RestorePlan(
        manifest_uri=manifest_uri,
        manifest=manifest,
        start_positions=own_positions,
        seed_options={"state_dir": state_dir, "start": kg.start, "end": kg.end, "report_dir": report_dir},
    )

"""A child's restore: check its parents' manifests, verify its slices, and plan the seed.

A split child restores the slice of its range from its parent's snapshot; a merged child restores the whole
range of each of its two parents from that parent's snapshot (key-group-indexed snapshots union naturally).
Before anything is processed, a child refuses (with :class:`~spark_runtime.snapshot.manifest.RestoreError`,
exit 2, the reason on the TaskShard):

- a manifest of another task or shard, another ``maxKeyGroups``, a range outside the parent's, or another
  state format or schema (:func:`~spark_runtime.snapshot.manifest.check_restore`);
- for a merge, parents whose ranges are not adjacent or do not make up exactly the child's range
  (``MergeRangesMismatch``);
- positions its source cannot start from (the source's ``validate_positions``);
- a slice whose files differ from what the manifest lists (:func:`~spark_runtime.snapshot.manifest.verify_snapshot`).

Then the child's query starts at its parent's positions (only the partitions it reads; for a merge, the lower
of the two parents' positions with a :class:`~spark_runtime.protocol.SkipRule` for the rows one parent already
counted) and its first batch seeds its state store with the slices (:mod:`spark_runtime.sources.seed`).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from spark_runtime.protocol import SkipRule, lowest_positions
from spark_runtime.snapshot.manifest import RestoreError, check_restore, load_manifest, verify_snapshot
from spark_runtime.sources import GainsPartitions
from spark_runtime.storage import Loc, S3Settings, location

__all__ = ["ParentSlice", "RestorePlan", "counted_up_to", "plan_restore", "start_and_skip"]

log = logging.getLogger("taskshard.shard")


@dataclass(frozen=True)
class ParentSlice:
    """One parent's part of a restore: its manifest and the key groups ``[start, end)`` taken from it."""

    parent: str
    manifest_uri: str
    manifest: dict[str, Any]
    start: int
    end: int


@dataclass(frozen=True)
class RestorePlan:
    """What a verified restore starts from."""

    slices: list[ParentSlice]
    """One per parent, by ascending key groups."""
    start_positions: dict[str, Any]
    """The parents' positions, nested: only the partitions this shard reads (a merge: the lower of the two)."""
    seed_options: dict[str, Any]
    """The keyword arguments of :func:`spark_runtime.sources.seed.seed_stream` except ``mode``/``schema_ddl``."""
    skip: SkipRule | None = None
    """What the child skips: a merge whose parents stopped at different positions of a partition, or a child of
    a shard that had a rule itself (None: nothing). The child's manifests carry it on."""
    schema: Any = None
    """A Python processor's state schema evolved from its parents' (with their retired names; None: builtins)."""

    @property
    def boundary(self) -> int | None:
        """A merge's first key group of its right parent (None: one parent)."""
        return self.slices[1].start if len(self.slices) > 1 else None

    @property
    def manifest_uri(self) -> str:
        return self.slices[0].manifest_uri if len(self.slices) == 1 else ", ".join(s.manifest_uri for s in self.slices)


def plan_restore(
    config: Any,
    plan: Any,
    source: Any,
    manifests: list[tuple[str, Loc]],
    s3: S3Settings | None,
    report_dir: Loc,
    *,
    resumed: bool = False,
) -> RestorePlan:
    """Check and verify the restore of ``config``'s range from ``manifests`` (``(parent, manifest)``: one for a
    split child, two for a merge; see the module docstring); ``plan`` is the shard's
    :class:`spark_runtime.pipeline.Plan`, ``source`` its source. ``resumed``: the child committed batches of its
    own, so its processor is checked against its own state (the shard's record), not against its parents'."""
    kg = config.key_groups
    merge = len(manifests) > 1
    slices = []
    schema = plan.schema
    for parent, uri in manifests:
        manifest = load_manifest(uri)
        own = manifest.get("keyGroups") or {}
        start, end = (int(own.get("start", -1)), int(own.get("end", -1))) if merge else (kg.start, kg.end)
        evolved = check_restore(
            manifest,
            task=config.task,
            parent=parent,
            max_key_groups=config.max_key_groups,
            start=start,
            end=end,
            state_format=plan.state_format,
            state_schema=plan.state_schema,
            schema=plan.schema,
            check_processor=not resumed,
        )
        if evolved is not None:  # a merge: the retired names of both parents
            schema = dataclasses.replace(evolved, retired=evolved.retired | schema.retired)
        slices.append(ParentSlice(parent, uri.uri(), manifest, start, end))
    slices.sort(key=lambda s: s.start)
    if merge:
        check_merge_ranges(slices, kg.start, kg.end)
    start_positions, skip = start_and_skip(source, slices)
    seeds = []
    for s in slices:
        state_dir = location(s.manifest["snapshot"]["path"], s3)
        verified = verify_snapshot(s.manifest, state_dir, s.start, s.end)
        log.info("shard %s: slice [%d, %d) of %s verified: %s", config.shard, s.start, s.end, s.parent, verified)
        seeds.append((state_dir, s.start, s.end))
    if skip is not None:
        log.info("shard %s: merge skip rule (range end, {partition: first offset}): %s", config.shard, skip.to_json())
    return RestorePlan(slices, start_positions, {"slices": seeds, "report_dir": report_dir}, skip, schema)


def check_merge_ranges(slices: list[ParentSlice], start: int, end: int) -> None:
    """Raise ``MergeRangesMismatch`` unless the parents' ranges (sorted) are adjacent and make up ``[start, end)``."""
    at = start
    for s in slices:
        if s.start != at:
            ranges = ", ".join(f"{p.parent} [{p.start}, {p.end})" for p in slices)
            raise RestoreError(
                f"mergeFrom: the parents' ranges {ranges} do not make up keyGroups [{start}, {end}) without gap or "
                f"overlap (key group {min(at, s.start)} is {'missing' if s.start > at else 'in two parents'}); a "
                "merge joins two adjacent shards into one over exactly their ranges",
                reason="MergeRangesMismatch",
            )
        at = s.end
    if at != end:
        raise RestoreError(
            f"mergeFrom: the parents' ranges end at key group {at}, not at keyGroups.end {end}",
            reason="MergeRangesMismatch",
        )


def start_and_skip(source: Any, slices: list[ParentSlice]) -> tuple[dict[str, Any], SkipRule | None]:
    """Where a child of ``slices``' parents (by ascending key groups) starts, and what it skips (None: nothing).

    A parent ``P`` counted the rows of key group ``g`` in partition ``p`` below ``C_P(g, p)``: its final position
    ``F_P[p]``, or higher where ``P``'s own restore skipped rows an ancestor had counted (its manifest's ``skip``).
    The child starts each partition at the lowest of its parents' final positions and skips, per key group, the
    rows below ``C_owner(g, p)`` (:class:`~spark_runtime.protocol.SkipRule`). A split child of a parent without a
    rule starts at ``F_P`` and skips nothing."""
    finals = [s.manifest["positions"] for s in slices]
    if isinstance(source, GainsPartitions):  # a partition a parent never read: it counted nothing there
        finals = source.counted_nothing_filled(finals)
    start = source.validate_positions(lowest_positions(finals))
    owners: list[tuple[int, dict[int, int]]] = []
    for s, positions in zip(slices, finals, strict=True):
        inherited = s.manifest.get("skip")
        owners += counted_up_to(
            s.start,
            s.end,
            source.partition_offsets(positions),
            SkipRule.from_json(inherited) if inherited else None,
        )
    rule = SkipRule.of(owners, source.partition_offsets(start))
    return start, None if rule.skips_nothing else rule


def counted_up_to(
    start: int, end: int, finals: dict[int, int], inherited: SkipRule | None
) -> list[tuple[int, dict[int, int]]]:
    """``C_P`` of a parent over key groups ``[start, end)`` as ``[(range end, {partition: offset})]``: its final
    offsets ``finals``, raised where its ``inherited`` rule skips further."""
    if inherited is None:
        return [(end, dict(finals))]
    out: list[tuple[int, dict[int, int]]] = []
    at = start
    for owner_end, ahead in inherited.owners:
        if owner_end <= at:
            continue
        upto = dict(finals)
        for partition, offset in ahead:
            upto[partition] = max(upto.get(partition, -1), offset)
        at = min(owner_end, end)
        out.append((at, upto))
        if at >= end:
            break
    if at < end:
        out.append((end, dict(finals)))
    return out

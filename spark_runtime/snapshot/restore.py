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

The verified plan is recorded in the child's own storage (``restore-plan.json``, :func:`recorded_plan`); once the
child has committed a batch, every later start uses the record and never reads its parents' storage again.

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

__all__ = ["ParentSlice", "RestorePlan", "counted_up_to", "plan_restore", "recorded_plan", "start_and_skip"]

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

    def to_json(self) -> dict[str, Any]:
        """The record a successor keeps in its own storage (``restore-plan.json``, :func:`recorded_plan`)."""
        return {
            "version": PLAN_RECORD_VERSION,
            "slices": [
                {
                    "parent": p.parent,
                    "manifestUri": p.manifest_uri,
                    "manifest": p.manifest,
                    "start": p.start,
                    "end": p.end,
                }
                for p in self.slices
            ],
            "startPositions": self.start_positions,
            "seedSlices": [[d.uri(), int(a), int(b)] for d, a, b in self.seed_options["slices"]],
            "skip": self.skip.to_json() if self.skip is not None else None,
            "schema": self.schema.to_json() if self.schema is not None else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], s3: S3Settings | None, report_dir: Loc) -> RestorePlan:
        if data.get("version") != PLAN_RECORD_VERSION:
            raise ValueError(f"restore-plan.json: version {data.get('version')!r}, expected {PLAN_RECORD_VERSION}")
        slices = [
            ParentSlice(s["parent"], s["manifestUri"], s["manifest"], int(s["start"]), int(s["end"]))
            for s in data["slices"]
        ]
        seeds = [(location(uri, s3), int(a), int(b)) for uri, a, b in data["seedSlices"]]
        schema = None
        if data.get("schema") is not None:
            from spark_runtime.engine.schema import StateSchema

            schema = StateSchema.from_json(data["schema"])
        skip = SkipRule.from_json(data["skip"]) if data.get("skip") else None
        return cls(slices, dict(data["startPositions"]), {"slices": seeds, "report_dir": report_dir}, skip, schema)


PLAN_RECORD_VERSION = 1
"""The version of ``restore-plan.json`` (:meth:`RestorePlan.to_json`)."""


def recorded_plan(
    record: Loc, committed: int, manifests: list[tuple[str, Loc]], s3: S3Settings | None, report_dir: Loc
) -> RestorePlan | None:
    """The restore plan a successor recorded at its first start from the same ``manifests`` (``(parent,
    manifest)``, as :func:`plan_restore` takes them), once it has committed a batch of its own (``committed >=
    0``): from then on its state is in its own recovery log, and its start positions, skip rule, watermark floor,
    evolved schema and its parents' manifests' facts are all in the record, so a later start (a restart, a
    template roll, an eviction) never reads its parents' snapshots again: history retention may have removed them.
    None before the first commit (the parents' manifests are checked and the seed verified again), without a
    record (a successor started by a runtime that kept none: it plans from its parents, and records), or when the
    record was planned from other manifests."""
    if committed < 0 or not record.exists():
        return None
    try:
        plan = RestorePlan.from_json(record.read_json(), s3, report_dir)
    except (KeyError, TypeError, ValueError) as exc:
        raise RestoreError(
            f"{record.uri()}: the restore plan this shard recorded at its first start is unreadable ({exc}); it "
            "has committed batches of its own, so its parents' snapshots may be gone: restore the file from a "
            "backup of the shard's storage",
            reason="RestorePlanUnreadable",
        ) from None
    if {(s.parent, s.manifest_uri) for s in plan.slices} != {(parent, uri.uri()) for parent, uri in manifests}:
        return None
    return plan


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

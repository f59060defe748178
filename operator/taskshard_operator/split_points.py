"""Where to split a shard so that its children share the load: a pure function of the shard's load map.

The load map is what a shard runtime counts when ``spark.taskshard.keyGroupMetrics`` is ``"true"``: input rows per
bucket of contiguous key groups (``spark_runtime.live``: one bucket per key group for a range of up to
:data:`~spark_runtime.live.KEY_GROUP_BUCKETS` key groups, wider buckets beyond). The operator keeps a window of
those counters per shard (``taskshard_operator.live``) and hands their growth over the window to
:func:`load_split_point`:

- the candidate points are the key groups strictly inside the range; the rows left of a point inside a bucket are
  interpolated as if the bucket's rows were spread evenly over its key groups (exact for one-key-group buckets);
- the chosen point makes the two sides' rows closest to equal (ties: the point nearest the midpoint), and its
  expected shares are reported before the hand-over begins;
- a range without rows in the window has no load-aware point (None): the caller says why instead of guessing.

The best point can still leave the children unequal when one key group holds a large part of the rows (a hot
key): no split point divides a key group. :func:`imbalance` measures it the way the benchmarks report it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from spark_runtime.keygroups import KeyGroupRange

__all__ = ["LoadSplitPoint", "imbalance", "load_split_point", "parse_bucket"]


@dataclass(frozen=True)
class LoadSplitPoint:
    at: int
    """The first key group of the upper child."""
    shares: tuple[float, float]
    """Expected fraction of the shard's input rows in ``[start, at)`` and ``[at, end)``."""
    rows: float
    """Rows of the shard in the window the point was chosen from."""


def parse_bucket(label: str) -> tuple[int, int]:
    """``"8-16"`` -> ``(8, 16)`` (a bucket label of the load map)."""
    start, _, end = label.partition("-")
    return int(start), int(end)


def _rows_per_key_group(key_groups: KeyGroupRange, buckets: Mapping[tuple[int, int], float]) -> list[float]:
    """Rows of each key group of the range (a bucket's rows spread evenly over its key groups; rows outside the
    range, e.g. of another range's buckets, are ignored)."""
    rows = [0.0] * key_groups.size
    for (a, b), n in buckets.items():
        lo, hi = max(a, key_groups.start), min(b, key_groups.end)
        if hi <= lo or n <= 0 or b <= a:
            continue
        per = float(n) / (b - a)
        for kg in range(lo, hi):
            rows[kg - key_groups.start] += per
    return rows


def load_split_point(key_groups: KeyGroupRange, buckets: Mapping[tuple[int, int], float]) -> LoadSplitPoint | None:
    """The split point of ``key_groups`` that divides ``buckets`` (rows per ``(start, end)`` bucket) most evenly;
    None when the range has fewer than two key groups or no rows."""
    if key_groups.size < 2:
        return None
    rows = _rows_per_key_group(key_groups, buckets)
    total = sum(rows)
    if total <= 0:
        return None
    best: tuple[float, int, int] | None = None
    left = 0.0
    midpoint = key_groups.midpoint()
    for offset in range(1, key_groups.size):
        left += rows[offset - 1]
        at = key_groups.start + offset
        key = (abs(total - 2 * left), abs(at - midpoint), at)
        if best is None or key < best:
            best = key
    assert best is not None
    at = best[2]
    low = sum(rows[: at - key_groups.start])
    return LoadSplitPoint(at=at, shares=(low / total, (total - low) / total), rows=total)


def imbalance(low: float, high: float) -> float:
    """How much two children's rows differ, relative to the larger: ``(larger - smaller) / larger`` (0: equal,
    1: one got nothing). The skew benchmark's measure (target <= 0.15)."""
    larger = max(low, high)
    return 0.0 if larger <= 0 else (larger - min(low, high)) / larger

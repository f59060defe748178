"""Plain-Python builtin windows: what a windowed count, sum, min or max over a whole input must give, computed
without Spark (the Spark tier's and the benchmark's reference)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

AGGREGATES = {"count": lambda vs: len(vs), "sum": sum, "min": min, "max": max}


def window_starts(kind: str, t: int, size_ms: int, slide_ms: int) -> list[int]:
    """The starts of the tumbling or sliding windows ``[start, start + size)`` that hold a record at ``t``."""
    step = size_ms if kind == "tumbling" else slide_ms
    last = t - t % step
    return [s for s in range(last, t - size_ms, -step) if s <= t < s + size_ms]


def reference_windows(
    kind: str,
    aggregate: str,
    records: Iterable[tuple[str, int, float]],
    *,
    size_ms: int = 0,
    slide_ms: int = 0,
    gap_ms: int = 0,
) -> dict[tuple[str, int, int], float]:
    """``{(key, window_start, window_end): result}`` of ``records`` ``(key, event time ms, value)``: tumbling,
    sliding (``size_ms``, ``slide_ms``) or session (``gap_ms``: a session ends ``gap_ms`` after its last record,
    and a record at its end joins it)."""
    values: dict[tuple[str, int, int], list[float]] = defaultdict(list)
    if kind == "session":
        by_key: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for key, t, v in records:
            by_key[key].append((t, v))
        for key, items in by_key.items():
            items.sort()
            start, end, current = items[0][0], items[0][0] + gap_ms, [items[0][1]]
            for t, v in items[1:]:
                if t <= end:  # Spark merges a record at the end of a session into it
                    end, current = max(end, t + gap_ms), current + [v]
                    continue
                values[(key, start, end)] = current
                start, end, current = t, t + gap_ms, [v]
            values[(key, start, end)] = current
    else:
        for key, t, v in records:
            for s in window_starts(kind, t, size_ms, slide_ms or size_ms):
                values[(key, s, s + size_ms)].append(v)
    fn = AGGREGATES[aggregate]
    return {k: fn(vs) for k, vs in values.items()}

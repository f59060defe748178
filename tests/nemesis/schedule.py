"""The nemesis's schedule: a seeded random sequence of operations and faults on one Task (pure: no cluster).

A schedule is a list of :class:`Step`: an operation kind and random *choices* (which active shard, where in its
range, which neighbour), resolved against the Task's shards only when the step runs (:meth:`Step.resolve`), so the
same seed replays the same life on the same code: shard names are deterministic (``<task>-<start>-<end>``), and
so is everything the choices are resolved against. A failing run prints its seed and the steps as resolved; a
schedule is shrunk by hand by passing the failing steps alone (:func:`parse`, ``TASKSHARD_NEMESIS_STEPS``).

Kinds (:data:`KINDS`):

- ``split``: split an active shard at a random point of its range, often at an edge key group (``start + 1`` or
  ``end - 1``: the split points that once corrupted a child's checkpoint);
- ``split-kill``: a split, and a SIGKILL of one child's runtime while it catches up or waits on standby;
- ``split-abort``: a split requested and withdrawn at once (undone, or completed if the parent drained first);
- ``merge``: merge an active shard with its right neighbour;
- ``kill``: SIGKILL an active shard's runtime (the kubelet restarts it in place);
- ``evict``: force-delete an active shard's pod (the operator makes a new one);
- ``operator``: SIGKILL the operator and start a new one;
- ``suspend``: suspend the Task, then resume it;
- ``scale``: ``kubectl scale task --replicas`` one up (the operator splits the busiest shard) or one down (it
  merges an adjacent pair), through the Task's scale subresource;
- ``prune``: lower ``spec.history.retiredShards`` to 1 (retired shards' storage goes once their successors
  committed; every later restart of a successor must still resume);
- ``roll``: a template roll (a new ``spec.spark.env`` value): every active shard restarts from its checkpoint on
  the new template, one at a time, while the rest keep running;
- ``pause``: SIGSTOP an active shard's runtime (a long GC pause, a frozen node), request a split of it while it is
  frozen, and SIGCONT it only once both children exist and wait on standby for it: a frozen parent must neither
  let a successor take its range early nor lose what it held;
- ``apiserver``: a split of an active shard, and a crash and restart of kube-apiserver right after the request:
  the operator's watches, the runtimes' and the node's API clients are cut mid-hand-over.

Events are written before every step, so each runs while input flows.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

KINDS = ("split", "split-kill", "split-abort", "merge", "kill", "evict", "operator", "suspend", "prune", "scale",
         "roll", "pause", "apiserver")  # fmt: skip
WEIGHTS = {"split": 4, "split-kill": 2, "split-abort": 1, "merge": 3, "kill": 2, "evict": 1, "operator": 2,
           "suspend": 1, "prune": 1, "scale": 2, "roll": 2, "pause": 2, "apiserver": 1}  # fmt: skip
SPLITS = ("split", "split-kill", "split-abort", "pause", "apiserver")
"""The kinds that split their target shard (a ``pause`` splits the shard it froze, ``apiserver`` restarts the API
server during the split)."""
MAX_SHARDS = 4
"""A split is replaced by a merge once the Task has this many active shards (2 cores run a handful of drivers)."""


@dataclass(frozen=True)
class Step:
    """One operation: its ``kind`` and the random numbers that choose its target when it runs."""

    kind: str
    pick: float
    """Which active shard, as a fraction of their count (0 <= pick < 1)."""
    point: float
    """Where in the shard's range a split goes: below 0.25 the first key group after its start, above 0.75 the
    last one before its end, else that fraction of the range."""

    def target(self, shards: Sequence[tuple[str, int, int]]) -> tuple[str, int, int]:
        """The active shard (``(name, start, end)``, ordered by range) this step acts on."""
        return shards[min(int(self.pick * len(shards)), len(shards) - 1)]

    def split_at(self, start: int, end: int) -> int:
        """The split point in ``[start + 1, end - 1]`` for a shard of range ``[start, end)``."""
        if self.point < 0.25:
            return start + 1
        if self.point > 0.75:
            return end - 1
        return min(end - 1, max(start + 1, start + int(self.point * (end - start))))

    def resolve(self, shards: Sequence[tuple[str, int, int]]) -> str:
        """The step as it acts on ``shards`` (the active ones, ordered by range), for the run's log: what a replay
        with the same seed does at this point."""
        kind = self.effective_kind(shards)
        name, start, end = self.target(shards)
        if kind in SPLITS:
            return f"{kind} {name} at {self.split_at(start, end)}"
        if kind == "merge":
            left, right = self.merge_pair(shards)
            return f"merge {left} with {right}"
        if kind in ("kill", "evict"):
            return f"{kind} {name}"
        if kind == "scale":
            return f"scale to {self.replicas(shards)}"
        return kind

    def replicas(self, shards: Sequence[tuple[str, int, int]]) -> int:
        """A ``scale`` step's new shard count: one fewer (``pick`` below 0.5) or one more, within
        ``[1, MAX_SHARDS]`` and the key groups."""
        n, groups = len(shards), shards[-1][2] - shards[0][1]
        up = (self.pick >= 0.5 or n == 1) and n < min(MAX_SHARDS, groups)
        return n + 1 if up else max(1, n - 1)

    def effective_kind(self, shards: Sequence[tuple[str, int, int]]) -> str:
        """The kind, adjusted to what the shards allow: no split of a one-key-group shard or past
        :data:`MAX_SHARDS` (a merge instead), no merge of a single shard (a split instead)."""
        name, start, end = self.target(shards)
        splits = self.kind in SPLITS
        if splits and (end - start < 2 or len(shards) >= MAX_SHARDS):
            return "merge" if len(shards) > 1 else "kill"
        if self.kind == "merge" and len(shards) < 2:
            return "split" if end - start >= 2 else "kill"
        return self.kind

    def merge_pair(self, shards: Sequence[tuple[str, int, int]]) -> tuple[str, str]:
        """The chosen shard and its right neighbour (the last shard merges with its left one)."""
        index = min(int(self.pick * len(shards)), len(shards) - 1)
        index = min(index, len(shards) - 2)
        return shards[index][0], shards[index + 1][0]


def generate(seed: int, ops: int) -> list[Step]:
    """``ops`` steps drawn from ``seed`` (the same seed gives the same steps); ``prune`` at most once."""
    rng = random.Random(seed)
    kinds = list(WEIGHTS)
    out: list[Step] = []
    for _ in range(ops):
        kind = rng.choices(kinds, weights=[WEIGHTS[k] for k in kinds])[0]
        if kind == "prune" and any(s.kind == "prune" for s in out):
            kind = "split"
        out.append(Step(kind, round(rng.random(), 3), round(rng.random(), 3)))
    return out


def parse(text: str) -> list[Step]:
    """Steps written as ``kind:pick:point`` separated by commas (what a failing run prints), to replay a shrunk
    schedule by hand."""
    steps = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, pick, point = part.split(":")
        if kind not in KINDS:
            raise ValueError(f"{kind!r} is not a nemesis step kind (one of {', '.join(KINDS)})")
        steps.append(Step(kind, float(pick), float(point)))
    return steps


def render(steps: Sequence[Step]) -> str:
    """The steps in :func:`parse`'s format."""
    return ",".join(f"{s.kind}:{s.pick}:{s.point}" for s in steps)

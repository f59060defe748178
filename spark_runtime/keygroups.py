"""Key groups: key -> hash -> key group, and contiguous key-group ranges.

Pure Python. This module imports neither pyspark nor kopf: the operator imports it too.

Hash choice
-----------
``key_group(key, n)`` equals the Spark SQL expression ``pmod(hash(key), n)`` (see :func:`key_group_sql`),
evaluated natively by Spark on the hot path (no Python UDF). Spark's ``hash()`` is Murmur3 x86_32 with
seed 42; for strings it runs ``Murmur3_x86_32.hashUnsafeBytes`` over the UTF-8 bytes, which differs from
reference Murmur3 in the tail: each of the last ``len % 4`` bytes is sign-extended and mixed as its own
4-byte block (``mixK1``/``mixH1`` per byte) instead of being packed into one block.
:func:`spark_hash_string` reproduces that bit for bit. We chose ``hash()`` over ``xxhash64()`` because:

- Spark keeps ``hash()`` stable across releases (bucketed tables depend on it), and the pure-Python twin
  of a 32-bit Murmur3 is short and easy to audit;
- its 32-bit result is ample for at most ``MAX_KEY_GROUPS_LIMIT`` = 32768 groups, and ``pmod`` maps
  negative hashes into ``[0, n)`` without the 64-bit sign handling ``xxhash64`` would need;
- it is the expression the architecture names and the one whose filter throughput was measured.

Key types
---------
Keys are strings in the runtime (design contracts): an event key that is a JSON integer is used as its
decimal text. So an ``int`` key is hashed as ``str(key)`` (the UTF-8 bytes of its decimal text): it equals
``pmod(hash(CAST(k AS STRING)), n)`` for a Spark ``LongType``/``IntegerType`` column, and
``key_group(7, n) == key_group("7", n)``. It is NOT hashed as a ``LongType`` (Spark's ``hashLong``), which
would give a different group for the same event; :func:`spark_hash_long` and :func:`spark_hash_int` exist
only to document that difference. ``bool`` keys are rejected (``True`` is an ``int`` in Python, not a key).

Null policy
-----------
Spark's ``hash(NULL)`` is the seed, 42 (null inputs are skipped, not propagated), so
``pmod(hash(NULL), n)`` is ``42 % n``, and ``key_group(None, n)`` returns exactly that. The runtime never
routes a null-key record by it: records whose key is null or missing go to the shard's dead-letter output,
because every shard would otherwise have to agree on owning them.

Key groups nested in partitions
-------------------------------
For a source partitioned by the key (every record of a key lands in one partition: a Kafka topic keyed by the
key field, the journal's own producer), a Task may declare ``partitionedByKey``. With ``P`` partitions and
``G = maxKeyGroups`` (a multiple of ``P``), partition ``p`` holds the contiguous block of ``B = G / P`` key
groups ``[p * B, (p + 1) * B)``, and a record's key group is ``p * B + pmod(hash(key), B)``
(:func:`nested_key_group`, Spark SQL :func:`nested_key_group_sql`). A shard then reads only the partitions whose
block meets its range (:func:`partitions_for_range`): read amplification about 1 instead of the shard count. This
is Flink's "already keyed stream" applied to our ranges. A record's key group depends on its partition, so the
mapping holds only while one key stays in one partition and the partition count stays ``P``.

Ranges
------
Ranges are half-open ``[start, end)`` everywhere. A range of size 1 cannot be split; the default split
point is the midpoint ``start + (end - start) // 2``; an explicit point must lie strictly inside
``(start, end)``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "MAX_KEY_GROUPS_LIMIT",
    "SPARK_HASH_SEED",
    "InvalidKeyError",
    "InvalidRangeError",
    "KeyGroupError",
    "KeyGroupRange",
    "KeyGrouping",
    "SplitError",
    "TilingError",
    "check_tiling",
    "initial_ranges",
    "key_group",
    "key_group_sql",
    "nested_block_size",
    "nested_key_group",
    "nested_key_group_sql",
    "partitions_for_range",
    "range_for_shard",
    "spark_hash_int",
    "spark_hash_long",
    "spark_hash_string",
]

MAX_KEY_GROUPS_LIMIT = 32768
"""The largest allowed ``maxKeyGroups`` (Flink's upper bound for max parallelism is 2**15 as well)."""

SPARK_HASH_SEED = 42
"""The seed of Spark's ``hash()`` expression (``Murmur3Hash(children, 42)``)."""


class KeyGroupError(ValueError):
    """Base class of every error raised by this module."""


class InvalidKeyError(KeyGroupError, TypeError):
    """A key that is not ``str``, ``int`` (``bool`` excluded) or ``None``, or a string with no UTF-8 form."""


class InvalidRangeError(KeyGroupError):
    """A key-group range, index, shard count or ``max_key_groups`` outside its valid bounds."""


class SplitError(KeyGroupError):
    """A split point that is not strictly inside the range, or a split of a one-group range."""


class TilingError(KeyGroupError):
    """A set of ranges that does not tile ``[0, max_key_groups)`` exactly (gap, overlap or out of bounds)."""


# --- Murmur3 x86_32, exactly as org.apache.spark.unsafe.hash.Murmur3_x86_32 ---

_MASK32 = 0xFFFFFFFF
_C1 = 0xCC9E2D51
_C2 = 0x1B873593


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _MASK32


def _mix_k1(k1: int) -> int:
    k1 = (k1 * _C1) & _MASK32
    k1 = _rotl32(k1, 15)
    return (k1 * _C2) & _MASK32


def _mix_h1(h1: int, k1: int) -> int:
    h1 ^= k1
    h1 = _rotl32(h1, 13)
    return (h1 * 5 + 0xE6546B64) & _MASK32


def _fmix(h1: int, length: int) -> int:
    h1 ^= length
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _MASK32
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _MASK32
    h1 ^= h1 >> 16
    return h1


def _to_signed32(x: int) -> int:
    return x - (1 << 32) if x & 0x80000000 else x


def _hash_unsafe_bytes(data: bytes, seed: int) -> int:
    """``Murmur3_x86_32.hashUnsafeBytes``: little-endian 4-byte words, then one signed byte per block."""
    aligned = len(data) - len(data) % 4
    h1 = seed & _MASK32
    for word in struct.unpack_from(f"<{aligned // 4}I", data):
        h1 = _mix_h1(h1, _mix_k1(word))
    for byte in data[aligned:]:
        signed = byte - 256 if byte >= 128 else byte  # Java's Platform.getByte returns a signed byte
        h1 = _mix_h1(h1, _mix_k1(signed & _MASK32))
    return _to_signed32(_fmix(h1, len(data)))


def spark_hash_string(value: str, seed: int = SPARK_HASH_SEED) -> int:
    """Spark's ``hash(value)`` for a ``StringType`` value (UTF8_BINARY collation): a signed 32-bit int.

    Raises ``InvalidKeyError`` for a string with no UTF-8 encoding (a lone surrogate such as ``"\\ud800"``).
    """
    try:
        data = value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidKeyError(
            f"key: {value!r} is not valid Unicode ({exc.reason} at index {exc.start}); "
            "keys must be strings that encode to UTF-8 (no lone surrogates)"
        ) from None
    return _hash_unsafe_bytes(data, seed)


def spark_hash_int(value: int, seed: int = SPARK_HASH_SEED) -> int:
    """Spark's ``hash(value)`` for an ``IntegerType`` value (``hashInt``). Not used for routing."""
    if not -(2**31) <= value < 2**31:
        raise InvalidKeyError(f"value: {value} is outside the 32-bit range [-2**31, 2**31)")
    return _to_signed32(_fmix(_mix_h1(seed & _MASK32, _mix_k1(value & _MASK32)), 4))


def spark_hash_long(value: int, seed: int = SPARK_HASH_SEED) -> int:
    """Spark's ``hash(value)`` for a ``LongType`` value (``hashLong``). Not used for routing."""
    if not -(2**63) <= value < 2**63:
        raise InvalidKeyError(f"value: {value} is outside the 64-bit range [-2**63, 2**63)")
    bits = value & 0xFFFFFFFFFFFFFFFF
    h1 = _mix_h1(seed & _MASK32, _mix_k1(bits & _MASK32))
    h1 = _mix_h1(h1, _mix_k1(bits >> 32))
    return _to_signed32(_fmix(h1, 8))


# --- key groups ---


def _check_max_key_groups(max_key_groups: int) -> None:
    if (
        isinstance(max_key_groups, bool)
        or not isinstance(max_key_groups, int)
        or not 1 <= max_key_groups <= MAX_KEY_GROUPS_LIMIT
    ):
        raise InvalidRangeError(
            f"max_key_groups: {max_key_groups!r} is invalid; it must be an integer in 1..{MAX_KEY_GROUPS_LIMIT}"
        )


def key_group(key: str | int | None, max_key_groups: int) -> int:
    """The key group of ``key``: equals Spark's ``pmod(hash(key), max_key_groups)`` for a string column.

    ``int`` keys are hashed as their decimal text; ``None`` gives ``42 % max_key_groups`` (Spark's value for a
    null key; the runtime dead-letters such records). Result is in ``[0, max_key_groups)``.
    """
    _check_max_key_groups(max_key_groups)
    if key is None:
        h = SPARK_HASH_SEED
    elif isinstance(key, bool) or not isinstance(key, str | int):
        raise InvalidKeyError(
            f"key: {key!r} has type {type(key).__name__}; a key must be a str, an int (hashed as its decimal "
            "text) or None"
        )
    else:
        h = spark_hash_string(key if isinstance(key, str) else str(key))
    return h % max_key_groups  # Python's % of a positive modulus equals Spark's pmod


def key_group_sql(column: str, max_key_groups: int) -> str:
    """Spark SQL text computing the key group of ``column`` (a ``StringType`` column), e.g.
    ``pmod(hash(`key`), 128)``. The column name is quoted as one identifier (backticks doubled)."""
    _check_max_key_groups(max_key_groups)
    if not isinstance(column, str) or not column:
        raise KeyGroupError(f"column: {column!r} is invalid; it must be a non-empty column name")
    quoted = "`" + column.replace("`", "``") + "`"
    return f"pmod(hash({quoted}), {max_key_groups})"


# --- key groups nested in partitions ---


def nested_block_size(max_key_groups: int, partitions: int) -> int:
    """``B = max_key_groups / partitions``, the key groups of one partition's block. ``InvalidRangeError`` (saying
    which values are valid) unless ``partitions`` divides ``max_key_groups``."""
    _check_max_key_groups(max_key_groups)
    if not _is_int(partitions) or partitions < 1:
        raise InvalidRangeError(f"partitions: {partitions!r} is invalid; it must be a positive integer")
    if max_key_groups % partitions:
        lower = max_key_groups - max_key_groups % partitions
        upper = lower + partitions
        near = " or ".join(str(v) for v in (lower, upper) if 0 < v <= MAX_KEY_GROUPS_LIMIT)
        raise InvalidRangeError(
            f"maxKeyGroups: {max_key_groups} is not a multiple of the source's {partitions} partitions; with "
            f"partitionedByKey each partition holds maxKeyGroups / partitions key groups, so use a multiple of "
            f"{partitions} (e.g. {near}) or a partition count that divides {max_key_groups}"
        )
    return max_key_groups // partitions


def nested_key_group(key: str | int | None, partition: int, max_key_groups: int, partitions: int) -> int:
    """The key group of ``key`` read from ``partition`` of a source partitioned by the key:
    ``partition * B + pmod(hash(key), B)`` with ``B = max_key_groups / partitions``; equals
    :func:`nested_key_group_sql` in Spark. Keys are hashed as in :func:`key_group`."""
    block = nested_block_size(max_key_groups, partitions)
    if not _is_int(partition) or not 0 <= partition < partitions:
        raise InvalidRangeError(f"partition: {partition!r} is outside 0..{partitions - 1}")
    return partition * block + key_group(key, block)


def nested_key_group_sql(column: str, partition_column: str, max_key_groups: int, partitions: int) -> str:
    """Spark SQL text for :func:`nested_key_group`, e.g.
    ``(CAST(`partition` AS INT) * 32 + pmod(hash(`key`), 32))``."""
    block = nested_block_size(max_key_groups, partitions)
    if not isinstance(partition_column, str) or not partition_column:
        raise KeyGroupError(f"partition_column: {partition_column!r} is invalid; it must be a non-empty column name")
    quoted = "`" + partition_column.replace("`", "``") + "`"
    return f"(CAST({quoted} AS INT) * {block} + {key_group_sql(column, block)})"


def partitions_for_range(key_groups: KeyGroupRange, max_key_groups: int, partitions: int) -> list[int]:
    """The partitions whose key-group block meets ``key_groups`` (ascending): a shard of a source partitioned by the
    key reads exactly these. A range inside one block gives one partition; both halves of a split inside a block
    read that partition."""
    block = nested_block_size(max_key_groups, partitions)
    if key_groups.end > max_key_groups:
        raise InvalidRangeError(f"keyGroups: {key_groups} extends past maxKeyGroups ({max_key_groups})")
    return list(range(key_groups.start // block, (key_groups.end - 1) // block + 1))


@dataclass(frozen=True)
class KeyGrouping:
    """How a Task maps records to key groups: ``pmod(hash(key), maxKeyGroups)`` (``partitions`` None: every shard
    reads every partition), or nested in ``partitions`` partitions (the source is partitioned by the key)."""

    max_key_groups: int
    partitions: int | None = None

    def __post_init__(self) -> None:
        if self.partitions is None:
            _check_max_key_groups(self.max_key_groups)
        else:
            nested_block_size(self.max_key_groups, self.partitions)

    @property
    def nested(self) -> bool:
        return self.partitions is not None

    def of(self, key: str | int | None, partition: int) -> int:
        """The key group of ``key`` read from ``partition``."""
        if self.partitions is None:
            return key_group(key, self.max_key_groups)
        return nested_key_group(key, partition, self.max_key_groups, self.partitions)

    def sql(self, column: str = "key", partition_column: str = "partition") -> str:
        """The Spark SQL expression of :meth:`of` over ``column`` and ``partition_column``."""
        if self.partitions is None:
            return key_group_sql(column, self.max_key_groups)
        return nested_key_group_sql(column, partition_column, self.max_key_groups, self.partitions)

    def partitions_to_read(self, key_groups: KeyGroupRange) -> list[int] | None:
        """The partitions a shard over ``key_groups`` reads; None for every partition (not nested)."""
        if self.partitions is None:
            return None
        return partitions_for_range(key_groups, self.max_key_groups, self.partitions)


# --- ranges ---


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, order=True)
class KeyGroupRange:
    """The half-open key-group range ``[start, end)`` with ``0 <= start < end <= MAX_KEY_GROUPS_LIMIT``.

    Ordering is by ``(start, end)``. ``str()`` gives ``"[0, 64)"``; ``label()`` gives ``"0-64"`` (the value of
    the ``taskshard.io/key-groups`` label), which :meth:`from_label` parses back.
    """

    start: int
    end: int

    def __post_init__(self) -> None:
        if not (_is_int(self.start) and _is_int(self.end)) or not (0 <= self.start < self.end <= MAX_KEY_GROUPS_LIMIT):
            raise InvalidRangeError(
                f"keyGroups: start={self.start!r}, end={self.end!r} is invalid; need integers with "
                f"0 <= start < end <= {MAX_KEY_GROUPS_LIMIT} (the range is [start, end))"
            )

    @property
    def size(self) -> int:
        """The number of key groups in the range (``end - start``, at least 1)."""
        return self.end - self.start

    def contains(self, kg: int) -> bool:
        """True when ``start <= kg < end``."""
        return self.start <= kg < self.end

    def __contains__(self, kg: int) -> bool:
        return self.contains(kg)

    def midpoint(self) -> int:
        """The default split point ``start + (end - start) // 2``; ``SplitError`` for a one-group range."""
        if self.size < 2:
            raise SplitError(f"keyGroups: {self} holds one key group and cannot be split")
        return self.start + self.size // 2

    def split(self, at: int | None = None) -> tuple[KeyGroupRange, KeyGroupRange]:
        """Split into ``[start, at)`` and ``[at, end)``; ``at`` defaults to :meth:`midpoint`.

        ``at`` must satisfy ``start < at < end``; otherwise (or for a one-group range) raises ``SplitError``.
        """
        if at is None:
            at = self.midpoint()
        elif self.size < 2:
            raise SplitError(f"keyGroups: {self} holds one key group and cannot be split")
        elif not _is_int(at) or not self.start < at < self.end:
            raise SplitError(
                f"split.at: {at!r} is not strictly inside {self}; it must be an integer with "
                f"{self.start} < at < {self.end}"
            )
        return KeyGroupRange(self.start, at), KeyGroupRange(at, self.end)

    def __str__(self) -> str:
        return f"[{self.start}, {self.end})"

    def label(self) -> str:
        """``"start-end"``, e.g. ``"0-64"`` for ``[0, 64)``; safe as a label value and in object names."""
        return f"{self.start}-{self.end}"

    @classmethod
    def from_label(cls, text: str) -> KeyGroupRange:
        """Parse :meth:`label` output (``"0-64"``) back into a range."""
        parts = text.split("-") if isinstance(text, str) else []
        if len(parts) != 2 or not all(p.isdigit() and p.isascii() for p in parts):
            raise InvalidRangeError(f"label: {text!r} is invalid; expected 'start-end', e.g. '0-64'")
        return cls(int(parts[0]), int(parts[1]))


def range_for_shard(index: int, shards: int, max_key_groups: int) -> KeyGroupRange:
    """The range of shard ``index`` of ``shards`` over ``[0, max_key_groups)``.

    Flink's ``KeyGroupRangeAssignment.computeKeyGroupRangeForOperatorIndex``:
    ``start = ceil(index * max / shards)`` and inclusive ``end = floor(((index + 1) * max - 1) / shards)``,
    returned here half-open as ``[start, end + 1)``. Needs ``1 <= shards <= max_key_groups`` and
    ``0 <= index < shards``; consecutive indexes tile ``[0, max_key_groups)``, sizes differ by at most 1.
    """
    _check_max_key_groups(max_key_groups)
    if not _is_int(shards) or not 1 <= shards <= max_key_groups:
        raise InvalidRangeError(
            f"shards: {shards!r} is invalid; it must be an integer in 1..max_key_groups ({max_key_groups})"
        )
    if not _is_int(index) or not 0 <= index < shards:
        raise InvalidRangeError(f"index: {index!r} is invalid; it must be an integer in 0..{shards - 1}")
    start = (index * max_key_groups + shards - 1) // shards
    end_inclusive = ((index + 1) * max_key_groups - 1) // shards
    return KeyGroupRange(start, end_inclusive + 1)


def initial_ranges(shards: int, max_key_groups: int) -> list[KeyGroupRange]:
    """The ranges of shards ``0..shards-1`` (see :func:`range_for_shard`), in ascending order."""
    return [range_for_shard(i, shards, max_key_groups) for i in range(shards)]


def check_tiling(ranges: Iterable[KeyGroupRange], max_key_groups: int) -> None:
    """Raise ``TilingError`` unless ``ranges`` tile ``[0, max_key_groups)`` exactly: no gap, no overlap.

    The message names the first gap or overlap found (in ascending order), e.g. ``gap [32, 40)`` or
    ``overlap [32, 40) between [0, 40) and [32, 64)``. Input order does not matter.
    """
    _check_max_key_groups(max_key_groups)
    ordered = sorted(ranges)
    if not ordered:
        raise TilingError(f"ranges: empty; they must tile [0, {max_key_groups})")
    cursor = 0
    previous: KeyGroupRange | None = None
    for r in ordered:
        if r.start > cursor:
            raise TilingError(f"ranges: gap [{cursor}, {r.start}) before {r}; they must tile [0, {max_key_groups})")
        if r.start < cursor:
            raise TilingError(
                f"ranges: overlap [{r.start}, {min(cursor, r.end)}) between {previous} and {r}; "
                f"they must tile [0, {max_key_groups})"
            )
        cursor = r.end
        previous = r
    if cursor > max_key_groups:
        raise TilingError(f"ranges: {previous} extends past max_key_groups; they must tile [0, {max_key_groups})")
    if cursor < max_key_groups:
        raise TilingError(f"ranges: gap [{cursor}, {max_key_groups}) at the end; they must tile [0, {max_key_groups})")

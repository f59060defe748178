"""Unit tests of spark_runtime.keygroups: pinned Spark hash vectors, ranges, splits, tiling (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from spark_runtime import keygroups
from spark_runtime.keygroups import (
    MAX_KEY_GROUPS_LIMIT,
    InvalidKeyError,
    InvalidRangeError,
    KeyGroupError,
    KeyGroupRange,
    SplitError,
    TilingError,
    check_tiling,
    initial_ranges,
    key_group,
    key_group_sql,
    range_for_shard,
    spark_hash_int,
    spark_hash_long,
    spark_hash_string,
)

pytestmark = pytest.mark.unit

max_key_groups_st = st.integers(min_value=1, max_value=MAX_KEY_GROUPS_LIMIT)


@st.composite
def ranges_st(draw, min_size: int = 1) -> KeyGroupRange:
    start = draw(st.integers(0, MAX_KEY_GROUPS_LIMIT - min_size))
    end = draw(st.integers(start + min_size, MAX_KEY_GROUPS_LIMIT))
    return KeyGroupRange(start, end)


# --- hash: vectors taken from Spark 4.3.0 `SELECT hash(...)` (the spark tier re-proves them on 10k+ keys) ---

SPARK_STRING_HASHES = {
    "": 142593372,
    "a": 1485273170,
    "ab": -97053317,
    "abc": 1322437556,
    "abcd": -396302900,
    "abcde": 814637928,
    "é": 2119106806,
    "日本語": -1143049834,
    "😀x": -1814635023,
    "\x80": -2056849603,
    "ÿÿÿ": 883061003,
}


@pytest.mark.parametrize(("text", "expected"), SPARK_STRING_HASHES.items())
def test_string_hash_matches_spark_vectors(text, expected):
    assert spark_hash_string(text) == expected


def test_numeric_hash_twins_match_spark_vectors():
    assert spark_hash_int(2147483647) == 133916647
    assert spark_hash_long(-5) == 424949597
    assert spark_hash_long(2**63 - 1) == -1604625029


def test_null_key_is_spark_seed_mod_n():
    assert key_group(None, 128) == 42
    assert key_group(None, 16) == 42 % 16
    assert key_group(None, 1) == 0


@given(st.text(max_size=50), max_key_groups_st)
def test_key_group_is_in_range_and_is_pmod_of_hash(key, n):
    try:
        h = spark_hash_string(key)
    except InvalidKeyError:
        return  # lone surrogates have no UTF-8 form
    kg = key_group(key, n)
    assert 0 <= kg < n
    assert kg == ((h % n) + n) % n  # Java's pmod
    assert -(2**31) <= h < 2**31


@given(st.integers(min_value=-(2**70), max_value=2**70), max_key_groups_st)
def test_int_keys_hash_as_decimal_text(key, n):
    assert key_group(key, n) == key_group(str(key), n)


@pytest.mark.parametrize("key", [True, False, 1.5, b"abc", ["a"], object()])
def test_non_key_types_are_rejected(key):
    with pytest.raises(InvalidKeyError, match="key: .* str, an int"):
        key_group(key, 128)


def test_lone_surrogate_is_rejected_with_a_clear_message():
    with pytest.raises(InvalidKeyError, match="UTF-8"):
        key_group("a\ud800b", 128)


@pytest.mark.parametrize("n", [0, -1, MAX_KEY_GROUPS_LIMIT + 1, True, 1.0, "128", None])
def test_invalid_max_key_groups_is_rejected(n):
    with pytest.raises(InvalidRangeError, match=r"max_key_groups: .* 1\.\.32768"):
        key_group("a", n)


def test_errors_are_value_errors():
    for cls in (InvalidKeyError, InvalidRangeError, SplitError, TilingError):
        assert issubclass(cls, KeyGroupError)
        assert issubclass(cls, ValueError)


def test_key_group_sql_text():
    assert key_group_sql("key", 128) == "pmod(hash(`key`), 128)"
    assert key_group_sql("a`b", 7) == "pmod(hash(`a``b`), 7)"
    with pytest.raises(KeyGroupError, match="column"):
        key_group_sql("", 7)
    with pytest.raises(InvalidRangeError, match="max_key_groups"):
        key_group_sql("key", 0)


def test_module_imports_neither_pyspark_nor_kopf():
    source = open(keygroups.__file__, encoding="utf-8").read()
    assert "import pyspark" not in source and "from pyspark" not in source
    assert "import kopf" not in source and "from kopf" not in source


# --- KeyGroupRange ---


def test_range_text_forms():
    r = KeyGroupRange(0, 64)
    assert str(r) == "[0, 64)"
    assert r.label() == "0-64"
    assert KeyGroupRange.from_label("0-64") == r
    assert r.size == 64
    assert r.contains(0) and r.contains(63) and not r.contains(64)
    assert 5 in r


@pytest.mark.parametrize(
    ("start", "end"), [(0, 0), (5, 4), (-1, 3), (0, MAX_KEY_GROUPS_LIMIT + 1), (0.0, 4), (True, 4), (0, "4")]
)
def test_invalid_ranges_are_rejected(start, end):
    with pytest.raises(InvalidRangeError, match=r"keyGroups: .*0 <= start < end <= 32768"):
        KeyGroupRange(start, end)


@pytest.mark.parametrize("text", ["", "0", "0-", "-4", "0-64-1", "a-b", "64-0", "0 - 64", "１-２"])
def test_invalid_labels_are_rejected(text):
    with pytest.raises(InvalidRangeError):
        KeyGroupRange.from_label(text)


@given(ranges_st())
def test_label_round_trip(r):
    assert KeyGroupRange.from_label(r.label()) == r


@given(ranges_st(min_size=2))
def test_midpoint_split_tiles_parent_and_halves_it(r):
    left, right = r.split()
    assert left.start == r.start and right.end == r.end and left.end == right.start == r.midpoint()
    assert left.size + right.size == r.size
    assert left.size == r.size // 2 and right.size - left.size in (0, 1)
    assert left < right


@given(ranges_st(min_size=2), st.data())
def test_explicit_split_point_strictly_inside(r, data):
    at = data.draw(st.integers(r.start + 1, r.end - 1))
    left, right = r.split(at)
    assert (left.start, left.end, right.start, right.end) == (r.start, at, at, r.end)
    check_tiling([left, right, *([KeyGroupRange(0, r.start)] if r.start else [])], r.end)


@given(ranges_st(min_size=2), st.integers(-10, MAX_KEY_GROUPS_LIMIT + 10))
def test_split_point_outside_is_rejected(r, at):
    assume(not r.start < at < r.end)
    with pytest.raises(SplitError, match=rf"split\.at: {at} is not strictly inside \[{r.start}, {r.end}\)"):
        r.split(at)


@given(st.integers(0, MAX_KEY_GROUPS_LIMIT - 1), st.one_of(st.none(), st.integers()))
def test_one_group_range_cannot_be_split(start, at):
    r = KeyGroupRange(start, start + 1)
    with pytest.raises(SplitError, match="one key group"):
        r.split(at)
    with pytest.raises(SplitError):
        r.midpoint()


# --- Flink ranges and tiling ---


def test_flink_examples():
    assert initial_ranges(1, 128) == [KeyGroupRange(0, 128)]
    assert initial_ranges(2, 128) == [KeyGroupRange(0, 64), KeyGroupRange(64, 128)]
    assert initial_ranges(3, 128) == [KeyGroupRange(0, 43), KeyGroupRange(43, 86), KeyGroupRange(86, 128)]
    assert initial_ranges(4, 4) == [KeyGroupRange(i, i + 1) for i in range(4)]


@st.composite
def shards_and_max(draw):
    n = draw(max_key_groups_st)
    return draw(st.integers(1, min(n, 512))), n


@given(shards_and_max())
def test_initial_ranges_tile_and_are_balanced(sm):
    shards, n = sm
    ranges = initial_ranges(shards, n)
    assert len(ranges) == shards
    check_tiling(ranges, n)
    assert max(r.size for r in ranges) - min(r.size for r in ranges) <= 1


@given(shards_and_max(), st.data())
def test_range_for_shard_agrees_with_flink_operator_index(sm, data):
    """Flink assigns key group kg to operator ``kg * parallelism // maxParallelism``."""
    shards, n = sm
    kg = data.draw(st.integers(0, n - 1))
    index = kg * shards // n
    assert range_for_shard(index, shards, n).contains(kg)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((0, 0, 8), "shards"),
        ((0, 9, 8), "shards"),
        ((2, 2, 8), "index"),
        ((-1, 2, 8), "index"),
        ((0, 1, 0), "max"),
    ],
)
def test_range_for_shard_rejects_bad_arguments(args, field):
    with pytest.raises(InvalidRangeError, match=field):
        range_for_shard(*args)


@st.composite
def split_history(draw):
    """A tiling reached from initial ranges by a random sequence of splits."""
    shards, n = draw(shards_and_max())
    ranges = initial_ranges(shards, n)
    for _ in range(draw(st.integers(0, 20))):
        splittable = [r for r in ranges if r.size >= 2]
        if not splittable:
            break
        r = draw(st.sampled_from(splittable))
        at = draw(st.one_of(st.none(), st.integers(r.start + 1, r.end - 1)))
        ranges.remove(r)
        ranges.extend(r.split(at))
    return ranges, n


@given(split_history(), st.randoms())
def test_any_split_history_tiles_in_any_order(history, rnd):
    ranges, n = history
    rnd.shuffle(ranges)
    check_tiling(ranges, n)
    for kg in {0, n - 1, n // 2}:
        assert sum(r.contains(kg) for r in ranges) == 1


@given(split_history(), st.data())
def test_a_missing_range_is_reported_as_a_gap(history, data):
    ranges, n = history
    assume(len(ranges) >= 2)
    missing = data.draw(st.sampled_from(ranges))
    rest = [r for r in ranges if r != missing]
    with pytest.raises(TilingError, match=rf"gap \[{missing.start}, {missing.end}\)"):
        check_tiling(rest, n)


@given(split_history(), st.data())
def test_an_extra_range_is_reported_as_an_overlap(history, data):
    ranges, n = history
    extra = data.draw(ranges_st())
    assume(extra.end <= n)
    with pytest.raises(TilingError, match="overlap"):
        check_tiling([*ranges, extra], n)


def test_tiling_messages():
    with pytest.raises(TilingError, match=r"empty"):
        check_tiling([], 8)
    with pytest.raises(TilingError, match=r"gap \[0, 2\)"):
        check_tiling([KeyGroupRange(2, 8)], 8)
    with pytest.raises(TilingError, match=r"gap \[6, 8\) at the end"):
        check_tiling([KeyGroupRange(0, 6)], 8)
    with pytest.raises(TilingError, match=r"\[0, 10\) extends past"):
        check_tiling([KeyGroupRange(0, 10)], 8)
    with pytest.raises(TilingError, match=r"overlap \[4, 6\) between \[0, 6\) and \[4, 8\)"):
        check_tiling([KeyGroupRange(4, 8), KeyGroupRange(0, 6)], 8)


# ---------------------------------------------------------------- key groups nested in partitions


def test_nested_key_group_puts_each_partition_in_its_own_block():
    from spark_runtime.keygroups import nested_key_group

    for p in range(4):
        groups = {nested_key_group(f"k{i}", p, 128, 4) for i in range(2000)}
        assert groups == set(range(p * 32, (p + 1) * 32)), "every group of the block, none outside it"
    # Within the block the key decides, as pmod(hash(key), B): the same key in another partition shifts by B.
    assert nested_key_group("k7", 2, 128, 4) == 64 + key_group("k7", 32)
    assert nested_key_group(7, 1, 128, 4) == nested_key_group("7", 1, 128, 4)
    assert nested_key_group(None, 3, 128, 4) == 96 + 42 % 32


def test_nested_mapping_needs_a_multiple_and_says_which_values_are_valid():
    from spark_runtime.keygroups import nested_block_size, nested_key_group

    assert nested_block_size(128, 4) == 32 and nested_block_size(128, 128) == 1
    with pytest.raises(InvalidRangeError, match=r"maxKeyGroups: 128 is not a multiple of .* 3 partitions.*126 or 129"):
        nested_block_size(128, 3)
    with pytest.raises(InvalidRangeError, match="not a multiple"):
        nested_block_size(4, 8)  # more partitions than key groups
    with pytest.raises(InvalidRangeError, match=r"partition: 4 is outside 0..3"):
        nested_key_group("k", 4, 128, 4)


@pytest.mark.parametrize(
    ("start", "end", "partitions"),
    [
        (0, 128, [0, 1, 2, 3]),  # the root shard reads everything
        (0, 32, [0]),  # exactly one block
        (32, 64, [1]),
        (96, 128, [3]),  # the last block
        (5, 6, [0]),  # one key group
        (31, 33, [0, 1]),  # a range crossing a block edge
        (31, 32, [0]),  # ends on the edge
        (32, 33, [1]),  # starts on the edge
        (16, 32, [0]),  # both halves of a split inside block 0 read partition 0
        (0, 16, [0]),
        (40, 127, [1, 2, 3]),
    ],
)
def test_a_range_maps_to_the_partitions_whose_blocks_it_meets(start, end, partitions):
    from spark_runtime.keygroups import KeyGrouping, partitions_for_range

    assert partitions_for_range(KeyGroupRange(start, end), 128, 4) == partitions
    assert KeyGrouping(128, 4).partitions_to_read(KeyGroupRange(start, end)) == partitions
    assert KeyGrouping(128).partitions_to_read(KeyGroupRange(start, end)) is None, "not nested: read everything"


def test_the_partitions_of_a_tiling_cover_each_partition_and_a_range_owns_every_key_it_reads():
    from spark_runtime.keygroups import KeyGrouping, initial_ranges

    g = KeyGrouping(96, 3)
    for shards in (1, 2, 3, 5, 8, 96):
        read = [g.partitions_to_read(r) for r in initial_ranges(shards, 96)]
        assert {p for ps in read for p in ps} == {0, 1, 2}
        for r, ps in zip(initial_ranges(shards, 96), read, strict=True):
            # Every key group of the range lives in a partition the shard reads.
            assert {kg // 32 for kg in range(r.start, r.end)} == set(ps)


def test_nested_sql_text():
    from spark_runtime.keygroups import KeyGrouping, nested_key_group_sql

    assert nested_key_group_sql("key", "partition", 128, 4) == "(CAST(`partition` AS INT) * 32 + pmod(hash(`key`), 32))"
    assert KeyGrouping(128).sql() == key_group_sql("key", 128)
    assert KeyGrouping(128, 4).sql("k", "p") == "(CAST(`p` AS INT) * 32 + pmod(hash(`k`), 32))"

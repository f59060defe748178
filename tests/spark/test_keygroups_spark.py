"""The pure-Python key-group twin equals Spark's native expression on a local SparkSession.

Proves ``key_group(k, n) == pmod(hash(k), n)`` (via ``key_group_sql``) for >= 10,000 string keys (ASCII,
BMP and astral-plane unicode, the empty string, NUL, very long strings, every tail length mod 4), for integer
keys near the 32/64-bit limits (hashed as their decimal text, as the runtime does), for null, and for several
``maxKeyGroups`` values. Also checks the raw hashes, and the ``hashInt``/``hashLong`` twins.
"""

from __future__ import annotations

import os
import random
import sys

import pytest

from spark_runtime.keygroups import (
    MAX_KEY_GROUPS_LIMIT,
    key_group,
    key_group_sql,
    spark_hash_int,
    spark_hash_long,
    spark_hash_string,
)

pytestmark = pytest.mark.spark

pyspark_sql = pytest.importorskip("pyspark.sql")

MAX_KEY_GROUPS_VALUES = [1, 2, 7, 128, 1000, 4096, MAX_KEY_GROUPS_LIMIT]


@pytest.fixture(scope="module")
def spark():
    """A local SparkSession (reused if the session already has one; left running for other modules)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return (
        pyspark_sql.SparkSession.builder.master("local[2]")
        .appName("test_keygroups_spark")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )


def _random_text(rng: random.Random, length: int) -> str:
    """Characters from ASCII, Latin-1, other BMP planes (skipping surrogates) and astral planes."""
    pools = [(0x20, 0x7E), (0x00, 0x1F), (0x80, 0xFF), (0x100, 0xD7FF), (0xE000, 0xFFFF), (0x10000, 0x10FFFF)]
    chars = []
    for _ in range(length):
        lo, hi = rng.choice(pools)
        chars.append(chr(rng.randint(lo, hi)))
    return "".join(chars)


def string_keys() -> list[str]:
    rng = random.Random(20261122)
    keys = ["", "\x00", "a", "ab", "abc", "abcd", "abcde", "key-0", "é", "日本語", "😀", "𝄞x", "\U0010ffff"]
    keys += [f"user-{i}" for i in range(4000)]
    keys += [_random_text(rng, rng.randint(0, 12)) for _ in range(5000)]
    keys += ["".join(chr(0x1F600 + rng.randint(0, 79)) for _ in range(rng.randint(1, 9))) for _ in range(500)]
    keys += ["x" * n for n in (1000, 4097, 65_536)] + [_random_text(rng, n) for n in (1000, 10_001, 100_003)]
    keys += [str(n) for n in _integer_keys()]  # decimal text, as the runtime sees JSON integers
    return keys


def _integer_keys() -> list[int]:
    rng = random.Random(7)
    edges = []
    for bound in (2**31, 2**63):
        for delta in range(-3, 4):
            edges += [bound + delta, -bound + delta]
    edges += list(range(-50, 51))
    edges += [rng.randint(-(2**63), 2**63 - 1) for _ in range(500)]
    edges += [rng.randint(-(2**31), 2**31 - 1) for _ in range(500)]
    return [n for n in edges if -(2**63) <= n < 2**63]


def _kg_columns(column: str) -> list[str]:
    return [f"{key_group_sql(column, n)} AS kg_{n}" for n in MAX_KEY_GROUPS_VALUES]


def test_string_keys_match_spark(spark):
    keys = string_keys()
    assert len(keys) >= 10_000
    assert len(set(keys)) > 9_000
    df = spark.createDataFrame([(i, k) for i, k in enumerate(keys)], "i bigint, key string")
    rows = df.selectExpr("i", "hash(key) AS h", *_kg_columns("key")).collect()
    assert len(rows) == len(keys)
    mismatches = []
    for row in rows:
        key = keys[row.i]
        if spark_hash_string(key) != row.h:
            mismatches.append((key[:40], "hash", spark_hash_string(key), row.h))
        for n in MAX_KEY_GROUPS_VALUES:
            if key_group(key, n) != row[f"kg_{n}"]:
                mismatches.append((key[:40], n, key_group(key, n), row[f"kg_{n}"]))
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[:5]}"


def test_integer_keys_match_spark_as_decimal_text(spark):
    ints = _integer_keys()
    df = spark.createDataFrame([(i, n) for i, n in enumerate(ints)], "i bigint, k bigint")
    rows = (
        df.selectExpr("i", "CAST(k AS STRING) AS key", "hash(k) AS h_long")
        .selectExpr("i", "key", "h_long", *_kg_columns("key"))
        .collect()
    )
    for row in rows:
        n_key = ints[row.i]
        assert row.key == str(n_key)
        assert spark_hash_long(n_key) == row.h_long, n_key
        for n in MAX_KEY_GROUPS_VALUES:
            assert key_group(n_key, n) == row[f"kg_{n}"] == key_group(str(n_key), n), (n_key, n)


def test_int32_hash_twin_matches_spark(spark):
    ints = [n for n in _integer_keys() if -(2**31) <= n < 2**31]
    df = spark.createDataFrame([(i, n) for i, n in enumerate(ints)], "i int, k int")
    for row in df.selectExpr("i", "hash(k) AS h").collect():
        assert spark_hash_int(ints[row.i]) == row.h, ints[row.i]


def test_null_key_matches_spark(spark):
    df = spark.createDataFrame([(None,)], "key string")
    row = df.selectExpr("hash(key) AS h", *_kg_columns("key")).collect()[0]
    assert row.h == 42
    for n in MAX_KEY_GROUPS_VALUES:
        assert key_group(None, n) == row[f"kg_{n}"] == 42 % n


def test_key_group_sql_quotes_odd_column_names(spark):
    from pyspark.sql.types import StringType, StructField, StructType

    df = spark.createDataFrame([("abc",)], StructType([StructField("we`ird key", StringType())]))
    row = df.selectExpr(f"{key_group_sql('we`ird key', 128)} AS kg").collect()[0]
    assert row.kg == key_group("abc", 128)


NESTED = [(128, 4), (128, 128), (96, 3), (4096, 8), (MAX_KEY_GROUPS_LIMIT, 16), (7, 7)]
"""(maxKeyGroups, partitions) pairs for the nested mapping (partitions divide maxKeyGroups)."""


def test_nested_key_groups_match_spark(spark):
    """``nested_key_group(k, p, G, P) == partition * (G/P) + pmod(hash(k), G/P)`` in Spark, for the same keys
    (unicode, empty, NUL, 64 KiB, integers as text, null), each in a partition of its own choosing."""
    from spark_runtime.keygroups import nested_key_group, nested_key_group_sql

    keys: list[str | None] = [*string_keys(), None, "x" * 2048]
    rng = random.Random(15)
    rows_in = [(i, k, rng.randrange(MAX_KEY_GROUPS_LIMIT)) for i, k in enumerate(keys)]
    df = spark.createDataFrame(rows_in, "i bigint, key string, r int")
    columns = []
    for g, p in NESTED:
        columns.append(f"{nested_key_group_sql('key', f'p_{g}_{p}', g, p)} AS kg_{g}_{p}")
    with_partitions = df.selectExpr("i", "key", *[f"pmod(r, {p}) AS p_{g}_{p}" for g, p in NESTED])
    rows = with_partitions.selectExpr("i", *[f"p_{g}_{p}" for g, p in NESTED], *columns).collect()
    mismatches = []
    for row in rows:
        key = keys[row.i]
        for g, p in NESTED:
            partition = row[f"p_{g}_{p}"]
            want = nested_key_group(key, partition, g, p)
            if want != row[f"kg_{g}_{p}"]:
                mismatches.append(((key or "")[:30], g, p, partition, want, row[f"kg_{g}_{p}"]))
            if not partition * (g // p) <= want < (partition + 1) * (g // p):
                mismatches.append(((key or "")[:30], g, p, partition, want, "outside the partition's block"))
    assert len(rows) == len(keys) and not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[:5]}"

"""The pure helpers of ``bench/split_skew.py`` (the skew benchmark): Zipf weights, the scrape parser, the split
arithmetic and the checks that explain a missed target."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "split_skew.py"


@pytest.fixture(scope="module")
def skew():
    spec = importlib.util.spec_from_file_location("bench_split_skew", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_zipf_probabilities_sum_to_one_and_fall_with_rank(skew):
    p = skew.zipf_probabilities(1000, 1.1)
    assert len(p) == 1000
    assert sum(p) == pytest.approx(1.0)
    assert all(a > b for a, b in zip(p, p[1:], strict=False))
    assert p[0] / p[1] == pytest.approx(2**1.1)


def test_rows_per_key_group_uses_sparks_hash(skew):
    from spark_runtime.keygroups import key_group

    rows = skew.rows_per_key_group([("k0", 5), ("k1", 2), ("k0", 1)], 128)
    assert sum(rows) == 8
    assert rows[key_group("k0", 128)] >= 6


def test_parse_scrape_reads_the_load_map_and_the_row_counter(skew):
    text = (
        "# HELP taskshard_shard_key_group_rows_total Input rows per bucket of key groups.\n"
        "# TYPE taskshard_shard_key_group_rows_total counter\n"
        'taskshard_shard_key_group_rows_total{key_groups="0-2",shard="s",task="t"} 10.0\n'
        'taskshard_shard_key_group_rows_total{key_groups="2-4",shard="s",task="t"} 30.0\n'
        'taskshard_shard_key_group_rows_created{key_groups="0-2",shard="s",task="t"} 1.7e9\n'
        "# HELP taskshard_shard_rows_total Input rows.\n"
        "# TYPE taskshard_shard_rows_total counter\n"
        'taskshard_shard_rows_total{shard="s",task="t"} 55.0\n'
    )
    load, values = skew.parse_scrape(text)
    assert load == {(0, 2): 10.0, (2, 4): 30.0}
    assert values["taskshard_shard_rows_total"] == 55.0
    assert not any(name.endswith("_created") for name in values)


def test_spread_and_split_rows(skew):
    per_kg = skew.spread({(0, 2): 10.0, (2, 4): 30.0}, 0, 4)
    assert per_kg == [5.0, 5.0, 15.0, 15.0]
    assert skew.split_rows(per_kg, 2) == (10.0, 30.0)
    assert skew.split_rows([1, 2, 3], 5, start=4) == (1, 5)


def test_best_point_is_the_most_even_split(skew):
    assert skew.best_point([10, 10, 10, 10]) == (2, 0.0)
    at, value = skew.best_point([1, 1, 8, 1, 1])
    assert at in (2, 3) and value == pytest.approx(0.8)  # 2 vs 10 rows either way


def test_straddles_target_finds_a_hot_key_group_across_the_middle_only(skew):
    assert skew.straddles_target([40, 20, 40]) == [1]  # 0.4 .. 0.6 of the rows: no point within 15 %
    assert skew.straddles_target([20, 30, 30, 20]) == []  # a point between 1 and 2 splits 50 / 50
    assert skew.straddles_target([60, 20, 20]) == [0]  # 60 % alone: the best split is 60 / 40
    assert skew.straddles_target([25, 25, 25, 25]) == []


def test_map_errors_compares_every_bucket_with_the_counted_rows(skew):
    truth = [1, 2, 3, 4]
    assert skew.map_errors({(0, 1): 1, (1, 2): 2, (2, 3): 3, (3, 4): 4}, truth, 0, 4) == []
    errors = skew.map_errors({(0, 1): 3.0, (2, 3): 3, (3, 4): 4}, truth, 0, 4)
    assert errors == [("0-1", 3.0, 1), ("1-2", 0.0, 2)]

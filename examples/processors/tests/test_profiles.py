"""The example processor tested the way a user tests theirs: ProcessorHarness, no Spark, no cluster."""

from __future__ import annotations

import pytest
from taskshard_examples.profiles import DAY, SpendProfile

from spark_runtime.engine.testing import ProcessorHarness

pytestmark = pytest.mark.unit


def test_profile_accumulates_per_customer():
    h = ProcessorHarness(SpendProfile())
    h.run([{"key": "ann", "amount": 10.0}, {"key": "bob", "amount": 5.0}, {"key": "ann", "amount": 30.0}])
    out = h.run([{"key": "ann", "amount": 2.5}])
    assert out.set_index("key")[["orders", "spent", "largest"]].to_dict("index") == {
        "ann": {"orders": 3, "spent": 42.5, "largest": 30.0}
    }
    assert h.state()["bob"] == {"orders": 1, "spent": 5.0, "largest": 5.0}


def test_a_customer_idle_longer_than_the_ttl_starts_over():
    h = ProcessorHarness(SpendProfile({"forgetAfterDays": 1}), now_ms=0)
    h.run([{"key": "ann", "amount": 10.0}])
    h.run([{"key": "bob", "amount": 1.0}], now_ms=int(0.5 * DAY * 1000))
    out = h.run([{"key": "ann", "amount": 4.0}], now_ms=int(1.2 * DAY * 1000))
    assert out.set_index("key")["orders"].to_dict() == {"ann": 1}
    assert set(h.state()) == {"ann", "bob"}
    h.now_ms = int(1.6 * DAY * 1000)
    assert set(h.state()) == {"ann"}, "bob's state expired a day after his order"


def test_the_field_is_a_parameter():
    h = ProcessorHarness(SpendProfile({"field": "price"}))
    out = h.run([{"key": "c", "price": 3.0}])
    assert out["spent"].tolist() == [3.0]

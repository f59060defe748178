"""Polling helpers for tests: wait for a condition with a deadline and a useful failure message."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(probe: Callable[[], T], timeout: float, what: str, interval: float = 0.5) -> T:
    """Call ``probe`` until it returns a truthy value and return it; fail with ``what`` and the last value."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            last = probe()
        except Exception as e:  # noqa: BLE001 - keep polling, report the last error
            last = e
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last value: {last!r}")
        time.sleep(interval)


def get_json(kubectl, *args: str) -> dict:
    """``kubectl get ... -o json`` parsed; read through the API when ``kubectl`` offers it (see tests.kubeget)."""
    read = getattr(kubectl, "get_json", None)
    if read is not None:
        return read(*args)
    return json.loads(kubectl("get", *args, "-o", "json").stdout)

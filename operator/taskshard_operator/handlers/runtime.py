"""Process-wide state the thin handlers share: the API wrapper, the pod back-off, per-object coalescing.

Several triggers (a timer, the object's own watch events, its pods' events) may ask for a pass over the same
object at once. :class:`Coalescer` runs one pass per object at a time; a request that arrives meanwhile marks
the object dirty and the running pass repeats once, so nothing is lost and no worker thread ever blocks.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import kopf

from taskshard_operator.kube import Kube
from taskshard_operator.reconcile_shard import Backoff

log = logging.getLogger("taskshard_operator")

RESYNC_SECONDS = float(os.environ.get("TASKSHARD_RESYNC_SECONDS", "3"))
"""Interval of the safety-net timers (the watch events drive the common path)."""
BACKOFF_BASE = float(os.environ.get("TASKSHARD_BACKOFF_BASE", "2"))
BACKOFF_CAP = float(os.environ.get("TASKSHARD_BACKOFF_CAP", "60"))


class Coalescer:
    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._running: set[Any] = set()
        self._dirty: set[Any] = set()

    def run(self, key: Any, fn: Callable[[], None]) -> None:
        with self._guard:
            if key in self._running:
                self._dirty.add(key)
                return
            self._running.add(key)
        try:
            while True:
                fn()
                with self._guard:
                    if key not in self._dirty:
                        self._running.discard(key)
                        return
                    self._dirty.discard(key)
        except BaseException:
            with self._guard:
                self._running.discard(key)
                self._dirty.discard(key)
            raise


class Runtime:
    def __init__(self) -> None:
        self._kube: Kube | None = None
        self.backoff = Backoff(base=BACKOFF_BASE, cap=BACKOFF_CAP)
        self.coalescer = Coalescer()

    @property
    def kube(self) -> Kube:
        if self._kube is None:
            from taskshard_operator.kube import load_config  # noqa: PLC0415

            load_config()
            self._kube = Kube()
        return self._kube


RUNTIME = Runtime()


def emit(body: dict[str, Any], type_: str, reason: str, message: str) -> None:
    """Post a Kubernetes Event (through kopf's poster) and log it."""
    name = (body.get("metadata") or {}).get("name")
    log.log(logging.WARNING if type_ == "Warning" else logging.INFO, "%s %s: %s", reason, name, message)
    try:
        kopf.event(body, type=type_, reason=reason, message=message[:1000])
    except LookupError:  # outside a kopf handler context (e.g. tests): the log line above is all
        pass

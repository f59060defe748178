"""The TaskShard operator with every Kopf handler call and every Kubernetes API call timed (benchmarks only).

    TASKSHARD_BENCH_TIMINGS=/tmp/timings.json .venv/bin/python bench/operator_timed.py --namespace NS --standalone

Takes the arguments of ``python -m taskshard_operator`` and runs its ``main()`` after wrapping, with timers, each
handler function in Kopf's default registry (wall time of one call, not its queueing), every reconcile pass of the
work queue (``pass:task``, ``pass:shard``) and the methods of :class:`taskshard_operator.kube.Kube` (API calls).
Every 2 s, at exit and on SIGUSR1 it writes ``$TASKSHARD_BENCH_TIMINGS``::

    {"handlers": {"<id>": {"calls": n, "seconds": total, "max": s, "p50": s, "p99": s,
                            "slowest": [{"seconds": s, "object": "ns/name", "at": unix}, ...]}},
     "inflight": [{"handler": "<id>", "object": "ns/name", "seconds": s}, ...],   # calls not finished yet
     "api": {"<method>": {"calls": n, "seconds": total, "max": s, "errors": {"<exception type>": n}}},
     "written": unix}

Nothing in the operator is changed; the wrappers only measure.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import inspect
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_LOCK = threading.Lock()
_HANDLERS: dict[str, dict[str, Any]] = {}
_API: dict[str, dict[str, Any]] = {}
_INFLIGHT: dict[int, tuple[str, str, float]] = {}
_TOKENS = iter(range(1 << 62))
KEEP_SLOWEST = 10


def _record_handler(hid: str, seconds: float, obj: str) -> None:
    with _LOCK:
        h = _HANDLERS.setdefault(hid, {"durations": [], "slowest": []})
        h["durations"].append(seconds)
        slow = h["slowest"]
        if len(slow) < KEEP_SLOWEST or seconds > slow[-1]["seconds"]:
            slow.append({"seconds": round(seconds, 4), "object": obj, "at": round(time.time(), 3)})
            slow.sort(key=lambda s: -s["seconds"])
            del slow[KEEP_SLOWEST:]


def _record_api(name: str, seconds: float, error: str | None = None) -> None:
    with _LOCK:
        a = _API.setdefault(name, {"calls": 0, "seconds": 0.0, "max": 0.0, "errors": {}})
        a["calls"], a["seconds"], a["max"] = a["calls"] + 1, a["seconds"] + seconds, max(a["max"], seconds)
        if error is not None:
            a["errors"][error] = a["errors"].get(error, 0) + 1


def _quantile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))] if sorted_values else 0.0


def snapshot() -> dict[str, Any]:
    with _LOCK:
        handlers = {}
        for hid, h in _HANDLERS.items():
            d = sorted(h["durations"])
            handlers[hid] = {
                "calls": len(d), "seconds": round(sum(d), 4), "max": round(d[-1], 4) if d else 0.0,
                "p50": round(_quantile(d, 0.5), 4), "p99": round(_quantile(d, 0.99), 4), "slowest": list(h["slowest"]),
            }  # fmt: skip
        api = {k: {**v, "seconds": round(v["seconds"], 4), "max": round(v["max"], 4)} for k, v in _API.items()}
        now = time.perf_counter()
        inflight = [{"handler": h, "object": o, "seconds": round(now - t0, 4)} for h, o, t0 in _INFLIGHT.values()]
    inflight.sort(key=lambda c: -c["seconds"])
    return {"handlers": handlers, "inflight": inflight[:KEEP_SLOWEST], "api": api, "written": round(time.time(), 3),
            "pid": os.getpid()}  # fmt: skip


def dump(path: str) -> None:
    tmp = f"{path}.tmp"
    Path(tmp).write_text(json.dumps(snapshot(), indent=1))
    os.replace(tmp, path)


@contextlib.contextmanager
def _timed(hid: str, obj: str) -> Iterator[None]:
    """Times one call of handler ``hid`` on object ``obj`` (and lists it as in flight meanwhile)."""
    t0 = time.perf_counter()
    with _LOCK:
        token = next(_TOKENS)
        _INFLIGHT[token] = (hid, obj, t0)
    try:
        yield
    finally:
        with _LOCK:
            _INFLIGHT.pop(token, None)
        _record_handler(hid, time.perf_counter() - t0, obj)


def _timed_handler(hid: str, fn: Any) -> Any:
    """A timed handler, async if ``fn`` is (Kopf runs async handlers on its loop and sync ones in threads)."""

    def obj(kwargs: dict[str, Any]) -> str:
        return f"{kwargs.get('namespace') or ''}/{kwargs.get('name') or ''}"

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            with _timed(hid, obj(kwargs)):
                return await fn(*args, **kwargs)

        return async_wrapper

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _timed(hid, obj(kwargs)):
            return fn(*args, **kwargs)

    return wrapper


def _timed_pass(run: Any) -> Any:
    """Time every reconcile pass the work queue runs, as handler ``pass:task`` / ``pass:shard``."""

    def wrapper(key: Any) -> Any:
        kind, namespace, name = key
        with _timed(f"pass:{kind}", f"{namespace}/{name}"):
            return run(key)

    return wrapper


def _timed_method(name: str, fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0, error = time.perf_counter(), None
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # counted by type (e.g. Conflict: a conditional write refused), then re-raised
            error = type(exc).__name__
            raise
        finally:
            _record_api(name, time.perf_counter() - t0, error)

    return wrapper


def instrument() -> int:
    """Wrap every handler of Kopf's default registry and the Kube API methods. Returns the handler count."""
    from kopf._core.intents import registries

    import taskshard_operator.handlers  # noqa: F401 - registers the handlers
    from taskshard_operator.kube import Kube

    registry = registries.get_default_registry()
    count = 0
    # Daemons and timers ("_spawning") are not wrapped: a daemon's call lasts as long as its object.
    for sub in ("_activities", "_indexing", "_watching", "_changing", "_webhooks"):
        reg = getattr(registry, sub, None)
        if reg is None:
            continue
        for i, h in enumerate(reg._handlers):
            if getattr(h, "_fallback", False):  # kopf's own login fallbacks
                continue
            reg._handlers[i] = dataclasses.replace(h, fn=_timed_handler(str(h.id), h.fn))
            count += 1
    for name, value in list(vars(Kube).items()):
        if callable(value) and not name.startswith("_"):
            setattr(Kube, name, _timed_method(name, value))
    from taskshard_operator.handlers.runtime import RUNTIME

    RUNTIME.queue._run = _timed_pass(RUNTIME.queue._run)
    return count


def main(argv: list[str] | None = None) -> int:
    from taskshard_operator.__main__ import main as operator_main
    from taskshard_operator.__main__ import parse_args

    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    # The same environment main() sets, but before the handlers are imported (they read it at import time).
    if args.resync_seconds is not None:
        os.environ["TASKSHARD_RESYNC_SECONDS"] = str(args.resync_seconds)
    if args.backoff_base is not None:
        os.environ["TASKSHARD_BACKOFF_BASE"] = str(args.backoff_base)
    count = instrument()
    if path := os.environ.get("TASKSHARD_BENCH_TIMINGS"):
        atexit.register(dump, path)

        def loop() -> None:
            while True:
                time.sleep(2.0)
                with contextlib.suppress(OSError):
                    dump(path)

        threading.Thread(target=loop, daemon=True, name="bench-timings").start()
        signal.signal(signal.SIGUSR1, lambda *_: dump(path))  # a dump on demand
        dump(path)
    print(f"[operator_timed] {count} handlers and the Kube API methods are timed; timings -> {path}", flush=True)
    return operator_main(argv)


if __name__ == "__main__":
    sys.exit(main())

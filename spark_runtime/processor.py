"""The Python processor API under its first import path, ``spark_runtime.processor`` (Tasks name
``spark_runtime.processor:CountProcessor``). It lives in :mod:`spark_runtime.engine.api`; import from
``spark_runtime.engine`` in new code."""

from __future__ import annotations

from spark_runtime.engine.api import (
    CountProcessor,
    Processor,
    ProcessorError,
    SumProcessor,
    cached_processor,
    call_processor,
    load_processor,
)
from spark_runtime.engine.blob import (
    decode_state_table,
    encode_state_table,
    frame_to_state_table,
    run_processor,
    state_frame,
)

__all__ = [
    "CountProcessor",
    "Processor",
    "ProcessorError",
    "SumProcessor",
    "cached_processor",
    "call_processor",
    "decode_state_table",
    "encode_state_table",
    "frame_to_state_table",
    "load_processor",
    "run_processor",
    "state_frame",
]

"""Settings shared by every test tier."""

from __future__ import annotations

import os
import sys

# Spark's Python workers must run this interpreter (it has pandas, pyarrow, ...), not the system python3.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


SPARK_TIERS = frozenset({"spark", "cluster", "integration"})
"""The markers of the tiers whose tests start Spark driver JVMs with :data:`tests.jvm.DRIVER_JVM_OPTIONS`."""


def pytest_collection_finish(session) -> None:
    """Before the first test that starts a Spark driver, write the drivers' class archive (once per machine;
    :mod:`tests.jvm_archive`)."""
    if any(SPARK_TIERS.intersection(m.name for m in item.iter_markers()) for item in session.items):
        from tests.jvm import BASE_DRIVER_JVM_OPTIONS
        from tests.jvm_archive import ensure_archive

        ensure_archive(BASE_DRIVER_JVM_OPTIONS)

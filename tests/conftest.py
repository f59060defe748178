"""Settings shared by every test tier."""

from __future__ import annotations

import os
import sys

# Spark's Python workers must run this interpreter (it has pandas, pyarrow, ...), not the system python3.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

"""Event records: which fields a processor needs, and the parser that turns journal lines into typed columns
or dead letters.

No pyspark: the journal reader runs :func:`parse_lines_arrow` (Arrow's C++ JSON reader, the fast path for
chunks without a single bad record) and :func:`parse_lines` (pure Python, exact for every line, used for the
other chunks) inside Spark's Python workers, and the unit tests run both directly.

Record contract
---------------
An event is one JSON object per line. Its key is the field ``RecordSpec.key_field``: a JSON string is used as
is, a JSON integer as its decimal text (``7`` and ``"7"`` are the same key). Every other key value (float,
boolean, object, array, null) or a missing key makes the record a dead letter. A processor names the further
fields it reads with a type (:data:`FIELD_TYPES`); a missing field or a value of another JSON type makes the
record a dead letter too, unless the type ends with ``?`` (optional: missing or null gives null). A line longer
than :data:`MAX_RECORD_BYTES` or a key longer than :data:`MAX_KEY_BYTES` is a dead letter ``too_large``.

Dead letters carry a reason code (:class:`Reason`), a human-readable detail, the byte offset of the line in
its partition, the line itself (truncated) and the key when one could be read. Which shard writes a dead
letter (so that a task records each bad record exactly once across all its shards): the shard owning the
key group of its key, or, when no key could be read, the shard owning ``key_group(None, n)`` (the group
Spark's ``pmod(hash(NULL), n)`` gives). See :func:`dead_letter_key_group`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from spark_runtime.keygroups import key_group

__all__ = [
    "FIELD_TYPES",
    "MAX_KEY_BYTES",
    "MAX_RECORD_BYTES",
    "DeadLetter",
    "FieldSpec",
    "ParsedLines",
    "Reason",
    "RecordSpec",
    "arrow_type",
    "dead_letter_key_group",
    "parse_lines",
    "parse_lines_arrow",
    "too_large_line",
]

FIELD_TYPES: dict[str, str] = {
    "string": "string",
    "long": "bigint",
    "double": "double",
    "boolean": "boolean",
    "json": "string",
}
"""Event field types a processor may ask for, and the Spark SQL type of the column it receives.

``string``: a JSON string. ``long``: a JSON integer in the signed 64-bit range. ``double``: any finite JSON
number (integers included, booleans not). ``boolean``: ``true``/``false``. ``json``: any JSON value, passed
as its JSON text."""

ARROW_TYPES = ("string", "int", "bigint", "double", "float", "boolean", "binary")
"""The Spark SQL simple types :func:`arrow_type` maps (event columns, state columns, snapshot columns)."""


def arrow_type(spark_type: str) -> Any:
    """The Arrow type of Spark SQL simple type ``spark_type`` (one of :data:`ARROW_TYPES`; KeyError otherwise)."""
    import pyarrow as pa

    return {
        "string": pa.string(),
        "int": pa.int32(),
        "bigint": pa.int64(),
        "double": pa.float64(),
        "float": pa.float32(),
        "boolean": pa.bool_(),
        "binary": pa.binary(),
    }[spark_type]


MAX_LINE_IN_DEAD_LETTER = 16_384
"""Dead letters keep at most this many characters of the offending line."""
MAX_RECORD_BYTES = 1 << 20
"""The largest record (a journal line without its newline, a Kafka record's value) a shard processes: 1 MiB, as
Kafka's default ``message.max.bytes``. A longer one is a dead letter (``too_large``) without a key, and is never
parsed whole (a journal line that long is not even read whole): one huge record cannot crash-loop a shard."""
MAX_KEY_BYTES = 4096
"""The longest key (UTF-8 bytes) a shard processes; a record with a longer one is a dead letter (``too_large``)."""

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class Reason(StrEnum):
    """Why a record became a dead letter."""

    MALFORMED_JSON = "malformed_json"
    """The line is not valid JSON (or not UTF-8)."""
    NOT_AN_OBJECT = "not_an_object"
    """Valid JSON, but not an object (e.g. an array or a number)."""
    MISSING_KEY = "missing_key"
    """The key field is absent."""
    NULL_KEY = "null_key"
    """The key field is JSON null."""
    BAD_KEY_TYPE = "bad_key_type"
    """The key is neither a string nor an integer."""
    INVALID_KEY = "invalid_key"
    """The key string has no UTF-8 form (a lone surrogate escape such as ``"\\ud800"``)."""
    MISSING_FIELD = "missing_field"
    """A required field is absent or null."""
    BAD_FIELD_TYPE = "bad_field_type"
    """A field has the wrong JSON type (or is out of range for its type)."""
    TOO_LARGE = "too_large"
    """The record is longer than :data:`MAX_RECORD_BYTES` or its key than :data:`MAX_KEY_BYTES`."""


@dataclass(frozen=True)
class FieldSpec:
    """One event field a processor reads: ``name``, ``type`` (a key of :data:`FIELD_TYPES`), ``optional``."""

    name: str
    type: str
    optional: bool = False

    def __post_init__(self) -> None:
        if self.type not in FIELD_TYPES:
            raise ValueError(
                f"field {self.name!r}: type {self.type!r} is unknown; use one of {', '.join(FIELD_TYPES)} "
                "(append '?' for an optional field)"
            )

    @classmethod
    def parse(cls, name: str, type_text: str) -> FieldSpec:
        """``("amount", "double")`` or ``("note", "string?")``."""
        if not isinstance(type_text, str):
            raise ValueError(f"field {name!r}: type must be a string such as 'double', got {type_text!r}")
        optional = type_text.endswith("?")
        return cls(name, type_text.rstrip("?").strip().lower(), optional)

    @property
    def spark_type(self) -> str:
        return FIELD_TYPES[self.type]


RECORD_TIME = "record_time"
"""The source column of a record's own timestamp (Kafka's), with :attr:`RecordSpec.record_time`."""
RESERVED_COLUMNS = ("key", "key_group", "partition", "offset", "value", "seed", RECORD_TIME)


@dataclass(frozen=True)
class RecordSpec:
    """What a source must extract from each event: the key, typed fields and (optionally) the raw JSON text.

    The source's valid-record columns are, in order: ``key string, partition int, offset bigint``, one column
    per field (named as the field, typed by :attr:`FieldSpec.spark_type`), then ``value string`` (the whole
    line) when ``raw_value`` is set, then ``record_time bigint`` (the Kafka record's timestamp in epoch
    milliseconds) when ``record_time`` is set (a source without record timestamps refuses it).
    """

    key_field: str = "key"
    fields: tuple[FieldSpec, ...] = ()
    raw_value: bool = False
    record_time: bool = False

    def __post_init__(self) -> None:
        names = [f.name for f in self.fields]
        for name in names:
            if name in RESERVED_COLUMNS:
                raise ValueError(
                    f"field {name!r} clashes with a runtime column ({', '.join(RESERVED_COLUMNS)}); rename it"
                )
        if len(set(names)) != len(names):
            raise ValueError(f"fields: duplicate names in {names}")

    @classmethod
    def build(cls, key_field: str, fields: dict[str, str] | None = None, raw_value: bool = False) -> RecordSpec:
        return cls(key_field, tuple(FieldSpec.parse(n, t) for n, t in (fields or {}).items()), raw_value)

    def columns(self) -> list[tuple[str, str]]:
        """``[(name, spark_type), ...]`` of the valid-record columns (see the class docstring)."""
        cols = [("key", "string"), ("partition", "int"), ("offset", "bigint")]
        cols += [(f.name, f.spark_type) for f in self.fields]
        if self.raw_value:
            cols.append(("value", "string"))
        if self.record_time:
            cols.append((RECORD_TIME, "bigint"))
        return cols

    def ddl(self) -> str:
        """The Spark DDL schema of :meth:`columns`, e.g. ``key string, partition int, offset bigint``."""
        return ", ".join(f"`{n}` {t}" for n, t in self.columns())

    def to_json(self) -> str:
        return json.dumps(
            {
                "keyField": self.key_field,
                "fields": [[f.name, f.type + ("?" if f.optional else "")] for f in self.fields],
                "rawValue": self.raw_value,
                "recordTime": self.record_time,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> RecordSpec:
        data = json.loads(text)
        fields = tuple(FieldSpec.parse(n, t) for n, t in data["fields"])
        return cls(data["keyField"], fields, data["rawValue"], bool(data.get("recordTime", False)))


@dataclass(frozen=True)
class DeadLetter:
    """A record that could not be processed, with where it came from and why."""

    offset: int
    reason: Reason
    detail: str
    line: str
    key: str | None = None

    def to_record(self, *, shard: str, partition: int, key_group: int) -> dict[str, Any]:
        return {
            "shard": shard,
            "partition": partition,
            "offset": self.offset,
            "reason": str(self.reason),
            "detail": self.detail,
            "key": self.key if self.key is None or len(self.key) <= 256 else self.key[:256] + "...(truncated)",
            "key_group": key_group,
            "line": self.line,
        }


@dataclass
class ParsedLines:
    """Columns of the valid records of a chunk (parallel lists) and its dead letters."""

    keys: list[str] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    columns: dict[str, list[Any]] = field(default_factory=dict)
    values: list[str] | None = None
    dead: list[DeadLetter] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.keys)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}.get(
        type(value), type(value).__name__
    )


def _utf8_ok(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _convert(spec: FieldSpec, value: Any) -> tuple[bool, Any, str]:
    """(ok, converted, detail-if-not-ok) for one present, non-null field value."""
    t = type(value)
    kind = spec.type
    if kind == "double":
        if t is float:
            return True, value, ""
        if t is int:
            try:
                return True, float(value), ""
            except OverflowError:
                return False, None, f"field {spec.name!r}: integer {value} is out of range for double"
    elif kind == "long":
        if t is int:
            if _INT64_MIN <= value <= _INT64_MAX:
                return True, value, ""
            return False, None, f"field {spec.name!r}: integer {value} is outside the signed 64-bit range"
    elif kind == "string":
        if t is str:
            if _utf8_ok(value):
                return True, value, ""
            return False, None, f"field {spec.name!r}: string has no UTF-8 form (lone surrogate)"
    elif kind == "boolean":
        if t is bool:
            return True, value, ""
    elif kind == "json":
        return True, json.dumps(value, ensure_ascii=True, separators=(",", ":")), ""
    want = {"double": "a number", "long": "an integer", "string": "a string", "boolean": "a boolean"}[kind]
    return False, None, f"field {spec.name!r} must be {want}, got {_type_name(value)}"


def _line_text(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace").rstrip("\r")
    if len(text) > MAX_LINE_IN_DEAD_LETTER:
        text = text[:MAX_LINE_IN_DEAD_LETTER] + "...(truncated)"
    return text


def parse_lines(data: bytes, base_offset: int, spec: RecordSpec) -> ParsedLines:
    """Parse newline-terminated JSON lines.

    ``data`` must end at a line boundary (a final piece without ``\\n`` is parsed as a line too, so callers
    pass only complete lines). ``base_offset`` is the byte offset of ``data[0]`` in its partition; each record's
    offset is the offset of its line's first byte. Blank (whitespace-only) lines are skipped.
    """
    out = ParsedLines(columns={f.name: [] for f in spec.fields}, values=[] if spec.raw_value else None)
    keys, offsets, dead = out.keys, out.offsets, out.dead
    cols = [(f, out.columns[f.name]) for f in spec.fields]
    values = out.values
    key_field = spec.key_field
    decode = _DECODER.decode
    missing = object()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    pos = base_offset
    for raw in lines:
        start = pos
        pos += len(raw) + 1
        if len(raw) > MAX_RECORD_BYTES:
            dead.append(too_large_line(start, len(raw), raw[:MAX_LINE_IN_DEAD_LETTER]))
            continue
        try:
            text = raw.decode("utf-8")
            obj = decode(text)
        except UnicodeDecodeError:
            dead.append(DeadLetter(start, Reason.MALFORMED_JSON, "line is not valid UTF-8", _line_text(raw)))
            continue
        except ValueError as exc:
            if not raw.strip():
                continue  # blank line
            dead.append(DeadLetter(start, Reason.MALFORMED_JSON, f"not valid JSON: {exc}", _line_text(raw)))
            continue
        if type(obj) is not dict:
            dead.append(
                DeadLetter(start, Reason.NOT_AN_OBJECT, f"expected a JSON object, got {_type_name(obj)}", text[:200])
            )
            continue
        k = obj.get(key_field, missing)
        tk = type(k)
        if tk is str:
            if not _utf8_ok(k):
                dead.append(
                    DeadLetter(start, Reason.INVALID_KEY, "key has no UTF-8 form (lone surrogate)", _line_text(raw))
                )
                continue
            key = k
            if len(k) * 4 > MAX_KEY_BYTES and len(k.encode("utf-8")) > MAX_KEY_BYTES:
                detail = f"key of {len(k.encode('utf-8')):,} bytes is longer than {MAX_KEY_BYTES:,} bytes"
                dead.append(DeadLetter(start, Reason.TOO_LARGE, detail, _line_text(raw[:MAX_LINE_IN_DEAD_LETTER]), k))
                continue
        elif tk is int:
            key = str(k)
        elif k is missing:
            dead.append(DeadLetter(start, Reason.MISSING_KEY, f"missing key field {key_field!r}", _line_text(raw)))
            continue
        elif k is None:
            dead.append(DeadLetter(start, Reason.NULL_KEY, f"key field {key_field!r} is null", _line_text(raw)))
            continue
        else:
            dead.append(
                DeadLetter(
                    start,
                    Reason.BAD_KEY_TYPE,
                    f"key field {key_field!r} must be a string or an integer, got {_type_name(k)}",
                    _line_text(raw),
                )
            )
            continue
        if cols:
            converted = []
            failure = None
            for fspec, _ in cols:
                v = obj.get(fspec.name)
                if v is None:
                    if fspec.optional:
                        converted.append(None)
                        continue
                    what = "missing" if fspec.name not in obj else "null"
                    failure = (Reason.MISSING_FIELD, f"field {fspec.name!r} is {what}")
                    break
                ok, cv, detail = _convert(fspec, v)
                if not ok:
                    failure = (Reason.BAD_FIELD_TYPE, detail)
                    break
                converted.append(cv)
            if failure is not None:
                dead.append(DeadLetter(start, failure[0], failure[1], _line_text(raw), key))
                continue
            for (_, column), cv in zip(cols, converted, strict=True):
                column.append(cv)
        keys.append(key)
        offsets.append(start)
        if values is not None:
            values.append(text.rstrip("\r"))
    return out


_ARROW_FIELD_TYPES = {"string": "string", "long": "int64", "double": "float64", "boolean": "bool"}


def parse_lines_arrow(data: bytes, base_offset: int, spec: RecordSpec) -> tuple[Any, Any] | None:
    """The fast path of :func:`parse_lines`: Arrow's C++ JSON reader over the whole chunk.

    Returns ``(table, offsets)`` (a ``pyarrow.Table`` with ``key`` and the fields, and the ``int64`` line
    offsets) only when *every* line is a valid record under the same contract; otherwise ``None`` and the
    caller uses :func:`parse_lines` (which then also finds the dead letters). Arrow raises on any type
    mismatch (a number where a string is declared, a malformed line, a bad surrogate); the checks below catch
    what it accepts but the contract does not: null or missing values of required fields, ``NaN``/``Infinity``
    literals, invalid UTF-8, and lines that are not exactly one object (every line must start with ``{`` and
    rows must equal lines). Integer keys
    are retried as ``int64`` and turned into their decimal text. Fields of type ``json`` and ``raw_value``
    always take the slow path.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    if spec.raw_value or any(f.type == "json" for f in spec.fields) or not data:
        return None
    # Arrow's parser is laxer than the contract in two ways: it takes NaN/Infinity literals and it does not
    # validate UTF-8. Chunks that could hit either go to the exact parser.
    if b"NaN" in data or b"Infinity" in data:
        return None
    if not data.isascii():
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return None
    if not data.endswith(b"\n"):
        data += b"\n"
    raw = np.frombuffer(data, dtype=np.uint8)
    newlines = np.flatnonzero(raw == 10)
    starts = np.empty(len(newlines), dtype=np.int64)
    starts[0] = 0
    starts[1:] = newlines[:-1] + 1
    # Every line must start with "{": then no line is blank, each holds at least one object, and
    # rows == lines below means exactly one object per line (row i is line i).
    if np.any(raw[starts] != ord("{")):
        return None
    if np.any(newlines - starts > MAX_RECORD_BYTES):
        return None  # a too-large line: the exact parser makes it a dead letter
    fields = [(f.name, getattr(pa, _ARROW_FIELD_TYPES[f.type])()) for f in spec.fields]
    table = None
    for key_type in (pa.string(), pa.int64()):
        schema = pa.schema([(spec.key_field, key_type), *fields])
        try:
            table = pj.read_json(
                pa.BufferReader(data),
                read_options=pj.ReadOptions(use_threads=False, block_size=max(1 << 20, len(data) + 1)),
                parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
        break
    if table is None or table.num_rows != len(newlines):
        return None
    key = table.column(spec.key_field)
    if key.null_count:
        return None
    if key.type != pa.string():
        key = pc.cast(key, pa.string())
    if len(key) and pc.max(pc.binary_length(key)).as_py() > MAX_KEY_BYTES:
        return None  # a too-long key: the exact parser makes it a dead letter
    columns = {"key": key}
    for f in spec.fields:
        col = table.column(f.name)
        if col.null_count and not f.optional:
            return None
        if f.type == "double" and col.length() and not pc.all(pc.is_finite(col), skip_nulls=True).as_py():
            return None
        columns[f.name] = col
    return pa.table(columns), pa.array(starts + base_offset, pa.int64())


def too_large_line(offset: int, length: int, head: bytes) -> DeadLetter:
    """The dead letter of a line of ``length`` bytes over :data:`MAX_RECORD_BYTES` starting at ``offset`` (``head``:
    its first bytes, all the dead letter keeps). Without a key: the line is never parsed."""
    detail = f"line of {length:,} bytes is longer than {MAX_RECORD_BYTES:,} bytes"
    return DeadLetter(offset, Reason.TOO_LARGE, detail, _line_text(head) + "...(truncated)")


def dead_letter_key_group(dead: DeadLetter, max_key_groups: int) -> int:
    """The key group whose owner records ``dead``: its key's group, or ``key_group(None, n)`` without a key."""
    return key_group(dead.key, max_key_groups)

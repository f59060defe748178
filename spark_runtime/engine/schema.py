"""State and result schemas of a Python processor, and how a state schema may evolve while state exists.

A processor declares its per-key state as ``"name type [default <literal>], ..."``::

    state_schema = "count bigint, last string, label string default 'none'"

Types: ``string``, ``bigint`` (``long``), ``int`` (``integer``), ``double``, ``float``, ``boolean``, ``binary``.
A default is a Python literal of the column's type (``0``, ``1.5``, ``'x'``, ``True``) or ``null``.

Evolution (:meth:`StateSchema.evolve`), checked against the schema the state was written with, before anything
runs (the shard's preflight; a restore checks its parents' snapshot schemas the same way):

- **add** a column: allowed with a default (``default null`` is a default); existing keys read the default;
- **drop** a column: allowed; its values are gone, and its name stays retired (re-adding a dropped name is
  refused, since rows written before the drop still carry the old values);
- **widen** a type: ``int`` -> ``bigint``, ``float``, ``double``; ``bigint`` -> ``double``; ``float`` -> ``double``;
- anything else (a narrowing or unrelated type change, a new column without a default) is refused with
  :class:`SchemaIncompatible` naming the column.

State written under an older schema is never rewritten for an evolution: rows are conformed to the current schema
when they are read (:meth:`StateSchema.conform`), which costs what a batch touches. Pure: no Spark.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from spark_runtime.engine.runs import DELETED, EXPIRES, GROUP, HASH, run_schema
from spark_runtime.records import arrow_type

__all__ = [
    "COLUMN_TYPES",
    "Column",
    "SchemaIncompatible",
    "StateSchema",
    "parse_columns",
]

COLUMN_TYPES = {
    "string": "string",
    "bigint": "bigint",
    "long": "bigint",
    "int": "int",
    "integer": "int",
    "double": "double",
    "float": "float",
    "boolean": "boolean",
    "binary": "binary",
}
WIDENINGS = {
    ("int", "bigint"),
    ("int", "float"),
    ("int", "double"),
    ("bigint", "double"),
    ("float", "double"),
}
"""``(from, to)`` type changes that keep every stored value."""
RESERVED_NAMES = frozenset({"key", "key_group", HASH, DELETED, EXPIRES, GROUP})


class SchemaError(ValueError):
    """A schema declaration that cannot be parsed (the message names the part)."""


class SchemaIncompatible(ValueError):
    """A state schema change that would lose or misread existing state; ``column`` names the column."""

    def __init__(self, column: str, message: str) -> None:
        super().__init__(message)
        self.column = column


class _NoDefault:
    def __repr__(self) -> str:
        return "NO_DEFAULT"


NO_DEFAULT: Any = _NoDefault()


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    default: Any = NO_DEFAULT

    @property
    def has_default(self) -> bool:
        return self.default is not NO_DEFAULT

    def ddl(self) -> str:
        if not self.has_default:
            return f"{self.name} {self.type}"
        return f"{self.name} {self.type} default {_literal(self.default)}"


def _literal(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bytes):
        return repr(value)
    return repr(value)


_PART = re.compile(
    r"^\s*`?(?P<name>[A-Za-z_][A-Za-z0-9_]*)`?\s+(?P<type>[A-Za-z]+)(?:\s+default\s+(?P<default>.+?))?\s*$", re.I
)


def _split_top(text: str) -> list[str]:
    """Split on commas outside quotes."""
    parts, buf, quote = [], [], ""
    for ch in text:
        if quote:
            buf.append(ch)
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
            buf.append(ch)
        elif ch == ",":
            parts.append("".join(buf))
            buf = []
        else:
            buf.append(ch)
    parts.append("".join(buf))
    return [p for p in (x.strip() for x in parts) if p]


def _parse_default(raw: str, column: str, typ: str, what: str) -> Any:
    text = raw.strip()
    if text.lower() == "null":
        return None
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise SchemaError(f"{what}: the default of column {column!r}, {text!r}, is not a literal") from None
    ok = {
        "string": isinstance(value, str),
        "binary": isinstance(value, bytes),
        "boolean": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool) and -(2**31) <= value < 2**31,
        "bigint": isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63,
        "double": isinstance(value, int | float) and not isinstance(value, bool),
        "float": isinstance(value, int | float) and not isinstance(value, bool),
    }[typ]
    if not ok:
        raise SchemaError(f"{what}: the default of column {column!r}, {text}, is not a {typ}")
    return float(value) if typ in ("double", "float") else value


def parse_columns(text: str, *, what: str = "state_schema", defaults: bool = True) -> list[Column]:
    """``"count bigint, label string default 'x'"`` -> columns (types normalised). Raises :class:`SchemaError`."""
    cols: list[Column] = []
    for part in _split_top(text or ""):
        m = _PART.match(part)
        if m is None:
            raise SchemaError(f"{what}: {part!r} is not 'name type' (e.g. 'count bigint')")
        name, typ = m.group("name"), m.group("type").lower()
        if typ not in COLUMN_TYPES:
            raise SchemaError(f"{what}: column {name!r} has type {typ!r}; use one of {', '.join(COLUMN_TYPES)}")
        typ = COLUMN_TYPES[typ]
        if name in RESERVED_NAMES:
            raise SchemaError(f"{what}: column name {name!r} is reserved")
        default = NO_DEFAULT
        if m.group("default") is not None:
            if not defaults:
                raise SchemaError(f"{what}: column {name!r} may not have a default here")
            default = _parse_default(m.group("default"), name, typ, what)
        cols.append(Column(name, typ, default))
    if len({c.name for c in cols}) != len(cols):
        raise SchemaError(f"{what}: duplicate column names in {text!r}")
    return cols


@dataclass(frozen=True)
class StateSchema:
    """The state columns (besides ``key``) and the names retired by earlier drops."""

    columns: tuple[Column, ...]
    retired: frozenset[str] = field(default_factory=frozenset)

    @staticmethod
    def parse(text: str) -> StateSchema:
        cols = parse_columns(text)
        if not cols:
            raise SchemaError("state_schema: must name at least one column, e.g. 'count bigint'")
        return StateSchema(tuple(cols))

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def pairs(self) -> list[tuple[str, str]]:
        """``[(name, type)]``: the snapshot's columns besides ``key``."""
        return [(c.name, c.type) for c in self.columns]

    def ddl(self) -> str:
        """``count bigint, label string default 'x'`` (parses back to this schema, retired names aside)."""
        return ", ".join(c.ddl() for c in self.columns)

    def to_json(self) -> dict[str, Any]:
        return {"columns": self.ddl(), "retired": sorted(self.retired)}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> StateSchema:
        return StateSchema(tuple(parse_columns(str(data.get("columns", "")))), frozenset(data.get("retired") or ()))

    def evolve(self, old: StateSchema | None) -> StateSchema:
        """This schema as the successor of ``old`` (the schema state was written with; None: no state yet): the same
        columns, with the retired names of both. Raises :class:`SchemaIncompatible` (see the module docstring)."""
        if old is None:
            return self
        before = {c.name: c for c in old.columns}
        for col in self.columns:
            prev = before.get(col.name)
            if prev is None:
                if col.name in old.retired:
                    raise SchemaIncompatible(
                        col.name,
                        f"state_schema: column {col.name!r} was dropped earlier and its old values may still be "
                        "stored; give the new column another name",
                    )
                if not col.has_default:
                    raise SchemaIncompatible(
                        col.name,
                        f"state_schema: column {col.name!r} ({col.type}) is new and has no default, so existing keys "
                        f"would have no value: declare one, e.g. '{col.name} {col.type} default "
                        f"{_example_default(col.type)}' (or 'default null')",
                    )
            elif prev.type != col.type and (prev.type, col.type) not in WIDENINGS:
                raise SchemaIncompatible(
                    col.name,
                    f"state_schema: column {col.name!r} changes type from {prev.type} to {col.type}, which would not "
                    f"keep the stored values; allowed: {', '.join(f'{a} -> {b}' for a, b in sorted(WIDENINGS))}",
                )
        dropped = set(before) - set(self.names)
        return StateSchema(self.columns, frozenset(old.retired | dropped))

    def accepts_snapshot(self, snapshot_columns: Iterable[tuple[str, str]]) -> StateSchema:
        """This schema as the successor of a snapshot's columns (a restore): see :meth:`evolve`."""
        return self.evolve(StateSchema(tuple(Column(n, t) for n, t in snapshot_columns)))

    # ------------------------------------------------------------ Arrow

    def run_schema(self, *, ttl: bool) -> Any:
        return run_schema([(c.name, arrow_type(c.type)) for c in self.columns], ttl=ttl)

    def conform(self, table: Any, target: Any) -> Any:
        """``table`` (rows of a run or a snapshot written under any compatible earlier schema; None: no rows) with
        exactly the fields of ``target`` (an Arrow schema: this schema's run or state schema): missing state columns
        filled with their defaults, widened ones cast, dropped ones left out."""
        import pyarrow as pa

        if table is None:
            return target.empty_table()
        if table.schema.equals(target, check_metadata=False):
            return table
        by_name = {c.name: c for c in self.columns}
        arrays = []
        for f in target:
            if f.name in table.column_names:
                arrays.append(table.column(f.name).cast(f.type))
            elif f.name in by_name and by_name[f.name].has_default:
                arrays.append(pa.array([by_name[f.name].default] * table.num_rows, f.type))
            elif f.name in (EXPIRES, DELETED, GROUP):
                fill = False if f.name == DELETED else None
                arrays.append(pa.array([fill] * table.num_rows, f.type))
            else:
                raise SchemaIncompatible(f.name, f"state rows lack column {f.name!r} and it has no default")
        return pa.Table.from_arrays(arrays, schema=target)


def _example_default(typ: str) -> str:
    return {"string": "''", "binary": "b''", "boolean": "False"}.get(typ, "0")


def result_columns(text: str) -> list[Column]:
    """A processor's result schema: ``"result bigint"`` or several typed columns (no defaults)."""
    cols = parse_columns(text, what="result_schema", defaults=False)
    if not cols:
        raise SchemaError("result_schema: must name at least one column, e.g. 'result bigint'")
    return cols

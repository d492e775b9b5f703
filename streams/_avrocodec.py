"""Schema-specialised Avro binary readers and writers, generated once per schema as Python.

fastavro's ``schemaless_reader``/``schemaless_writer`` interpret the schema for every value
and pull each byte through ``BytesIO.read``; for a typical DecisionEvent (about a hundred
primitives) that costs ~30-40 µs per record here. The functions generated below walk the
schema once, at build time, and emit straight-line code for it: fields become locals, the
one-byte varint case is inlined, runs of doubles are read with one ``struct`` call, records
are built as dict displays. Writer-to-reader schema resolution (Avro spec, "Schema
Resolution") is compiled into the same code, so it costs nothing per record.

When the C extension :mod:`streams._avrofast` is built (it is, by ``pip install``), the same
walk produces a *program* instead of source: a small tree of tuples (records with their
field names, steps and defaults, unions with the reader branch per writer branch, enum
symbol tables) that ``_avrofast.Reader``/``Writer`` load once and run in C, building the
same values 4-7x faster than the generated Python. The generated Python stays the fallback
when the extension is missing (``native=False`` asks for it).

Conventions shared with :mod:`streams.serde`:

* Logical types are not applied: values read and written are the underlying Avro type
  (``timestamp-millis`` is an ``int`` of epoch milliseconds). The writer accepts anything
  fastavro accepts, because a record the fast path cannot take is handed to fastavro.
* A reader raises ``IndexError`` (the C reader: :class:`Truncated`, a subclass) or
  ``struct.error`` when the data ends early (the caller turns both into
  ``TruncatedPayload``), :class:`CorruptData` for bytes that cannot be Avro of the writer
  schema (bad union/enum index, negative length, runaway varint; the C reader also for
  invalid UTF-8, where the Python one raises ``UnicodeDecodeError``, and for a 10-byte
  varint past 64 bits, which the Python one reads as a too-large int) and
  :class:`Incompatible` for a value the reader schema has no place for (a writer enum
  symbol or union branch the reader lacks, where the spec makes that a per-value error).
* A schema the generator does not cover (recursive named types, unions of several non-null
  branches on the write side) raises :class:`Unsupported` at build time; the caller then
  uses fastavro for that schema.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Mapping
from io import BytesIO
from typing import Any

import fastavro

try:
    from streams import _avrofast
except ImportError:  # not built (a source tree without a compiler): the generated Python reads
    _avrofast = None

__all__ = [
    "CorruptData",
    "Incompatible",
    "Truncated",
    "Unsupported",
    "batch_decoder",
    "build_reader",
    "build_writer",
    "strip_logical_types",
]

Reader = Callable[[bytes, int], tuple[Any, int]]
Writer = Callable[[Any], bytes]
# (payloads, header, max_size, redo) -> (values, redo_count); see batch_decoder.
BatchDecoder = Callable[[list[bytes], bytes, int, object], tuple[list[Any], int]]

_PRIMITIVES = frozenset(("null", "boolean", "int", "long", "float", "double", "bytes", "string"))
# Reader type -> writer types it accepts (spec: "Schema Resolution", promotions).
_PROMOTIONS = {
    "long": ("int",),
    "float": ("int", "long"),
    "double": ("int", "long", "float"),
    "string": ("bytes",),
    "bytes": ("string",),
}


class CorruptData(ValueError):
    """The bytes cannot be Avro written with the writer schema."""


class Incompatible(ValueError):
    """The writer schema cannot be read with the reader schema (Avro resolution fails)."""


class Truncated(IndexError):
    """The data ends before the value does (raised by the C reader; an ``IndexError``)."""


class Unsupported(Exception):
    """The generator does not handle this schema; use fastavro for it."""


def strip_logical_types(schema: Any) -> Any:
    """A copy of a JSON schema without ``logicalType`` annotations (raw underlying values)."""
    if isinstance(schema, dict):
        return {k: strip_logical_types(v) for k, v in schema.items() if k != "logicalType"}
    if isinstance(schema, list):
        return [strip_logical_types(v) for v in schema]
    return schema


# ---------------------------------------------------------------------------------------
# Runtime helpers the generated code calls on its slow paths.


def _read_long(buf: bytes, pos: int) -> tuple[int, int]:
    """Zig-zag varint at ``pos``; returns (value, next position)."""
    b = buf[pos]
    pos += 1
    n = b & 0x7F
    shift = 7
    while b & 0x80:
        if shift > 63:
            raise CorruptData(f"varint longer than 10 bytes at offset {pos}")
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        shift += 7
    return (n >> 1) ^ -(n & 1), pos


def _read_length(buf: bytes, pos: int) -> tuple[int, int]:
    n, after = _read_long(buf, pos)
    if n < 0:
        raise CorruptData(f"negative length {n} at offset {pos}")
    return n, after


def _corrupt(message: str) -> CorruptData:
    return CorruptData(message)


def _incompatible(message: str) -> Incompatible:
    return Incompatible(message)


_DOUBLE_RUNS: dict[int, Callable[[bytes, int], tuple[float, ...]]] = {}
_FLOAT_RUNS: dict[int, Callable[[bytes, int], tuple[float, ...]]] = {}


def _doubles(count: int) -> Callable[[bytes, int], tuple[float, ...]]:
    unpack = _DOUBLE_RUNS.get(count)
    if unpack is None:
        unpack = struct.Struct(f"<{count}d").unpack_from
        if count <= 4096:
            _DOUBLE_RUNS[count] = unpack
    return unpack


def _floats(count: int) -> Callable[[bytes, int], tuple[float, ...]]:
    unpack = _FLOAT_RUNS.get(count)
    if unpack is None:
        unpack = struct.Struct(f"<{count}f").unpack_from
        if count <= 4096:
            _FLOAT_RUNS[count] = unpack
    return unpack


# Zig-zag varints of small non-negative ints, the common case for lengths and counts.
_SMALL = tuple(bytes([(n << 1)]) if n < 64 else None for n in range(64))


def _encode_long(n: int) -> bytes:
    if not -(1 << 63) <= n < (1 << 63):
        raise OverflowError(f"{n} does not fit an Avro long")
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _encode_int(n: int) -> bytes:
    if not -(1 << 31) <= n < (1 << 31):
        raise OverflowError(f"{n} does not fit an Avro int")
    return _encode_long(n)


def _len_prefix(n: int) -> bytes:
    return _SMALL[n] if n < 64 else _encode_long(n)  # type: ignore[return-value]


_DOUBLE_PACKS: dict[int, Callable[..., bytes]] = {}


def _pack_doubles(values: Any) -> bytes:
    count = len(values)
    pack = _DOUBLE_PACKS.get(count)
    if pack is None:
        pack = struct.Struct(f"<{count}d").pack
        if count <= 4096:
            _DOUBLE_PACKS[count] = pack
    return pack(*values)


_RUNTIME: dict[str, Any] = {
    "_read_long": _read_long,
    "_read_length": _read_length,
    "_corrupt": _corrupt,
    "_incompatible": _incompatible,
    "_doubles": _doubles,
    "_floats": _floats,
    "_unpack_double": struct.Struct("<d").unpack_from,
    "_unpack_float": struct.Struct("<f").unpack_from,
    "_pack_double": struct.Struct("<d").pack,
    "_pack_float": struct.Struct("<f").pack,
    "_pack_doubles": _pack_doubles,
    "_encode_long": _encode_long,
    "_encode_int": _encode_int,
    "_len_prefix": _len_prefix,
    "_SMALL": _SMALL,
}


# ---------------------------------------------------------------------------------------
# Schema helpers (over fastavro-parsed schemas, where every named reference is a full name).


def _parse(schema: Any) -> Any:
    return fastavro.parse_schema(schema) if not _is_parsed(schema) else schema


def _is_parsed(schema: Any) -> bool:
    return isinstance(schema, dict) and "__fastavro_parsed" in schema


class _Names:
    def __init__(self, parsed: Any):
        self.named: Mapping[str, Any] = parsed.get("__named_schemas", {}) if isinstance(parsed, dict) else {}

    def resolve(self, schema: Any) -> Any:
        """The schema itself, with a named reference replaced by its definition."""
        while isinstance(schema, str) and schema not in _PRIMITIVES:
            if schema not in self.named:
                raise Unsupported(f"unknown named type {schema!r}")
            schema = self.named[schema]
        if isinstance(schema, dict) and schema.get("type") in _PRIMITIVES:
            return schema["type"]
        return schema


def _kind(schema: Any) -> str:
    if isinstance(schema, str):
        return schema
    if isinstance(schema, list):
        return "union"
    return schema["type"]


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _names_match(w: Any, r: Any) -> bool:
    return _short(w["name"]) == _short(r["name"]) or _short(w["name"]) in {
        _short(a) for a in r.get("aliases", ())
    }


class _Source:
    """Accumulates generated lines and the constants they refer to."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.consts: dict[str, Any] = {}
        self._n = 0

    def tmp(self, prefix: str = "v") -> str:
        self._n += 1
        return f"{prefix}{self._n}"

    def const(self, value: Any, prefix: str = "K") -> str:
        name = self.tmp(f"_{prefix}")
        self.consts[name] = value
        return name

    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)

    def compile(self, name: str) -> Callable[..., Any]:
        text = "\n".join(self.lines)
        namespace: dict[str, Any] = dict(_RUNTIME)
        namespace.update(self.consts)
        exec(compile(text, f"<avro {name}>", "exec"), namespace)  # noqa: S102 - our own generated code
        fn = namespace[name]
        fn.__source__ = text
        return fn


# ---------------------------------------------------------------------------------------
# Readers


class _ReaderGen:
    def __init__(self, writer: Any, reader: Any):
        self.src = _Source()
        self.wnames = _Names(writer)
        self.rnames = _Names(reader)
        self.stack: list[str] = []
        self.skipping = 0  # >0 while reading a writer field the reader drops

    def _rres(self, r: Any) -> Any:
        return self.wnames.resolve(r) if self.skipping else self.rnames.resolve(r)

    # -- primitives -------------------------------------------------------------------

    def _long(self, target: str, ind: int) -> None:
        e = self.src.emit
        e(ind, "b = buf[pos]")
        e(ind, "if b < 128:")
        e(ind + 1, f"pos += 1; {target} = (b >> 1) ^ -(b & 1)")
        e(ind, "else:")
        e(ind + 1, f"{target}, pos = _read_long(buf, pos)")

    def _length(self, target: str, ind: int) -> None:
        # Lengths are non-negative: an even first byte below 128 is the whole varint.
        e = self.src.emit
        e(ind, "b = buf[pos]")
        e(ind, "if b & 0x81:")
        e(ind + 1, f"{target}, pos = _read_length(buf, pos)")
        e(ind, "else:")
        e(ind + 1, f"pos += 1; {target} = b >> 1")

    def _raw(self, target: str, ind: int, decode: bool) -> None:
        e = self.src.emit
        n = self.src.tmp("n")
        self._length(n, ind)
        e(ind, f"stop = pos + {n}")
        e(ind, "if stop > end: raise IndexError('string or bytes runs past the end')")
        e(ind, f"{target} = buf[pos:stop]{'.decode()' if decode else ''}; pos = stop")

    def _primitive(self, w: str, r: str, target: str, ind: int) -> None:
        e = self.src.emit
        if w == "null":
            e(ind, f"{target} = None")
        elif w == "boolean":
            e(ind, "b = buf[pos]; pos += 1")
            e(ind, "if b > 1: raise _corrupt(f'boolean byte {b} at offset {pos - 1}')")
            e(ind, f"{target} = b == 1")
        elif w in ("int", "long"):
            self._long(target, ind)
            if r in ("float", "double"):
                e(ind, f"{target} = float({target})")
        elif w == "float":
            e(ind, f"{target} = _unpack_float(buf, pos)[0]; pos += 4")
        elif w == "double":
            e(ind, f"{target} = _unpack_double(buf, pos)[0]; pos += 8")
        elif w == "string":
            self._raw(target, ind, decode=(r == "string"))
        elif w == "bytes":
            self._raw(target, ind, decode=(r == "string"))
        else:  # pragma: no cover - _PRIMITIVES is exhaustive
            raise Unsupported(w)

    # -- compatibility -----------------------------------------------------------------

    def _compatible(self, w: Any, r: Any) -> bool:
        w, r = self.wnames.resolve(w), self.rnames.resolve(r)
        wk, rk = _kind(w), _kind(r)
        if rk == "union":
            return any(self._compatible(w, branch) for branch in r)
        if wk == "union":
            return any(self._compatible(branch, r) for branch in w)
        if wk == rk:
            if wk in ("record", "enum"):
                return _names_match(w, r)
            if wk == "fixed":
                return _names_match(w, r) and w["size"] == r["size"]
            if wk == "array":
                return self._compatible(w["items"], r["items"])
            if wk == "map":
                return self._compatible(w["values"], r["values"])
            return True
        return wk in _PROMOTIONS.get(rk, ())

    def _pick_branch(self, w: Any, r_union: list[Any]) -> Any | None:
        # Spec: the first reader branch that matches; exact kind first, then promotions.
        wres = self.wnames.resolve(w)
        for branch in r_union:
            if _kind(self.rnames.resolve(branch)) == _kind(wres) and self._compatible(w, branch):
                return branch
        for branch in r_union:
            if self._compatible(w, branch):
                return branch
        return None

    # -- the walk ------------------------------------------------------------------------

    def read(self, w: Any, r: Any, target: str, ind: int) -> None:
        """Emit code that reads writer type ``w`` into ``target`` as reader type ``r``."""
        e = self.src.emit
        wname = w if isinstance(w, str) and w not in _PRIMITIVES else None
        if wname is not None:
            if wname in self.stack:
                raise Unsupported(f"recursive type {wname}")
            self.stack.append(wname)
        try:
            w = self.wnames.resolve(w)
            r = w if self.skipping else self.rnames.resolve(r)
            wk, rk = _kind(w), _kind(r)
            if wk == "union":
                self._union(w, r, target, ind)
                return
            if rk == "union":
                branch = self._pick_branch(w, r)
                if branch is None:
                    raise Incompatible(f"writer type {wk} matches no branch of the reader union")
                self.read(w, branch, target, ind)
                return
            if not self.skipping and not self._compatible(w, r):
                raise Incompatible(f"writer type {_describe(w)} cannot be read as {_describe(r)}")
            if wk in _PRIMITIVES:
                self._primitive(wk, rk, target, ind)
            elif wk == "record":
                self._record(w, r, target, ind)
            elif wk == "enum":
                self._enum(w, r, target, ind)
            elif wk == "fixed":
                e(ind, f"stop = pos + {int(w['size'])}")
                e(ind, "if stop > end: raise IndexError('fixed runs past the end')")
                e(ind, f"{target} = buf[pos:stop]; pos = stop")
            elif wk == "array":
                self._array(w, r, target, ind)
            elif wk == "map":
                self._map(w, r, target, ind)
            else:
                raise Unsupported(f"type {wk}")
        finally:
            if wname is not None:
                self.stack.pop()

    def _blocks(self, ind: int, count: str) -> int:
        """Open the block loop of an array or map; returns the indent of the item body."""
        e = self.src.emit
        e(ind, "while True:")
        self._long(count, ind + 1)
        e(ind + 1, f"if {count} == 0: break")
        e(ind + 1, f"if {count} < 0:")
        # A negative count is followed by the block's size in bytes, which we do not need.
        e(ind + 2, f"{count} = -{count}")
        self._long("_", ind + 2)
        return ind + 1

    def _array(self, w: Any, r: Any, target: str, ind: int) -> None:
        e = self.src.emit
        items = self.wnames.resolve(w["items"])
        ritems = self._rres(r["items"])
        count = self.src.tmp("c")
        e(ind, f"{target} = []")
        body = self._blocks(ind, count)
        if items in ("double", "float") and ritems in ("double", "float"):
            size, run = (8, "_doubles") if items == "double" else (4, "_floats")
            e(body, f"{target} += {run}({count})(buf, pos); pos += {size} * {count}")
            return
        item = self.src.tmp("i")
        e(body, f"for _ in range({count}):")
        self.read(w["items"], r["items"], item, body + 1)
        e(body + 1, f"{target}.append({item})")

    def _map(self, w: Any, r: Any, target: str, ind: int) -> None:
        e = self.src.emit
        count = self.src.tmp("c")
        key, value = self.src.tmp("k"), self.src.tmp("x")
        e(ind, f"{target} = {{}}")
        body = self._blocks(ind, count)
        e(body, f"for _ in range({count}):")
        self._raw(key, body + 1, decode=True)
        self.read(w["values"], r["values"], value, body + 1)
        e(body + 1, f"{target}[{key}] = {value}")

    def _enum(self, w: Any, r: Any, target: str, ind: int) -> None:
        e = self.src.emit
        out = _enum_symbols(w, r)
        symbols = self.src.const(out, "SYM")
        index = self.src.tmp("e")
        self._long(index, ind)
        e(ind, f"if not 0 <= {index} < {len(out)}: raise _corrupt(f'enum index {{{index}}} of {w['name']}')")
        e(ind, f"{target} = {symbols}[{index}]")
        if None in out:
            e(ind, f"if {target} is None: raise _incompatible(f'{w['name']} symbol {{{index}}} is unknown to the reader')")

    def _union(self, w: list[Any], r: Any, target: str, ind: int) -> None:
        e = self.src.emit
        index = self.src.tmp("u")
        self._long(index, ind)
        rk = _kind(r)
        for i, branch in enumerate(w):
            e(ind, f"{'if' if i == 0 else 'elif'} {index} == {i}:")
            if self.skipping:
                rbranch = branch
            elif rk == "union":
                rbranch = self._pick_branch(branch, r)
            else:
                rbranch = r if self._compatible(branch, r) else None
            if rbranch is None:
                # Spec: an error when this branch is written, not when the schemas are paired.
                e(ind + 1, f"raise _incompatible('union branch {i} of the writer has no match in the reader schema')")
            else:
                self.read(branch, rbranch, target, ind + 1)
        e(ind, "else:")
        e(ind + 1, f"raise _corrupt(f'union index {{{index}}} out of range')")

    def _record(self, w: Any, r: Any, target: str, ind: int) -> None:
        e = self.src.emit
        rfields = r["fields"]
        by_name: dict[str, dict[str, Any]] = {}
        for field in rfields:
            by_name[field["name"]] = field
            for alias in field.get("aliases", ()):
                by_name.setdefault(alias, field)
        locals_: dict[str, str] = {}
        for field in w["fields"]:
            rfield = by_name.get(field["name"])
            if rfield is None or rfield["name"] in locals_:
                self.skipping += 1  # not in the reader: read past it (into a name of its own:
                self.read(field["type"], None, self.src.tmp("s"), ind)  # "_" counts blocks)
                self.skipping -= 1
                continue
            local = self.src.tmp("f")
            self.read(field["type"], rfield["type"], local, ind)
            locals_[rfield["name"]] = local
        parts = []
        for field in rfields:
            name = field["name"]
            if name in locals_:
                parts.append(f"{name!r}: {locals_[name]}")
            elif "default" in field:
                parts.append(f"{name!r}: {self._default(field['type'], field['default'])}")
            else:
                raise Incompatible(f"reader field {r['name']}.{name} is not written and has no default")
        e(ind, f"{target} = {{{', '.join(parts)}}}")

    def _default(self, schema: Any, value: Any) -> str:
        """A Python expression that builds a fresh copy of a field default."""
        converted = _convert_default(self.rnames, schema, value)
        if _is_literal(converted):
            return repr(converted)
        return f"_deepcopy({self.src.const(converted, 'D')})"


def _enum_symbols(w: Any, r: Any) -> tuple[str | None, ...]:
    """The reader's symbol for each writer symbol index; None where it has none (no default)."""
    rsymbols = r["symbols"]
    default = r.get("default")
    out: list[str | None] = []
    for symbol in w["symbols"]:
        if symbol in rsymbols:
            out.append(symbol)
        elif default is not None:
            out.append(default)
        else:
            out.append(None)
    return tuple(out)


class _ReaderProgram(_ReaderGen):
    """The walk of :class:`_ReaderGen`, producing the program ``_avrofast.Reader`` runs.

    A node is a primitive op name (``"long_as_double"`` for an int or long read as a float
    or double; ``"string"``/``"bytes"`` by what the reader wants) or a tuple:
    ``("fixed", size)``, ``("enum", name, symbols)``, ``("union", branches)`` (one node per
    writer branch, None where the reader has no match), ``("array", items)``,
    ``("map", values)`` and ``("record", steps, fields)``: ``steps`` in writer order as
    ``(reader slot or -1 to drop, node)``, ``fields`` in reader order as
    ``(name, slot or -1, default)``. Errors at build time are those of the generated code.
    """

    def node(self, w: Any, r: Any) -> Any:
        wname = w if isinstance(w, str) and w not in _PRIMITIVES else None
        if wname is not None:
            if wname in self.stack:
                raise Unsupported(f"recursive type {wname}")
            self.stack.append(wname)
        try:
            w = self.wnames.resolve(w)
            r = w if self.skipping else self.rnames.resolve(r)
            wk, rk = _kind(w), _kind(r)
            if wk == "union":
                return ("union", tuple(self._branch(branch, r, rk) for branch in w))
            if rk == "union":
                branch = self._pick_branch(w, r)
                if branch is None:
                    raise Incompatible(f"writer type {wk} matches no branch of the reader union")
                return self.node(w, branch)
            if not self.skipping and not self._compatible(w, r):
                raise Incompatible(f"writer type {_describe(w)} cannot be read as {_describe(r)}")
            if wk in ("int", "long"):
                return "long_as_double" if rk in ("float", "double") else "long"
            if wk in ("string", "bytes"):
                return "string" if rk == "string" else "bytes"
            if wk in _PRIMITIVES:
                return wk
            if wk == "record":
                return self._record_node(w, r)
            if wk == "enum":
                return ("enum", w["name"], _enum_symbols(w, r))
            if wk == "fixed":
                return ("fixed", int(w["size"]))
            if wk == "array":
                return ("array", self.node(w["items"], r["items"]))
            if wk == "map":
                return ("map", self.node(w["values"], r["values"]))
            raise Unsupported(f"type {wk}")
        finally:
            if wname is not None:
                self.stack.pop()

    def _branch(self, branch: Any, r: Any, rk: str) -> Any:
        if self.skipping:
            rbranch = branch
        elif rk == "union":
            rbranch = self._pick_branch(branch, r)
        else:
            rbranch = r if self._compatible(branch, r) else None
        # Spec: an error when this branch is written, not when the schemas are paired.
        return None if rbranch is None else self.node(branch, rbranch)

    def _record_node(self, w: Any, r: Any) -> Any:
        rfields = r["fields"]
        by_name: dict[str, dict[str, Any]] = {}
        for field in rfields:
            by_name[field["name"]] = field
            for alias in field.get("aliases", ()):
                by_name.setdefault(alias, field)
        index = {field["name"]: i for i, field in enumerate(rfields)}
        read: set[str] = set()
        steps = []
        for field in w["fields"]:
            rfield = by_name.get(field["name"])
            if rfield is None or rfield["name"] in read:
                self.skipping += 1  # not in the reader: read past it
                steps.append((-1, self.node(field["type"], None)))
                self.skipping -= 1
                continue
            steps.append((index[rfield["name"]], self.node(field["type"], rfield["type"])))
            read.add(rfield["name"])
        fields = []
        for i, field in enumerate(rfields):
            name = field["name"]
            if name in read:
                fields.append((name, i, None))
            elif "default" in field:
                fields.append((name, -1, _convert_default(self.rnames, field["type"], field["default"])))
            else:
                raise Incompatible(f"reader field {r['name']}.{name} is not written and has no default")
        return ("record", tuple(steps), tuple(fields))


def _describe(schema: Any) -> str:
    kind = _kind(schema)
    return f"{kind} {schema['name']}" if isinstance(schema, dict) and "name" in schema else kind


def _convert_default(names: _Names, schema: Any, value: Any) -> Any:
    schema = names.resolve(schema)
    kind = _kind(schema)
    if kind == "union":
        return _convert_default(names, schema[0], value)
    if kind in ("int", "long"):
        return int(value)
    if kind in ("float", "double"):
        return float(value)
    if kind in ("bytes", "fixed"):
        return value.encode("latin-1") if isinstance(value, str) else bytes(value)
    if kind == "array":
        return [_convert_default(names, schema["items"], v) for v in value]
    if kind == "map":
        return {k: _convert_default(names, schema["values"], v) for k, v in value.items()}
    if kind == "record":
        out = {}
        for field in schema["fields"]:
            if field["name"] in value:
                out[field["name"]] = _convert_default(names, field["type"], value[field["name"]])
            else:
                out[field["name"]] = _convert_default(names, field["type"], field["default"])
        return out
    return value


def _is_literal(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, str, bytes)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_is_literal(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_literal(v) for k, v in value.items())
    return False


def build_reader(writer: Any, reader: Any | None = None, *, native: bool = True) -> Reader:
    """Compile ``read(buf, pos) -> (record, next_pos)`` for data written with ``writer``.

    Both schemas are JSON schemas (``schemas.load`` output or ``json.loads`` of a registry's
    text) or fastavro-parsed ones; ``reader`` defaults to ``writer``. Raises
    :class:`Incompatible` when Avro resolution fails and :class:`Unsupported` for a schema
    the generator does not cover. The reader runs in C when the extension is built and
    ``native`` is true, else as generated Python; both return the same values.
    """
    wparsed = _parse(strip_logical_types(writer) if not _is_parsed(writer) else writer)
    rparsed = wparsed if reader is None else _parse(strip_logical_types(reader) if not _is_parsed(reader) else reader)
    if native and _avrofast is not None:
        program = _ReaderProgram(wparsed, rparsed).node(wparsed, rparsed)
        try:
            return _avrofast.Reader(program, Truncated, CorruptData, Incompatible).decode
        except ValueError:  # nested deeper than _avrofast.MAX_DEPTH: Python has no such limit
            pass
    gen = _ReaderGen(wparsed, rparsed)
    gen.src.emit(0, "def read(buf, pos):")
    gen.src.emit(1, "end = len(buf)")
    gen.read(wparsed, rparsed, "out", 1)
    gen.src.emit(1, "return out, pos")
    if any("_deepcopy" in line for line in gen.src.lines):
        import copy

        gen.src.consts["_deepcopy"] = copy.deepcopy
    return gen.src.compile("read")


def batch_decoder(read: Reader) -> BatchDecoder | None:
    """The C batch entry point behind ``read`` (from :func:`build_reader`), else None.

    ``decode_batch(payloads, header, max_size, redo)`` decodes, after the header, every
    payload that is ``bytes``, at most ``max_size`` long and starts with ``header``; every
    other payload, and every one that raises :class:`Truncated`, :class:`CorruptData` or
    :class:`Incompatible`, is left as ``redo`` for the caller. It returns the values and
    how many were left.
    """
    program = getattr(read, "__self__", None)
    if _avrofast is not None and isinstance(program, _avrofast.Reader):
        return program.decode_batch
    return None


# ---------------------------------------------------------------------------------------
# Writers


class _WriterGen:
    def __init__(self, parsed: Any):
        self.src = _Source()
        self.names = _Names(parsed)
        self.parsed = parsed
        self.stack: list[str] = []

    def write(self, schema: Any, value: str, ind: int) -> None:
        e = self.src.emit
        name = schema if isinstance(schema, str) and schema not in _PRIMITIVES else None
        if name is not None:
            if name in self.stack:
                raise Unsupported(f"recursive type {name}")
            self.stack.append(name)
        try:
            schema = self.names.resolve(schema)
            kind = _kind(schema)
            if kind == "null":
                e(ind, f"if {value} is not None: raise TypeError('null field holds a value')")
            elif kind == "boolean":
                e(ind, f"if {value} is True: out += b'\\x01'")
                e(ind, f"elif {value} is False: out += b'\\x00'")
                e(ind, "else: raise TypeError('boolean expected')")
            elif kind == "int":
                e(ind, f"out += _SMALL[{value}] if 0 <= {value} < 64 else _encode_int({value})")
            elif kind == "long":
                e(ind, f"out += _SMALL[{value}] if 0 <= {value} < 64 else _encode_long({value})")
            elif kind == "float":
                e(ind, f"out += _pack_float({value})")
            elif kind == "double":
                e(ind, f"out += _pack_double({value})")
            elif kind == "string":
                raw = self.src.tmp("s")
                e(ind, f"{raw} = {value}.encode()")
                e(ind, f"out += _len_prefix(len({raw})); out += {raw}")
            elif kind == "bytes":
                e(ind, f"if not isinstance({value}, (bytes, bytearray)): raise TypeError('bytes expected')")
                e(ind, f"out += _len_prefix(len({value})); out += {value}")
            elif kind == "fixed":
                e(ind, f"if not isinstance({value}, (bytes, bytearray)) or len({value}) != {int(schema['size'])}:")
                e(ind + 1, "raise TypeError('fixed of the wrong size')")
                e(ind, f"out += {value}")
            elif kind == "enum":
                table = self.src.const(
                    {s: _encode_long(i) for i, s in enumerate(schema["symbols"])}, "ENUM"
                )
                e(ind, f"out += {table}[{value}]")
            elif kind == "array":
                self._array(schema, value, ind)
            elif kind == "map":
                self._map(schema, value, ind)
            elif kind == "record":
                self._record(schema, value, ind)
            elif kind == "union":
                self._union(schema, value, ind)
            else:
                raise Unsupported(f"type {kind}")
        finally:
            if name is not None:
                self.stack.pop()

    def _array(self, schema: Any, value: str, ind: int) -> None:
        e = self.src.emit
        e(ind, f"if not isinstance({value}, (list, tuple)): raise TypeError('array expected')")
        e(ind, f"if {value}:")
        e(ind + 1, f"out += _len_prefix(len({value}))")
        if self.names.resolve(schema["items"]) == "double":
            e(ind + 1, f"out += _pack_doubles({value})")
        else:
            item = self.src.tmp("i")
            e(ind + 1, f"for {item} in {value}:")
            self.write(schema["items"], item, ind + 2)
        e(ind, "out += b'\\x00'")

    def _map(self, schema: Any, value: str, ind: int) -> None:
        e = self.src.emit
        key, item, raw = self.src.tmp("k"), self.src.tmp("x"), self.src.tmp("s")
        e(ind, f"if {value}:")
        e(ind + 1, f"out += _len_prefix(len({value}))")
        e(ind + 1, f"for {key}, {item} in {value}.items():")
        e(ind + 2, f"{raw} = {key}.encode()")
        e(ind + 2, f"out += _len_prefix(len({raw})); out += {raw}")
        self.write(schema["values"], item, ind + 2)
        e(ind, "out += b'\\x00'")

    def _union(self, schema: list[Any], value: str, ind: int) -> None:
        # Only [null, T] / [T, null]: choosing among several typed branches is fastavro's job.
        kinds = [_kind(self.names.resolve(b)) for b in schema]
        if len(schema) != 2 or "null" not in kinds:
            raise Unsupported("union other than [null, T]")
        null_index = kinds.index("null")
        other = schema[1 - null_index]
        e = self.src.emit
        e(ind, f"if {value} is None:")
        e(ind + 1, f"out += {_encode_long(null_index)!r}")
        e(ind, "else:")
        e(ind + 1, f"out += {_encode_long(1 - null_index)!r}")
        self.write(other, value, ind + 1)

    def _record(self, schema: Any, value: str, ind: int) -> None:
        e = self.src.emit
        for field in schema["fields"]:
            local = self.src.tmp("f")
            if "default" in field:
                missing = self.src.const(_encode_default(self.parsed, field), "DEF")
                e(ind, f"{local} = {value}.get({field['name']!r}, _MISSING)")
                e(ind, f"if {local} is _MISSING:")
                e(ind + 1, f"out += {missing}")
                e(ind, "else:")
                self.write(field["type"], local, ind + 1)
            else:
                e(ind, f"{local} = {value}[{field['name']!r}]")
                self.write(field["type"], local, ind)


_MISSING = object()


def _encode_default(parsed: Any, field: Mapping[str, Any]) -> bytes:
    """The bytes fastavro writes for a field left out of a record: its default."""
    wrapper = {
        "type": "record",
        "name": "_DefaultProbe",
        "fields": [{"name": "value", "type": field["type"], "default": field["default"]}],
    }
    named = dict(parsed.get("__named_schemas", {}))
    probe = fastavro.parse_schema(wrapper, named_schemas=named)
    buf = BytesIO()
    fastavro.schemaless_writer(buf, probe, {})
    return buf.getvalue()


class _WriterProgram(_WriterGen):
    """The walk of :class:`_WriterGen`, producing the program ``_avrofast.Writer`` runs.

    Nodes as for :class:`_ReaderProgram`, except ``("enum", name, {symbol: encoded index})``,
    ``("optional", null branch index, node)`` for the only unions written,
    ``("record", ((name, node, encoded default or None), ...))`` and ``"int"`` kept apart
    from ``"long"`` for its range check.
    """

    def node(self, schema: Any) -> Any:
        name = schema if isinstance(schema, str) and schema not in _PRIMITIVES else None
        if name is not None:
            if name in self.stack:
                raise Unsupported(f"recursive type {name}")
            self.stack.append(name)
        try:
            schema = self.names.resolve(schema)
            kind = _kind(schema)
            if kind in _PRIMITIVES:
                return kind
            if kind == "fixed":
                return ("fixed", int(schema["size"]))
            if kind == "enum":
                return ("enum", schema["name"], {s: _encode_long(i) for i, s in enumerate(schema["symbols"])})
            if kind == "array":
                return ("array", self.node(schema["items"]))
            if kind == "map":
                return ("map", self.node(schema["values"]))
            if kind == "record":
                return (
                    "record",
                    tuple(
                        (
                            field["name"],
                            self.node(field["type"]),
                            _encode_default(self.parsed, field) if "default" in field else None,
                        )
                        for field in schema["fields"]
                    ),
                )
            if kind == "union":
                kinds = [_kind(self.names.resolve(b)) for b in schema]
                if len(schema) != 2 or "null" not in kinds:
                    raise Unsupported("union other than [null, T]")
                null_index = kinds.index("null")
                return ("optional", null_index, self.node(schema[1 - null_index]))
            raise Unsupported(f"type {kind}")
        finally:
            if name is not None:
                self.stack.pop()


def build_writer(schema: Any, *, native: bool = True) -> Writer:
    """Compile ``write(record) -> bytes`` producing exactly fastavro's bytes for ``schema``.

    The writer (C when the extension is built and ``native`` is true, else generated
    Python) raises ``KeyError``, ``TypeError``, ``AttributeError``, ``ValueError``,
    ``OverflowError`` or ``struct.error`` on any record it cannot take as-is; callers then
    hand the record to fastavro, which applies logical types and reports real errors.
    """
    parsed = _parse(strip_logical_types(schema) if not _is_parsed(schema) else schema)
    if native and _avrofast is not None:
        try:
            return _avrofast.Writer(_WriterProgram(parsed).node(parsed)).encode
        except ValueError:  # nested deeper than _avrofast.MAX_DEPTH
            pass
    gen = _WriterGen(parsed)
    gen.src.emit(0, "def write(rec):")
    gen.src.emit(1, "out = bytearray()")
    gen.write(parsed, "rec", 1)
    gen.src.emit(1, "return bytes(out)")
    gen.src.consts["_MISSING"] = _MISSING
    return gen.src.compile("write")

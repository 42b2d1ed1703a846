"""Records <-> protos, derived from the two field lists rather than written out field by field.

A record is a dataclass whose field names are its message's (``protos/farm/v1``). What a field becomes
is read from the message's descriptor, so no conversion lists the fields again:

- ``google.protobuf.Timestamp``: seconds since the epoch as a float (0.0 when unset);
- ``google.protobuf.Duration``: seconds as a float;
- ``google.protobuf.Struct`` / ``Value``: plain JSON values (a whole-number double comes back as an int);
- an enum: the lower-case name after the enum's prefix (``FLAG_TRUNCATED`` <-> ``"truncated"``; the zero
  value <-> ``""``);
- ``optional`` scalars: ``None`` when unset;
- a nested message: the nested dataclass; repeated fields and maps: lists and dicts.

Both farmd (``farmd.records``) and trainers (``farm_client.record``) convert through here, and a test
checks that each dataclass has exactly its message's fields.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import threading
import typing
from collections.abc import Callable
from typing import Any, TypeVar

from google.protobuf import duration_pb2, json_format, struct_pb2
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message
from google.type import money_pb2

from farm_client.record import takes_fields_in_order

R = TypeVar("R")
M = TypeVar("M", bound=Message)

_TIMESTAMP = "google.protobuf.Timestamp"
_DURATION = "google.protobuf.Duration"
_STRUCT = "google.protobuf.Struct"
_VALUE = "google.protobuf.Value"


def enum_prefix(enum: EnumDescriptor) -> str:
    """``FinishReason`` -> ``FINISH_REASON_``: buf's rule for enum value names."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", enum.name).upper() + "_"


@functools.cache
def _enum_maps(enum: EnumDescriptor) -> tuple[dict[str, int], dict[int, str]]:
    prefix = enum_prefix(enum)
    names = {v.number: v.name.removeprefix(prefix).lower() for v in enum.values}
    names[0] = ""
    return {name: number for number, name in names.items()}, names


def enum_names(enum: EnumDescriptor) -> list[str]:
    """The values a record may hold for ``enum``, "" (unspecified) aside."""
    return [name for name in _enum_maps(enum)[0] if name]


def _plain_number(value: Any) -> Any:
    """Struct numbers are doubles: a whole one within int range comes back as the int it was."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 53:
        return int(value)
    if isinstance(value, dict):
        return {k: _plain_number(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain_number(v) for v in value]
    return value


def _from_struct(struct: Any) -> dict[str, Any]:
    fields = struct.fields
    if not fields:  # most of a record's (its task's metadata, its sampling's extra): no walk of an empty map
        return {}
    return {k: _from_value(v) for k, v in fields.items()}


def _from_value(value: Any) -> Any:
    """A ``google.protobuf.Value`` as plain Python, read field by field rather than through JSON: what an
    attempt made a verifier report may hold an infinity or a NaN, which JSON has no word for (and
    ``json_format`` refuses), and a record that holds one must still be readable."""
    kind = value.WhichOneof("kind")
    if kind == "number_value":
        return _plain_number(value.number_value)
    if kind == "struct_value":
        return _from_struct(value.struct_value)
    if kind == "list_value":
        return [_from_value(v) for v in value.list_value.values]
    if kind in ("string_value", "bool_value"):
        return getattr(value, kind)
    return None


def _descriptor(message: Message) -> Descriptor:
    return typing.cast(Descriptor, message.DESCRIPTOR)


def _message_type(fd: FieldDescriptor) -> Descriptor:
    if fd.message_type is None:
        raise TypeError(f"{fd.full_name} is not a message field")
    return fd.message_type


def _is_map(fd: FieldDescriptor) -> bool:
    return fd.type == FieldDescriptor.TYPE_MESSAGE and bool(_message_type(fd).GetOptions().map_entry)


def seconds(value: Any) -> float:
    """A Timestamp or Duration as float seconds (whole seconds and nanos apart: ``ToNanoseconds() / 1e9``
    rounds an epoch time's last digits away)."""
    return float(value.seconds) + float(value.nanos) / 1e9


def duration(value: float) -> duration_pb2.Duration:
    """``value`` seconds as a Duration (the API's times are Durations, never seconds in a double). Its seconds and
    nanos take one sign, as a Duration's must: -0.25 s is 0 s and -250000000 ns, not -1 s and +750000000 ns."""
    out = duration_pb2.Duration()
    out.FromNanoseconds(round(value * 1e9))
    return out


def money(usd: float) -> money_pb2.Money:
    """``usd`` dollars as a google.type.Money: exact to the nano-dollar, so a box's fraction of a cent is kept."""
    units = math.trunc(usd)
    nanos = round((usd - units) * 1e9)
    if abs(nanos) >= 1_000_000_000:  # rounding carried into the next dollar
        units, nanos = units + (1 if nanos > 0 else -1), 0
    return money_pb2.Money(currency_code="USD", units=units, nanos=nanos)


def dollars(value: money_pb2.Money) -> float:
    """A google.type.Money in US dollars (farm's money is in USD: another currency is a ValueError)."""
    if value.currency_code not in ("", "USD"):
        raise ValueError(f"an amount in {value.currency_code[:8]!r}: farm's money is in USD")
    return float(value.units) + value.nanos / 1e9


def _set_seconds(message: Any, value: float) -> None:
    whole = math.floor(value)
    nanos = round((value - whole) * 1e9)
    if nanos >= 1_000_000_000:
        whole, nanos = whole + 1, nanos - 1_000_000_000
    message.seconds, message.nanos = whole, nanos


def _is_repeated(fd: FieldDescriptor) -> bool:
    return bool(fd.is_repeated)


# -- record -> message --------------------------------------------------------------------------------


def _kind(fd: FieldDescriptor) -> str:
    """How a field converts. Inline in a compiled converter: ``value`` (a scalar, or a list of them, as it is),
    ``seconds`` (a Timestamp or Duration as float seconds), ``record`` (a nested record, or a list of them).
    ``other`` (enums, maps, Struct, Value) goes through ``_to_setter`` and ``_from_getter``."""
    if fd.type == FieldDescriptor.TYPE_ENUM or _is_map(fd):
        return "other"
    if fd.type != FieldDescriptor.TYPE_MESSAGE:
        return "value"
    full = _message_type(fd).full_name
    if full in (_TIMESTAMP, _DURATION):
        if _is_repeated(fd):
            raise TypeError(f"{fd.full_name}: repeated {full} is not a record field type")
        return "seconds"
    return "other" if full in (_STRUCT, _VALUE) else "record"


def _to_setter(fd: FieldDescriptor) -> Callable[[Message, Any], None]:
    """A field of kind ``other``: ``setter(message, value)``."""
    name = fd.name
    if fd.type == FieldDescriptor.TYPE_ENUM:
        numbers = _enum_maps(fd.enum_type)[0]
        if _is_repeated(fd):
            # A value outside the closed set (a record from before it was closed) has no number: left out,
            # rather than sent as UNSPECIFIED, which would read back as a value nobody wrote.
            return lambda m, v: getattr(m, name).extend(numbers[x] for x in v if x in numbers and x)
        return lambda m, v: setattr(m, name, numbers.get(v, 0))
    if _is_map(fd):
        value_fd = _message_type(fd).fields_by_name["value"]
        if value_fd.type == FieldDescriptor.TYPE_MESSAGE:
            def set_map(m: Message, v: Any) -> None:
                for key, item in v.items():
                    to_message(item, getattr(m, name)[key])
            return set_map
        return lambda m, v: getattr(m, name).update(v)
    if _message_type(fd).full_name == _STRUCT:
        return lambda m, v: getattr(m, name).update(v) if v else None
    if _is_repeated(fd):  # google.protobuf.Value
        return lambda m, v: getattr(m, name).extend(json_format.ParseDict(x, struct_pb2.Value()) for x in v)
    return lambda m, v: json_format.ParseDict(v, getattr(m, name))


def _item_hint(hint: Any) -> Any:
    args = typing.get_args(hint)
    return args[-1] if args else Any


_Converter = Callable[..., Any]
_TO: dict[tuple[type, Descriptor], _Converter] = {}
_FROM: dict[tuple[type, Descriptor], _Converter] = {}
_COMPILING = threading.RLock()
"""Held while a converter is compiled: re-entered by the same thread for the record types nested in it."""
_IN_PROGRESS: set[tuple[int, type, Descriptor]] = set()


def _compiled(cache: dict[tuple[type, Descriptor], _Converter], key: tuple[type, Descriptor],
              compile_: Callable[[type, Descriptor], _Converter]) -> _Converter:
    """``key``'s converter, compiled once (under a lock: farmd and clients convert on several threads). A record
    type met again while its own converter is being compiled (a message that nests itself) gets one that looks
    the finished converter up when it runs; no other thread ever sees that stand-in."""
    known = cache.get(key)
    if known is not None:
        return known
    with _COMPILING:
        known = cache.get(key)
        if known is not None:
            return known
        mark = (id(cache), *key)
        if mark in _IN_PROGRESS:
            return lambda *args: cache[key](*args)
        _IN_PROGRESS.add(mark)
        try:
            known = cache[key] = compile_(*key)
        finally:
            _IN_PROGRESS.discard(mark)
        return known


def _fields(cls: type, descriptor: Descriptor) -> list[tuple[int, str, FieldDescriptor]]:
    out = []
    for i, f in enumerate(dataclasses.fields(cls)):
        fd = descriptor.fields_by_name.get(f.name)
        if fd is None:
            raise TypeError(f"{cls.__name__}.{f.name} has no field in {descriptor.full_name}")
        out.append((i, f.name, fd))
    return out


def _function(source: str, namespace: dict[str, Any]) -> _Converter:
    """``convert``, defined by ``source``: written by this module from descriptors' field names (identifiers, as
    protoc and dataclasses require), never from a message's contents. This is how ``dataclasses`` makes
    ``__init__``."""
    exec(source, namespace)
    return typing.cast(_Converter, namespace["convert"])


def _compile_to(cls: type, descriptor: Descriptor) -> _Converter:
    """``convert(record, message)`` for ``cls``, written out as straight-line code: a record is dozens of
    fields in a dozen nested messages, and a call per field was most of what a stream's protos cost."""
    ns: dict[str, Any] = {"set_seconds": _set_seconds}
    lines = ["def convert(r, m):"]
    for i, name, fd in _fields(cls, descriptor):
        lines += [f"    v = r.{name}", *("    " + line for line in _to_statements(fd, name, i, ns))]
    lines.append("    return m")
    return _function("\n".join(lines) + "\n", ns)


def _to_statements(fd: FieldDescriptor, name: str, i: int, ns: dict[str, Any]) -> list[str]:
    """Statements that put ``v`` (the record's value) into ``m.<name>`` (``_kind``)."""
    kind = _kind(fd)
    if kind == "value":
        if _is_repeated(fd):
            return [f"m.{name}.extend(v)"]
        if fd.has_presence:
            return ["if v is not None:", f"    m.{name} = v"]
        return [f"m.{name} = v"]
    if kind == "seconds":
        return ["if v:", f"    set_seconds(m.{name}, v)"]
    if kind == "record":
        ns[f"c{i}"] = to_message  # by the nested record's own type, whatever the field declares
        if _is_repeated(fd):
            return [f"field = m.{name}", "for item in v:", f"    c{i}(item, field.add())"]
        return ["if v is not None:", f"    c{i}(v, m.{name})"]
    ns[f"s{i}"] = _to_setter(fd)
    return [f"s{i}(m, v)"]


def to_message(record: Any, message: M) -> M:
    """Fill ``message`` (a new one, or a field of one) from ``record``; returns it."""
    convert = _compiled(_TO, (type(record), _descriptor(message)), _compile_to)
    return typing.cast(M, convert(record, message))


# -- message -> record --------------------------------------------------------------------------------


def _from_getter(fd: FieldDescriptor, hint: Any) -> Callable[[Message], Any]:
    """A field of kind ``other``: ``getter(message)``, its value as the record holds it."""
    name = fd.name
    if fd.type == FieldDescriptor.TYPE_ENUM:
        names = _enum_maps(fd.enum_type)[1]
        if _is_repeated(fd):
            return lambda m: [names.get(x, "") for x in getattr(m, name)]
        return lambda m: names.get(getattr(m, name), "")
    if _is_map(fd):
        value_fd = _message_type(fd).fields_by_name["value"]
        if value_fd.type == FieldDescriptor.TYPE_MESSAGE:
            item = _item_hint(hint)
            return lambda m: {k: from_message(v, item) for k, v in getattr(m, name).items()}
        return lambda m: dict(getattr(m, name))
    if _message_type(fd).full_name == _STRUCT:
        return lambda m: _from_struct(getattr(m, name))
    if _is_repeated(fd):  # google.protobuf.Value
        return lambda m: [_from_value(x) for x in getattr(m, name)]
    return lambda m: _from_value(getattr(m, name)) if m.HasField(name) else None


def _compile_from(cls: type, descriptor: Descriptor) -> _Converter:
    """``convert(message)`` for ``cls``: one call of the record's constructor with every field's value written
    out inline (``_from_expression``), by position where the constructor takes every field so (binding thirty
    keywords took three times as long as the call itself: a stream's trainer decodes hundreds of records a step)."""
    hints = typing.get_type_hints(cls)
    ns: dict[str, Any] = {"cls": cls, "seconds": seconds}
    positional = takes_fields_in_order(cls)
    values = [("" if positional else f"{name}=") + _from_expression(fd, hints[name], i, ns)
              for i, name, fd in _fields(cls, descriptor)]
    return _function(f"def convert(m):\n    return cls({', '.join(values)})\n", ns)


def _from_expression(fd: FieldDescriptor, hint: Any, i: int, ns: dict[str, Any]) -> str:
    """The expression of the record's value for ``m.<name>`` (``_kind``)."""
    name, value, kind = fd.name, f"m.{fd.name}", _kind(fd)
    if kind == "value":
        if _is_repeated(fd):
            return f"list({value})"
        return f"({value} if m.HasField({name!r}) else None)" if fd.has_presence else value
    if kind == "seconds":
        return f"(seconds({value}) if m.HasField({name!r}) else 0.0)"
    if kind == "record":
        item = _item_hint(hint) if _is_repeated(fd) else hint
        optional = not _is_repeated(fd) and type(None) in typing.get_args(hint)
        if optional:
            item = next(a for a in typing.get_args(hint) if a is not type(None))
        if isinstance(item, str) or item is Any:
            raise TypeError(f"{fd.full_name}: the record's type {hint!r} names no dataclass")
        ns[f"c{i}"] = _compiled(_FROM, (item, _message_type(fd)), _compile_from)
        if _is_repeated(fd):
            return f"[c{i}(x) for x in {value}]"
        return f"(c{i}({value}) if m.HasField({name!r}) else None)" if optional else f"c{i}({value})"
    ns[f"g{i}"] = _from_getter(fd, hint)
    return f"g{i}(m)"


def from_message(message: Message, cls: type[R]) -> R:
    """The ``cls`` record ``message`` holds."""
    return typing.cast(R, _compiled(_FROM, (cls, _descriptor(message)), _compile_from)(message))


def mismatched_fields(cls: type, descriptor: Descriptor) -> tuple[set[str], set[str]]:
    """(fields only the record has, fields only the message has): both empty when they are in step."""
    ours = {f.name for f in dataclasses.fields(cls)}
    theirs = set(descriptor.fields_by_name)
    return ours - theirs, theirs - ours

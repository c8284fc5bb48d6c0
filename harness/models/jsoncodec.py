"""Typed JSON for frozen dataclasses.

Records cross process and machine boundaries and are read back by later runs, so they are
plain JSON (never pickles), and reading one rebuilds the exact typed objects from the
dataclass annotations instead of trusting whatever dicts the file holds.

A field typed ``Any`` (a finding's measured numbers) has no annotation to rebuild from, so
it holds JSON data only (``json_data``, applied where such a field is set: tuples become
lists, keys strings), and a non-finite float inside it is written as ``{"$float": "inf"}``
(a typed float field writes plain "inf", which its annotation reads back). So every
record reads back equal to what was written.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import types
import typing
from typing import Any, Union


class SchemaError(ValueError):
    """A JSON document does not fit the dataclass it is read into."""


FLOAT_TAG = "$float"  # {"$float": "inf"}: a non-finite float where no annotation says float


def json_data(value: Any, where: str = "value") -> Any:
    """``value`` in JSON's data model, as it will read back: dicts with string keys, lists,
    strings, booleans, None, ints and floats (numpy's scalars become Python's). Anything
    else is refused: it could not be read back as it was."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, dict):
        return {str(k): json_data(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_data(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise TypeError(f"{where}: {type(value).__name__} is not JSON data")


def to_json(obj: Any, hint: Any = None) -> Any:
    """Turn dataclasses, tuples and dicts into JSON-ready values (floats stay exact).
    ``hint``: the annotation the value is held under, where known."""
    if hint is Any:
        return _data_to_json(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        hints = _hints(type(obj))
        return {f.name: to_json(getattr(obj, f.name), hints.get(f.name))
                for f in dataclasses.fields(obj)}
    args = typing.get_args(hint)
    if isinstance(obj, (list, tuple)):
        items = [args[0]] * len(obj) if len(args) == 2 and args[1] is Ellipsis else \
            list(args) if len(args) == len(obj) else [None] * len(obj)
        return [to_json(v, h) for v, h in zip(obj, items)]
    if isinstance(obj, dict):
        value_hint = args[1] if len(args) == 2 else None
        return {str(k): to_json(v, value_hint) for k, v in obj.items()}
    if isinstance(obj, float) and not math.isfinite(obj):
        return repr(obj)  # JSON has no inf/nan; "inf", "-inf" and "nan" read back as floats
    return obj


def _data_to_json(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _data_to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_data_to_json(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return {FLOAT_TAG: repr(value)}
    return value


def _data_from_json(data: Any) -> Any:
    if isinstance(data, dict):
        if set(data) == {FLOAT_TAG} and data[FLOAT_TAG] in ("inf", "-inf", "nan"):
            return float(data[FLOAT_TAG])
        return {k: _data_from_json(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_data_from_json(v) for v in data]
    return data


def from_json(cls: Any, data: Any, where: str = "$") -> Any:
    """Rebuild a value of type ``cls`` from :func:`to_json` output, checking every field."""
    origin = typing.get_origin(cls)
    args = typing.get_args(cls)
    if cls is Any:
        return _data_from_json(data)
    if origin in (Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return from_json(option, data, where)
            except SchemaError as exc:
                errors.append(str(exc))
        raise SchemaError("; ".join(errors))
    if origin is typing.Literal:
        if data not in args:
            raise SchemaError(f"{where}: {data!r} is not one of {args}")
        return data
    if origin is tuple:
        _expect(data, list, where)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_json(args[0], v, f"{where}[{i}]") for i, v in enumerate(data))
        if len(args) != len(data):
            raise SchemaError(f"{where}: expected {len(args)} items, got {len(data)}")
        return tuple(from_json(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, data)))
    if origin is dict:
        _expect(data, dict, where)
        return {k: from_json(args[1], v, f"{where}.{k}") for k, v in data.items()}
    if dataclasses.is_dataclass(cls):
        return _dataclass_from_json(cls, data, where)
    if cls is float:
        if isinstance(data, str) and data in ("inf", "-inf", "nan"):
            return float(data)
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise SchemaError(f"{where}: expected a number, got {data!r}")
        return float(data)
    if cls is int:
        if isinstance(data, bool) or not isinstance(data, int):
            raise SchemaError(f"{where}: expected an integer, got {data!r}")
        return data
    if cls in (str, bool):
        _expect(data, cls, where)
        return data
    if cls is type(None):
        if data is not None:
            raise SchemaError(f"{where}: expected null, got {data!r}")
        return None
    raise SchemaError(f"{where}: no JSON reading for type {cls!r}")


def _dataclass_from_json(cls: Any, data: Any, where: str) -> Any:
    _expect(data, dict, where)
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = set(data) - set(fields)
    if unknown:
        raise SchemaError(f"{where}: unknown fields {sorted(unknown)} for {cls.__name__}")
    values = {}
    for name, field in fields.items():
        if name in data:
            values[name] = from_json(hints[name], data[name], f"{where}.{name}")
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise SchemaError(f"{where}: missing field {name!r} of {cls.__name__}")
    return cls(**values)


@functools.cache
def _hints(cls: Any) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _expect(data: Any, kind: type, where: str) -> None:
    if not isinstance(data, kind) or (kind is not bool and isinstance(data, bool)):
        raise SchemaError(f"{where}: expected {kind.__name__}, got {type(data).__name__}")

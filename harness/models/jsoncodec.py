"""Typed JSON for frozen dataclasses.

Records cross process and machine boundaries and are read back by later runs, so they are
plain JSON (never pickles), and reading one rebuilds the exact typed objects from the
dataclass annotations instead of trusting whatever dicts the file holds.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any, Union


class SchemaError(ValueError):
    """A JSON document does not fit the dataclass it is read into."""


def to_json(obj: Any) -> Any:
    """Turn dataclasses, tuples and dicts into JSON-ready values (floats stay exact)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_json(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): to_json(v) for k, v in obj.items()}
    if isinstance(obj, float) and not math.isfinite(obj):
        return repr(obj)  # JSON has no inf/nan; "inf", "-inf" and "nan" read back as floats
    return obj


def from_json(cls: Any, data: Any, where: str = "$") -> Any:
    """Rebuild a value of type ``cls`` from :func:`to_json` output, checking every field."""
    origin = typing.get_origin(cls)
    args = typing.get_args(cls)
    if cls is Any:
        return data
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

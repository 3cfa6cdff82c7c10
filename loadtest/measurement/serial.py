"""The JSON serialisation every result and figure type shares (`Serial`).

Rules: a field that is None is left out of the file (a missing key reads back as None); a key
this code does not know (written by other code) is kept in `extra` and written back, so reading
and rewriting a file loses nothing. A field whose declared type is another `Serial` (alone, in a
list, or as the values of a dict) is read back as that type: the annotations are the schema."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from loadtest.files import write_json

S = TypeVar("S", bound="Serial")


@dataclass
class Serial:
    """A dataclass written as a JSON object (`to_json`) and read back from one (`from_json`)."""

    extra: dict[str, Any] = field(default_factory=dict, kw_only=True, repr=False, compare=False)
    """Keys of a file this code does not know, kept so that rewriting the file loses nothing."""

    def to_json(self) -> dict[str, Any]:
        out = {f.name: _encode(getattr(self, f.name)) for f in dataclasses.fields(self)
               if f.name != "extra" and getattr(self, f.name) is not None}
        return {**out, **self.extra}

    def save(self, path: Path) -> Path:
        return write_json(path, self.to_json())

    @classmethod
    def from_json(cls: type[S], data: dict[str, Any]) -> S:
        if isinstance(data, cls):
            return data
        if not isinstance(data, dict):
            raise ValueError(f"a {cls.__name__} is a JSON object, not {type(data).__name__}")
        decoders = _decoders(cls)
        known = {k: decoders[k](v) for k, v in data.items() if k in decoders and v is not None}
        return cls(**known, extra={k: v for k, v in data.items() if k not in decoders})


def _encode(value: Any) -> Any:
    if isinstance(value, Serial):
        return value.to_json()
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    return value


@functools.cache
def _decoders(cls: type[Serial]) -> dict[str, Callable[[Any], Any]]:
    hints = typing.get_type_hints(cls)
    return {f.name: _decoder(hints[f.name]) for f in dataclasses.fields(cls) if f.name != "extra"}


def _decoder(hint: Any) -> Callable[[Any], Any]:
    """How a JSON value becomes a value of type `hint` (only `Serial` types need reading)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _decoder(inner[0]) if len(inner) == 1 else _same
    if isinstance(hint, type) and issubclass(hint, Serial):
        return lambda v: hint.from_json(v) if isinstance(v, dict) else v
    if origin is list and args:
        item = _decoder(args[0])
        return _same if item is _same else (lambda v: [item(x) for x in v] if isinstance(v, list) else v)
    if origin is dict and len(args) == 2:
        value = _decoder(args[1])
        return _same if value is _same else (lambda v: {k: value(x) for k, x in v.items()} if isinstance(v, dict) else v)
    return _same


def _same(value: Any) -> Any:
    return value

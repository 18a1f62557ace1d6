"""Typed checkpoint state on top of the raw bytes layer."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
import weakref
from typing import Any, Generic, Protocol, TypeVar, overload

from .errors import ConfigError

__all__ = ["Codec", "JSONCodec"]

T = TypeVar("T")


class Codec(Protocol[T]):
    """Turns checkpoint values into bytes and back. Implementations must be thread-safe.

    ``decode(None)`` must return ``None`` without consulting the serializer, so a first
    acquisition (no checkpoint yet) decodes to ``None``.
    """

    def encode(self, value: T) -> bytes: ...

    def decode(self, data: bytes | bytearray | memoryview | None) -> T | None: ...


Codec.__module__ = "worklease"  # set outside the body: not a protocol member


class JSONCodec(Generic[T]):
    """A codec using the standard ``json`` module.

    Without ``cls`` it encodes JSON-compatible values (dicts, lists, str, numbers, bools,
    ``None``) and dataclass instances (as objects), and decodes to plain JSON values. With a
    dataclass ``cls`` it decodes into an instance of it, building nested dataclass fields
    (also inside ``list``/``tuple``/``dict`` and optional annotations) from their type hints.
    Unknown keys raise ``ValueError``; so do values that cannot be decoded. Scalar field values
    are passed through as JSON decoded them (not type-checked); use a validating codec
    (pydantic, msgspec) behind the ``Codec`` protocol when you need that.
    """

    __module__ = "worklease"

    @overload
    def __init__(self: JSONCodec[Any], cls: None = None) -> None: ...

    @overload
    def __init__(self, cls: type[T]) -> None: ...

    def __init__(self, cls: type[T] | None = None) -> None:
        if cls is not None and not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            raise ConfigError(f"JSONCodec cls must be a dataclass type, not {cls!r}")
        if cls is not None:
            _resolve(cls)  # every type hint it (and its nested dataclasses) decodes through
        self._cls = cls

    def encode(self, value: T) -> bytes:
        """Serialize ``value`` to compact UTF-8 JSON."""
        return json.dumps(
            value, default=_encode_default, separators=(",", ":"), ensure_ascii=False
        ).encode("utf-8")

    def decode(self, data: bytes | bytearray | memoryview | None) -> T | None:
        """Deserialize ``data``; ``None`` gives ``None`` without parsing."""
        if data is None:
            return None
        try:
            value = json.loads(bytes(data))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"checkpoint is not valid JSON: {exc}") from exc
        if self._cls is None:
            return typing.cast(T, value)
        return typing.cast(T, _build(self._cls, value))

    def __repr__(self) -> str:
        name = self._cls.__qualname__ if self._cls is not None else None
        return f"JSONCodec(cls={name})"


def _encode_default(value: object) -> object:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


_HINTS: weakref.WeakKeyDictionary[type, dict[str, Any]] = weakref.WeakKeyDictionary()
"""Resolved type hints of the dataclasses codecs decode into (filled when a codec is built)."""


def _resolve(cls: type) -> None:
    """Resolve the type hints of dataclass ``cls`` and of every dataclass they name."""
    pending = [cls]
    while pending:
        current = pending.pop()
        if current in _HINTS:
            continue
        try:
            hints = typing.get_type_hints(current)
        except Exception as exc:  # NameError, or anything an annotation raises
            raise ConfigError(
                f"JSONCodec cannot resolve the type hints of {current.__qualname__} "
                f"({type(exc).__name__}: {exc}); define the dataclass (and the types its "
                "fields name) at module level"
            ) from None
        _HINTS[current] = hints
        pending.extend(_dataclasses_in(hints.values()))


def _dataclasses_in(hints: typing.Iterable[Any]) -> list[type]:
    found: list[type] = []
    stack = list(hints)
    while stack:
        hint = stack.pop()
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            found.append(hint)
        stack.extend(arg for arg in typing.get_args(hint) if arg is not Ellipsis)
    return found


def _build(hint: Any, value: Any) -> Any:
    """Build a value of type ``hint`` from decoded JSON."""
    origin = typing.get_origin(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ValueError(f"expected an object for {hint.__qualname__}, got {value!r}")
        if hint not in _HINTS:
            try:
                _resolve(hint)
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        hints = _HINTS[hint]
        fields = {f.name: f for f in dataclasses.fields(hint)}
        unknown = set(value) - set(fields)
        if unknown:
            raise ValueError(f"unknown fields for {hint.__qualname__}: {sorted(unknown)}")
        built = {key: _build(hints.get(key, Any), item) for key, item in value.items()}
        kwargs = {key: item for key, item in built.items() if fields[key].init}
        try:
            instance = hint(**kwargs)
        except TypeError as exc:
            raise ValueError(f"cannot build {hint.__qualname__}: {exc}") from exc
        for key, item in built.items():
            if not fields[key].init:  # set after construction (frozen ones too)
                object.__setattr__(instance, key, item)
        return instance
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(hint):
            return None
        errors = []
        for option in typing.get_args(hint):
            if option is type(None):
                continue
            try:
                return _build(option, value)
            except ValueError as exc:
                errors.append(str(exc))
        raise ValueError("; ".join(errors) or f"cannot decode {value!r}")
    if origin in (list, set, frozenset) and isinstance(value, list):
        (item_hint,) = typing.get_args(hint) or (Any,)
        return origin(_build(item_hint, item) for item in value)
    if origin is tuple and isinstance(value, list):
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_build(args[0], item) for item in value)
        if args and len(args) == len(value):
            return tuple(_build(a, item) for a, item in zip(args, value, strict=True))
        return tuple(value)
    if origin is dict and isinstance(value, dict):
        _, value_hint = typing.get_args(hint) or (Any, Any)
        return {key: _build(value_hint, item) for key, item in value.items()}
    return value

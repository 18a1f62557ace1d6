"""JSONCodec: plain JSON values and dataclasses."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worklease import Codec, ConfigError, JSONCodec


@dataclass
class Point:
    x: int
    y: int


@dataclass
class Progress:
    offset: int
    name: str
    origin: Point
    path: list[Point] = field(default_factory=list)
    best: Point | None = None
    legacy: Optional[Point] = None  # noqa: UP045 - the typing spelling must work too
    tags: dict[str, Point] = field(default_factory=dict)
    pair: tuple[int, str] = (0, "")
    spread: tuple[Point, ...] = ()


@dataclass(frozen=True)
class Frozen:
    value: float
    note: str | None = None


def test_decode_none_does_not_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(*args: object, **kwargs: object) -> object:
        raise AssertionError("json.loads must not be called for None")

    monkeypatch.setattr(json, "loads", explode)
    assert JSONCodec().decode(None) is None
    assert JSONCodec(Point).decode(None) is None


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        -17,
        2**70,
        1.5,
        -0.25,
        "",
        "text",
        "ünïcödé 🙂",
        [],
        [1, "a", None, [2.5]],
        {},
        {"a": 1, "nested": {"b": [True, None]}},
    ],
)
def test_round_trip_plain_values(value: object) -> None:
    codec: JSONCodec[Any] = JSONCodec()
    data = codec.encode(value)
    assert isinstance(data, bytes)
    assert codec.decode(data) == value


def test_encode_is_compact_utf8() -> None:
    assert JSONCodec().encode({"a": [1, 2], "é": "ü"}) == '{"a":[1,2],"é":"ü"}'.encode()


def test_decode_accepts_bytes_like() -> None:
    codec: JSONCodec[Any] = JSONCodec()
    assert codec.decode(bytearray(b'{"a":1}')) == {"a": 1}
    assert codec.decode(memoryview(b"[1,2]")) == [1, 2]


def test_encode_dataclass_without_cls_decodes_to_dict() -> None:
    codec: JSONCodec[Any] = JSONCodec()
    data = codec.encode(Point(1, 2))
    assert json.loads(data) == {"x": 1, "y": 2}
    assert codec.decode(data) == {"x": 1, "y": 2}


def test_encode_refuses_unserializable() -> None:
    with pytest.raises(TypeError):
        JSONCodec().encode({"a": object()})


def test_round_trip_simple_dataclass() -> None:
    codec = JSONCodec(Point)
    decoded = codec.decode(codec.encode(Point(3, 4)))
    assert decoded == Point(3, 4)
    assert type(decoded) is Point


def test_round_trip_frozen_dataclass_with_optional() -> None:
    codec = JSONCodec(Frozen)
    assert codec.decode(codec.encode(Frozen(1.5))) == Frozen(1.5)
    assert codec.decode(codec.encode(Frozen(2.0, "n"))) == Frozen(2.0, "n")


def test_round_trip_nested_dataclass() -> None:
    value = Progress(
        offset=10,
        name="job",
        origin=Point(0, 0),
        path=[Point(1, 1), Point(2, 3)],
        best=Point(9, 9),
        legacy=Point(7, 7),
        tags={"start": Point(5, 5)},
        pair=(4, "four"),
        spread=(Point(1, 2), Point(3, 4)),
    )
    codec = JSONCodec(Progress)
    decoded = codec.decode(codec.encode(value))
    assert decoded == value
    assert decoded is not None
    assert type(decoded.origin) is Point
    assert all(type(p) is Point for p in decoded.path)
    assert type(decoded.best) is Point
    assert type(decoded.legacy) is Point
    assert type(decoded.tags["start"]) is Point
    assert isinstance(decoded.pair, tuple)
    assert all(type(p) is Point for p in decoded.spread)


def test_optional_fields_none_and_defaults() -> None:
    codec = JSONCodec(Progress)
    value = Progress(offset=1, name="n", origin=Point(0, 1))
    assert codec.decode(codec.encode(value)) == value
    assert codec.decode(b'{"offset":1,"name":"n","origin":{"x":0,"y":1}}') == value


def test_unknown_field_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown"):
        JSONCodec(Point).decode(b'{"x":1,"y":2,"z":3}')


def test_unknown_nested_field_is_a_value_error() -> None:
    data = b'{"offset":1,"name":"n","origin":{"x":0,"y":1,"w":2}}'
    with pytest.raises(ValueError):
        JSONCodec(Progress).decode(data)


def test_missing_field_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        JSONCodec(Point).decode(b'{"x":1}')


def test_wrong_shape_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        JSONCodec(Point).decode(b"[1,2]")


@pytest.mark.parametrize("data", [b"{", b"not json", b"", b"\xff\xfe", b'{"a":1}x'])
def test_invalid_json_is_a_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        JSONCodec().decode(data)
    with pytest.raises(ValueError):
        JSONCodec(Point).decode(data)


@pytest.mark.parametrize("cls", [int, dict, str, Point(1, 2), "Point", list[Point]])
def test_non_dataclass_cls_is_a_config_error(cls: Any) -> None:
    with pytest.raises(ConfigError):
        JSONCodec(cls)


def test_codec_protocol_and_repr() -> None:
    plain: Codec[Any] = JSONCodec()
    typed: Codec[Point] = JSONCodec(Point)
    assert repr(plain) == "JSONCodec(cls=None)"
    assert repr(typed) == "JSONCodec(cls=Point)"


_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=25,
)


@given(_json_values)
def test_round_trip_property(value: object) -> None:
    codec: JSONCodec[Any] = JSONCodec()
    assert codec.decode(codec.encode(value)) == value


@given(st.integers(), st.integers())
def test_dataclass_round_trip_property(x: int, y: int) -> None:
    codec = JSONCodec(Point)
    assert codec.decode(codec.encode(Point(x, y))) == Point(x, y)


# -- issue 11, defect 8 ---------------------------------------------------------------------


@dataclass
class Counted:
    items: list[int]
    total: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.total = sum(self.items)


@dataclass
class Broken:
    part: Missing  # type: ignore[name-defined]  # noqa: F821 - never defined, on purpose


@dataclass
class Wrapper:
    parts: list[Broken]


@dataclass(frozen=True)
class Stamped:
    name: str
    revision: int = field(init=False, default=7)


def test_init_false_fields_round_trip() -> None:
    """Defect 8: a dataclass with an init=False field could not decode its own output."""
    codec = JSONCodec(Counted)
    value = Counted([1, 2, 3])
    assert json.loads(codec.encode(value)) == {"items": [1, 2, 3], "total": 6}
    assert codec.decode(codec.encode(value)) == value
    stored = Counted([1])
    stored.total = 99  # the stored value wins over what __post_init__ computes
    assert codec.decode(codec.encode(stored)).total == 99  # type: ignore[union-attr]


def test_init_false_field_of_a_frozen_dataclass_round_trips() -> None:
    codec = JSONCodec(Stamped)
    value = Stamped("a")
    object.__setattr__(value, "revision", 12)
    decoded = codec.decode(codec.encode(value))
    assert decoded == value
    assert decoded is not None
    assert decoded.revision == 12


def test_init_false_field_may_be_absent() -> None:
    """Checkpoints written before the field existed still decode (the default applies)."""
    assert JSONCodec(Counted).decode(b'{"items": [4]}') == Counted([4])


def test_local_dataclass_with_resolvable_hints_works() -> None:
    """Under ``from __future__ import annotations`` a dataclass defined in a function decodes
    when its annotations name only module-level and builtin types."""

    @dataclass
    class Local:
        origin: Point
        names: list[str]

    codec = JSONCodec(Local)
    value = Local(Point(1, 2), ["a"])
    assert codec.decode(codec.encode(value)) == value


def test_unresolvable_hints_are_a_config_error_at_construction() -> None:
    """Defect 8: a dataclass whose annotations name a type local to a function leaked a
    NameError at decode time; now the codec refuses it when built, with ConfigError (a
    ValueError), naming the fix."""

    @dataclass
    class Inner:
        x: int

    @dataclass
    class Outer:
        inner: Inner

    with pytest.raises(ConfigError, match="module level") as caught:
        JSONCodec(Outer)
    assert isinstance(caught.value, ValueError)
    assert not isinstance(caught.value, NameError)


def test_nested_unresolvable_hints_are_found_at_construction() -> None:
    """The check walks into the dataclasses a field names (here inside a list): the outer
    hints resolve, the inner ones do not."""
    with pytest.raises(ConfigError, match="Broken"):
        JSONCodec(Wrapper)

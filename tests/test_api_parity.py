"""The generated sync API mirrors the hand-written asyncio API name for name."""

from __future__ import annotations

import importlib
import inspect
from types import ModuleType
from typing import Any

import pytest

import worklease

PREFIX = "Async"
DUNDER_PAIRS = {"__aenter__": "__enter__", "__aexit__": "__exit__"}
CONTEXT_METHODS = {*DUNDER_PAIRS, *DUNDER_PAIRS.values()}


def _pairs(module: ModuleType) -> list[tuple[str, str]]:
    names = getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")]
    return sorted((name, name[len(PREFIX) :]) for name in names if name.startswith(PREFIX))


def _public_members(cls: type) -> dict[str, Any]:
    """Public methods and properties defined by the class (not inherited from object)."""
    members: dict[str, Any] = {}
    for name in dir(cls):
        if name.startswith("_") and name not in CONTEXT_METHODS:
            continue
        if hasattr(object, name) or name in {"__class_getitem__", "__slots__"}:
            continue
        members[name] = inspect.getattr_static(cls, name)
    return members


def _sync_name(name: str) -> str:
    return DUNDER_PAIRS.get(name, name)


def _unwrap(member: Any) -> Any:
    if isinstance(member, staticmethod | classmethod):
        return member.__func__
    return member


def _shape(fn: Any) -> list[tuple[str, Any, Any]]:
    signature = inspect.signature(fn)
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


def _check_class(async_cls: type, sync_cls: type) -> None:
    async_members = _public_members(async_cls)
    sync_members = _public_members(sync_cls)
    assert {_sync_name(n) for n in async_members} == set(sync_members), (
        f"{async_cls.__name__} and {sync_cls.__name__} differ in public members"
    )
    for name, async_member in async_members.items():
        sync_member = sync_members[_sync_name(name)]
        where = f"{async_cls.__name__}.{name}"
        if isinstance(async_member, property):
            assert isinstance(sync_member, property), f"{where} is a property, its twin is not"
            continue
        assert type(sync_member) is type(async_member), f"{where}: kind of member differs"
        async_fn, sync_fn = _unwrap(async_member), _unwrap(sync_member)
        if not callable(async_fn):
            continue
        if inspect.iscoroutinefunction(async_fn):
            assert not inspect.iscoroutinefunction(sync_fn), f"{where}: sync twin is async"
            assert inspect.isfunction(sync_fn), f"{where}: sync twin is not a plain function"
        else:
            assert name not in DUNDER_PAIRS, f"{where} must be a coroutine function"
            assert not inspect.iscoroutinefunction(sync_fn), f"{where}: sync twin is async"
        assert not inspect.isasyncgenfunction(sync_fn), f"{where}: sync twin is an async gen"
        assert _shape(async_fn) == _shape(sync_fn), f"{where}: parameters differ"
    async_init, sync_init = vars(async_cls).get("__init__"), vars(sync_cls).get("__init__")
    assert (async_init is None) == (sync_init is None), f"{async_cls.__name__}: __init__ differs"
    if async_init is not None:
        assert _shape(async_init) == _shape(sync_init), (
            f"{async_cls.__name__}.__init__ parameters differ"
        )


def _check_module(module: ModuleType) -> None:
    pairs = _pairs(module)
    assert pairs, f"{module.__name__} exports no async names"
    exported = set(getattr(module, "__all__", dir(module)))
    for async_name, sync_name in pairs:
        assert sync_name in exported, f"{async_name} has no sync twin {sync_name} exported"
        async_obj = getattr(module, async_name)
        sync_obj = getattr(module, sync_name)
        assert async_obj is not sync_obj
        if isinstance(async_obj, type):
            assert isinstance(sync_obj, type), f"{sync_name} is not a class"
            _check_class(async_obj, sync_obj)
        elif inspect.isfunction(async_obj):
            assert inspect.isfunction(sync_obj), f"{sync_name} is not a function"
            assert not inspect.iscoroutinefunction(sync_obj), f"{sync_name} is a coroutine"
            assert _shape(async_obj) == _shape(sync_obj), f"{async_name} parameters differ"


ASYNC_PAIRS = _pairs(worklease)


def test_top_level_has_async_names() -> None:
    names = {a for a, _ in ASYNC_PAIRS}
    assert {"AsyncLease", "AsyncRenewal", "AsyncMemoryBackend", "AsyncBackend"} <= names


@pytest.mark.parametrize(("async_name", "sync_name"), ASYNC_PAIRS)
def test_sync_twin_is_exported(async_name: str, sync_name: str) -> None:
    assert sync_name in worklease.__all__
    assert getattr(worklease, sync_name) is not getattr(worklease, async_name)


CLASS_PAIRS = [(a, s) for a, s in ASYNC_PAIRS if isinstance(getattr(worklease, a), type)]


@pytest.mark.parametrize(("async_name", "sync_name"), CLASS_PAIRS)
def test_class_parity(async_name: str, sync_name: str) -> None:
    _check_class(getattr(worklease, async_name), getattr(worklease, sync_name))


def test_context_managers_match() -> None:
    for async_name, sync_name in CLASS_PAIRS:
        async_cls, sync_cls = getattr(worklease, async_name), getattr(worklease, sync_name)
        assert hasattr(async_cls, "__aenter__") == hasattr(sync_cls, "__enter__")
        assert hasattr(async_cls, "__aexit__") == hasattr(sync_cls, "__exit__")
        assert not hasattr(sync_cls, "__aenter__"), f"{sync_name} kept __aenter__"


def test_lease_methods_are_coroutines_on_the_async_side_only() -> None:
    for method in ("acquire", "read_checkpoint", "checkpoint", "renew", "release", "forget"):
        assert inspect.iscoroutinefunction(getattr(worklease.AsyncLease, method))
        assert not inspect.iscoroutinefunction(getattr(worklease.Lease, method))
    for method in ("renewal", "hold"):
        assert not inspect.iscoroutinefunction(getattr(worklease.AsyncLease, method))
    assert not inspect.iscoroutinefunction(worklease.AsyncRenewal.stop)


def test_conformance_module_parity() -> None:
    try:
        conformance = importlib.import_module("worklease.conformance")
    except ImportError:
        pytest.skip("worklease.conformance is not available yet")
    _check_module(conformance)

"""The package's import graph: no cycles, and decisions never depend on a flavour.

Read from the source with ``ast`` (imports under ``TYPE_CHECKING`` and inside functions
count too), so the test sees what a reader sees, not only what runs at import time.
Shared modules (everything outside ``_async``/``_sync`` but the entry points that re-export
both flavours) must not import a flavoured module: flavoured code calls shared decisions,
never the other way round.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "worklease"

ENTRY_POINTS = {"worklease", "worklease.__main__", "worklease.conformance"}
"""Modules that exist to expose both flavours (the package, the CLI, the public suite)."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _resolve(module: str, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    base = module.split(".")
    if not _is_package(module):
        base.pop()
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, *([target] if target else [])])


def _imports(name: str) -> Iterator[str]:
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "worklease":
                    yield alias.name
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(name, node.level, node.module)
            if target.split(".")[0] != "worklease":
                continue
            for alias in node.names:
                child = f"{target}.{alias.name}"
                yield child if child in MODULES else target


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for name in MODULES:
        found = set()
        for target in _imports(name):
            while target not in MODULES and "." in target:
                target = target.rsplit(".", 1)[0]  # a name inside a module
            if target in MODULES and target != name:
                found.add(target)
        edges[name] = found
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                item = stack.pop()
                on_stack.discard(item)
                component.append(item)
                if item == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


SYNC_INTEGRATIONS = ("worklease.contrib.django", "worklease.contrib.celery")
"""Integrations of frameworks that run the sync flavour: flavoured code, as ``_sync`` is
(they may import it, never the asyncio one)."""


def _flavour(name: str) -> str | None:
    parts = name.split(".")
    if name in SYNC_INTEGRATIONS or name.startswith(tuple(f"{m}." for m in SYNC_INTEGRATIONS)):
        return "_sync"
    return parts[1] if len(parts) > 1 and parts[1] in ("_async", "_sync") else None


def test_the_graph_is_read() -> None:
    """The reader finds the edges it must (so the checks below can fail)."""
    edges = graph()
    assert "worklease._async.hold" in edges["worklease._async.lease"]
    assert "worklease._options" in edges["worklease._async.runner"]
    assert "worklease._async.lease" in edges["worklease"]
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


def test_shared_modules_never_import_a_flavour() -> None:
    offending = [
        f"{name} imports {target}"
        for name, targets in graph().items()
        if _flavour(name) is None and name not in ENTRY_POINTS
        for target in sorted(targets)
        if _flavour(target) is not None
    ]
    assert offending == []


def test_flavours_never_import_each_other() -> None:
    offending = [
        f"{name} imports {target}"
        for name, targets in graph().items()
        for target in sorted(targets)
        if _flavour(name) is not None
        and _flavour(target) is not None
        and _flavour(name) != _flavour(target)
    ]
    assert offending == []


def test_renewal_calls_no_private_lease_method() -> None:
    """The renewer registry lives in renewal.py: it is handed the lease's batch renewal as a
    callable and never reaches into the lease."""
    for flavour in ("_async", "_sync"):
        source = (PACKAGE / flavour / "renewal.py").read_text(encoding="utf-8")
        assert "_lease" not in source
        assert f"worklease.{flavour}.lease" not in graph()[f"worklease.{flavour}.renewal"]


def test_nothing_in_the_engine_imports_the_console() -> None:
    """The operator console is a room of its own: only the command line reaches it, and it
    reaches no flavoured module (it reads backends through their public methods)."""
    edges = graph()
    console = {
        name for name in MODULES if name == "worklease.web" or name.startswith("worklease.web.")
    }
    assert "worklease.web._server" in console
    importers = sorted(
        name
        for name, targets in edges.items()
        if name not in console and name != "worklease.__main__" and targets & console
    )
    assert importers == []
    reached = sorted(
        f"{name} imports {target}"
        for name in console
        for target in edges[name]
        if _flavour(target) is not None
    )
    assert reached == []

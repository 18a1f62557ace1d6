"""Tests for scripts/unasync.py, the async -> sync code generator, on small temporary trees."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "unasync.py"

HEADER = (
    "# Generated from {} by scripts/unasync.py -- do not edit.\n"
    '# Change the async source and run "python scripts/unasync.py".\n'
)

MOD_SOURCE = '''\
"""A tiny module for the generator tests."""

from __future__ import annotations

from worklease._acompat import asleep
from worklease._base import helper

from .lease import AsyncLease

__all__ = ["AsyncLease", "hold"]

_IS_SYNC = False


async def hold(lease: AsyncLease) -> bool:
    async with lease:
        await asleep(0.1)
    helper()
    return _IS_SYNC
'''

# Renamed, ``_IS_SYNC`` flipped, no async/await, and imports re-sorted by ruff (isort).
MOD_EXPECTED = (
    HEADER.format("src/worklease/_async/mod.py")
    + '''
"""A tiny module for the generator tests."""

from __future__ import annotations

from worklease._base import helper
from worklease._compat import sleep

from .lease import Lease

__all__ = ["Lease", "hold"]

_IS_SYNC = True


def hold(lease: Lease) -> bool:
    with lease:
        sleep(0.1)
    helper()
    return _IS_SYNC
'''
)

SYNC_MOD = "src/worklease/_sync/mod.py"


def _ruff_config() -> str:
    """The ``[tool.ruff*]`` sections of the repository's pyproject.toml."""
    keep, lines = False, []
    for line in (REPO / "pyproject.toml").read_text(encoding="utf-8").splitlines():
        if line.startswith("["):
            keep = line.strip("[]").startswith("tool.ruff")
        if keep:
            lines.append(line)
    return "\n".join(lines) + "\n"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8", newline="\n")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    _write(tmp_path / "pyproject.toml", _ruff_config())
    _write(tmp_path / "src/worklease/_async/__init__.py", "")
    _write(tmp_path / "src/worklease/_async/mod.py", MOD_SOURCE)
    _write(tmp_path / "tests/_async/__init__.py", "")
    (tmp_path / "examples/async").mkdir(parents=True)
    return tmp_path


def run_script(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(root), "--no-hygiene", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def generate(root: Path) -> None:
    proc = run_script(root)
    assert proc.returncode == 0, proc.stderr


def load_script() -> ModuleType:
    name = "worklease_unasync_script"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# -- generation -------------------------------------------------------------------------------


def test_generate_writes_expected_sync_code(tree: Path) -> None:
    proc = run_script(tree)
    assert proc.returncode == 0, proc.stderr

    assert (tree / SYNC_MOD).read_bytes() == MOD_EXPECTED.encode()
    init = tree / "src/worklease/_sync/__init__.py"
    assert init.read_text(encoding="utf-8") == HEADER.format("src/worklease/_async/__init__.py")
    tests_init = tree / "tests/_sync/__init__.py"
    assert tests_init.read_text(encoding="utf-8") == HEADER.format("tests/_async/__init__.py")

    fmt = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "src/worklease/_sync", "tests/_sync"],
        cwd=tree,
        capture_output=True,
        text=True,
        check=False,
    )
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_generate_deletes_stale_generated_file(tree: Path) -> None:
    generate(tree)
    stale = tree / "src/worklease/_sync/old.py"
    stale.write_bytes((tree / SYNC_MOD).read_bytes())

    proc = run_script(tree)

    assert proc.returncode == 0, proc.stderr
    assert not stale.exists()
    assert (tree / SYNC_MOD).is_file()


def test_generate_refuses_hand_written_file_in_target_dir(tree: Path) -> None:
    generate(tree)
    stray = tree / "src/worklease/_sync/extra.py"
    _write(stray, "X = 1\n")

    proc = run_script(tree)

    assert proc.returncode == 1
    assert "src/worklease/_sync/extra.py" in proc.stderr
    assert stray.exists()


# -- check mode -------------------------------------------------------------------------------


def test_check_passes_right_after_generation(tree: Path) -> None:
    generate(tree)

    proc = run_script(tree, "--check")

    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "unasync: 3 files up to date" in proc.stdout


def test_check_writes_nothing_and_reports_missing_outputs(tree: Path) -> None:
    proc = run_script(tree, "--check")

    assert proc.returncode == 1
    assert f"missing: {SYNC_MOD}" in proc.stdout
    assert "3 missing" in proc.stdout
    assert not (tree / "src/worklease/_sync").exists()
    assert not (tree / "tests/_sync").exists()


def test_check_fails_after_hand_edit(tree: Path) -> None:
    generate(tree)
    target = tree / SYNC_MOD
    target.write_text(MOD_EXPECTED.replace("sleep(0.1)", "sleep(0.2)"), encoding="utf-8")

    proc = run_script(tree, "--check")

    assert proc.returncode == 1
    assert f"--- a/{SYNC_MOD}" in proc.stdout
    assert "-        sleep(0.2)" in proc.stdout
    assert "+        sleep(0.1)" in proc.stdout
    assert "1 changed" in proc.stdout
    assert "sleep(0.2)" in target.read_text(encoding="utf-8")  # --check wrote nothing


def test_check_fails_on_orphan_file(tree: Path) -> None:
    generate(tree)
    _write(tree / "tests/_sync/test_extra.py", "X = 1\n")

    proc = run_script(tree, "--check")

    assert proc.returncode == 1
    assert "orphan: tests/_sync/test_extra.py" in proc.stdout
    assert "no generated header: tests/_sync/test_extra.py" in proc.stdout


def test_check_fails_on_missing_output(tree: Path) -> None:
    generate(tree)
    (tree / SYNC_MOD).unlink()

    proc = run_script(tree, "--check")

    assert proc.returncode == 1
    assert f"missing: {SYNC_MOD} (from src/worklease/_async/mod.py)" in proc.stdout


# -- guards -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param("class AsyncFoo:\n    pass\n", "bad.py:1: name 'SyncFoo'", id="unmapped-name"),
        pytest.param(
            '__all__ = ["AsyncFoo"]\n', "bad.py:1: string 'AsyncFoo'", id="unmapped-string"
        ),
        pytest.param(
            "import asyncio\n\n\nasync def f() -> None:\n    await asyncio.sleep(0)\n",
            "bad.py:1: 'asyncio'",
            id="asyncio",
        ),
        pytest.param(
            "from x import _IS_SYNC\n\nFLAG = _IS_SYNC\n",
            "bad.py:1: uses _IS_SYNC without",
            id="is-sync-undeclared",
        ),
        pytest.param(
            'from worklease._async.lease import AsyncLease\n\nNAME = f"{AsyncLease.__name__}"\n',
            "bad.py:3: 'AsyncLease' inside an f-string",
            id="f-string",
        ),
        pytest.param(
            'TARGET = "worklease._async.lease.monotonic"\n',
            "bad.py:1: string 'worklease._async.lease.monotonic' names an _async path",
            id="async-path-string",
        ),
        pytest.param("x=1\n", "bad.py: not ruff-format clean", id="unformatted"),
    ],
)
def test_generation_fails_on_bad_source(tree: Path, source: str, expected: str) -> None:
    _write(tree / "src/worklease/_async/bad.py", source)

    proc = run_script(tree)

    assert proc.returncode == 1
    assert expected in proc.stderr
    assert "nothing written" in proc.stderr
    assert not (tree / "src/worklease/_sync").exists()


def test_await_with_parenthesis_keeps_parenthesis() -> None:
    # unasync 0.6.0 itself drops whatever token follows ``await``; the script only drops
    # whitespace.
    unasyncer = load_script().Unasyncer({})
    out = unasyncer.transform("async def f():\n    return await(x)\n")
    assert out == "def f():\n    return (x)\n"


# -- examples: the asyncio entry point ------------------------------------------------------

EXAMPLE_SOURCE = '''\
"""A tiny example."""

from __future__ import annotations

import asyncio

import worklease


async def main() -> None:
    lease = worklease.AsyncLease(worklease.AsyncMemoryBackend(), holder_id="w", ttl=30)
    await lease.acquire("job")


if __name__ == "__main__":
    asyncio.run(main())
'''

EXAMPLE_EXPECTED = (
    HEADER.format("examples/async/demo.py")
    + '''
"""A tiny example."""

from __future__ import annotations

import worklease


def main() -> None:
    lease = worklease.Lease(worklease.MemoryBackend(), holder_id="w", ttl=30)
    lease.acquire("job")


if __name__ == "__main__":
    main()
'''
)


def test_strip_entry_point_drops_asyncio_run_and_import() -> None:
    text = "import asyncio\nimport os\n\nif __name__ == '__main__':\n    asyncio.run(main())\n"

    out = load_script().strip_entry_point(text)

    assert out == "import os\n\nif __name__ == '__main__':\n    main()\n"


def test_strip_entry_point_keeps_import_used_elsewhere() -> None:
    # The remaining use is left for the guards to reject.
    text = "import asyncio\n\nx = asyncio.sleep\nasyncio.run(main())\n"

    out = load_script().strip_entry_point(text)

    assert out == "import asyncio\n\nx = asyncio.sleep\nmain()\n"


def test_strip_entry_point_leaves_code_without_entry_point_alone() -> None:
    text = "import asyncio\n\nasyncio.run(main(1))\n"

    assert load_script().strip_entry_point(text) == text


def test_generate_example_turns_entry_point_into_plain_call(tree: Path) -> None:
    _write(tree / "examples/async/demo.py", EXAMPLE_SOURCE)

    generate(tree)

    out = (tree / "examples/sync/demo.py").read_text(encoding="utf-8")
    assert out == EXAMPLE_EXPECTED


def test_generate_example_rejects_other_asyncio_use(tree: Path) -> None:
    source = EXAMPLE_SOURCE.replace(
        '    await lease.acquire("job")\n',
        '    await lease.acquire("job")\n    await asyncio.sleep(1)\n',
    )
    _write(tree / "examples/async/demo.py", source)

    proc = run_script(tree)

    assert proc.returncode == 1
    assert "examples/async/demo.py:5: 'asyncio' in generated code" in proc.stderr
    assert not (tree / "examples/sync").exists()


# -- table hygiene ----------------------------------------------------------------------------


def test_find_unused_replacements() -> None:
    table = {"AsyncThing": "Thing", "aclose": "close", "AsyncNever": "Never", "_async": "_sync"}
    texts = ["from pkg._async import AsyncThing\n", 'getattr(x, "aclose")\n']

    assert load_script().find_unused_replacements(texts, table) == ["AsyncNever"]


# run() with a table of the test's own, in a fresh interpreter: the test process's state (its
# threads and its garbage) is not the script's to share.
RUN_WITH_TABLE = """\
import importlib.util, json, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("worklease_unasync_script", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
sys.exit(module.run(Path(sys.argv[2]), check=True, replacements=json.loads(sys.argv[3])))
"""


def test_run_fails_on_unused_replacement(tree: Path) -> None:
    table = {"AsyncLease": "Lease", "asleep": "sleep", "_async": "_sync", "AsyncGone": "Gone"}

    proc = subprocess.run(
        [sys.executable, "-c", RUN_WITH_TABLE, str(SCRIPT), str(tree), json.dumps(table)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )

    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "REPLACEMENTS key 'AsyncGone' matches nothing" in proc.stderr
    assert "'asleep'" not in proc.stderr


def test_run_parses_on_the_calling_thread_only(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # CPython 3.11 before 3.11.8 keeps the AST constructor's recursion-depth counter in
    # interpreter-wide state (gh-106905): two threads in ast.parse at once (one switched out
    # by a finalizer that a garbage collection inside the constructor runs) fail with
    # "SystemError: AST constructor recursion depth mismatch". The script's worker threads
    # run ruff; every parse stays on the thread that called run().
    for name in ("one", "two", "three", "four"):
        _write(tree / f"src/worklease/_async/{name}.py", MOD_SOURCE)
    script = load_script()
    parse = script.ast.parse
    threads: list[int] = []

    def recording_parse(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.get_ident())
        return parse(*args, **kwargs)

    monkeypatch.setattr(script.ast, "parse", recording_parse)
    out: list[str] = []

    status = script.run(tree, check=False, hygiene=False, out=out.append)

    assert status == 0, out
    four = (tree / "src/worklease/_sync/four.py").read_text(encoding="utf-8")
    assert four == MOD_EXPECTED.replace("_async/mod.py", "_async/four.py")
    assert len(threads) >= 2 * 7  # two parses (f-string and path guards) per source file
    assert set(threads) == {threading.get_ident()}


def test_validate_table_rejects_chained_entries() -> None:
    problems = load_script().validate_table({"AsyncA": "A", "A": "B"})
    assert problems == ["REPLACEMENTS: value 'A' (of 'AsyncA') is also a key"]

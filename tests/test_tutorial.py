"""The tutorial (docs/guide/tutorial.md) runs as written: every command of its ``console``
blocks, in one shell, in order, each printing what the page shows.

Matching: a line of the page's output matches the same line printed, where ``...`` inside a
line stands for any text and a line of only ``...`` for any number of lines. The page's
commands that only look (``worklease status``, ``grep``, ``cat``, ``sort``, ``tail``) are
repeated until their output matches, for up to ``LOOK_TIMEOUT`` seconds: what they look at
(a handover, a lease lapsing) happens in its own time. Every other command runs once and
must match the first time. The test gives the tutorial a database of its own: the page's
``export DSN=...`` and ``createdb`` lines are the reader's setup and are replaced by it.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests import pg

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "guide" / "tutorial.md"
LOOKING = ("worklease status", "grep ", "cat ", "sort ", "tail ")
SETUP = ("export DSN=", "createdb ")
LOOK_TIMEOUT = 90.0
COMMAND_TIMEOUT = 120.0

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def steps(page: str) -> list[tuple[str, list[str]]]:
    """The (command, expected output lines) of every ``console`` block, in order."""
    found: list[tuple[str, list[str]]] = []
    for block in re.findall(r"```console\n(.*?)```", page, flags=re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                found.append((line[2:], []))
            elif found:
                found[-1][1].append(line.rstrip())
    return found


def matches(expected: list[str], printed: list[str]) -> bool:
    """Whether ``printed`` is ``expected``, its ``...`` wildcards aside."""
    if not expected:
        return not printed
    head, rest = expected[0], expected[1:]
    if head == "...":
        return any(matches(rest, printed[i:]) for i in range(len(printed) + 1))
    if not printed:
        return False
    pattern = ".*".join(re.escape(part) for part in head.split("..."))
    return re.fullmatch(pattern, printed[0]) is not None and matches(rest, printed[1:])


class Shell:
    """One bash process the commands run in, so ``export``, ``&`` and ``$!`` work as typed."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            ["bash", "--norc", "--noprofile"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            text=True,
            bufsize=1,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, name="tutorial-shell", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def run(self, command: str) -> list[str]:
        marker = f"__done_{uuid.uuid4().hex}__"
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{command}\necho {marker}\n")
        self.proc.stdin.flush()
        lines: list[str] = []
        deadline = time.monotonic() + COMMAND_TIMEOUT
        while True:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                pytest.fail(
                    f"{command!r} did not finish within {COMMAND_TIMEOUT:g} s; it printed {lines}"
                )
            if line is None:
                pytest.fail(f"the shell ended during {command!r}; it printed {lines}")
            if line == marker:
                return [printed.rstrip() for printed in lines]
            lines.append(line)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _stop_workers(cwd: Path) -> None:
    for pid_file in cwd.glob("*.pid"):
        with contextlib.suppress(ValueError, ProcessLookupError):
            os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)


def test_the_page_has_steps_to_run() -> None:
    found = steps(PAGE.read_text(encoding="utf-8"))
    commands = [command for command, _ in found]
    assert any(c.startswith("worklease migrate") for c in commands)
    assert any("kill -9" in c for c in commands)
    assert sum(c.startswith("python examples/tutorial/worker.py") for c in commands) >= 2


@pytest.mark.lengthy
@pytest.mark.timeout(600)
def test_the_tutorial_runs_as_written(postgres_server: str, tmp_path: Path) -> None:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    bin_dir = str(Path(sys.executable).parent)
    with pg.empty_database(postgres_server, "tutorial") as dsn:
        env = {**os.environ, "DSN": dsn, "PATH": bin_dir + os.pathsep + os.environ["PATH"]}
        shell = Shell(tmp_path, env)
        try:
            for command, expected in steps(PAGE.read_text(encoding="utf-8")):
                if command.startswith(SETUP):
                    continue
                looking = command.startswith(LOOKING)
                deadline = time.monotonic() + (LOOK_TIMEOUT if looking else 0.0)
                while True:
                    printed = shell.run(command)
                    if matches(expected, printed):
                        break
                    if time.monotonic() >= deadline:
                        shown = "\n".join(printed)
                        wanted = "\n".join(expected)
                        pytest.fail(f"$ {command}\nprinted:\n{shown}\nthe page shows:\n{wanted}")
                    time.sleep(1.0)
        finally:
            _stop_workers(tmp_path)
            shell.close()


@pytest.mark.parametrize(
    ("expected", "printed", "result"),
    [
        (["a"], ["a"], True),
        (["a"], ["b"], False),
        (["a ... c"], ["a b c"], True),
        (["...", "c"], ["a", "b", "c"], True),
        (["...", "c"], ["a", "b"], False),
        (["a", "..."], ["a"], True),
        ([], ["x"], False),
    ],
)
def test_matching(expected: list[str], printed: list[str], result: bool) -> None:
    assert matches(expected, printed) is result

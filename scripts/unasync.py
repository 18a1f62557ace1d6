#!/usr/bin/env python3
"""Generate the synchronous code from the hand-written asyncio code.

The asyncio code under ``src/worklease/_async/`` (and ``tests/_async/``, ``examples/async/``)
is the only hand-written copy. This script turns every ``*.py`` file there into its
synchronous twin under the matching ``_sync/`` (``sync/``) directory, using the token
machinery of the ``unasync`` package (pinned at 0.6.0) plus the explicit ``REPLACEMENTS``
table below, then:

* flips ``_IS_SYNC = False`` to ``_IS_SYNC = True``;
* prepends a "generated, do not edit" header;
* formats the result in memory with the project's ruff (isort + unused imports, then
  ``ruff format``), so ``ruff format --check`` passes on the generated tree;
* rejects output that still contains ``await``/``async``, ``asyncio``, a table key, or
  an ``Async*``/``Sync*`` name (a rename that is missing from the table).

Usage::

    python scripts/unasync.py            # (re)generate, delete stale generated files
    python scripts/unasync.py --check    # write nothing; exit 1 on any drift

Formatting is done by ruff, so run it with the ruff version pinned in pyproject.toml
(it uses ``python -m ruff`` of the running interpreter, else ``ruff`` on PATH).

Run it with one pinned Python (the repo uses 3.11): since Python 3.12 the tokenizer
splits f-strings into tokens, so names inside ``{...}`` of an f-string are renamed on
3.12+ but left alone on 3.11. To keep the output independent of the Python version, the
script refuses f-string expressions that contain anything the renaming would touch.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib
import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys
import tokenize
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Any

# (source dir, target dir) pairs, relative to the repository root.
RULES: tuple[tuple[str, str], ...] = (
    ("src/worklease/_async", "src/worklease/_sync"),
    ("tests/_async", "tests/_sync"),
    ("examples/async", "examples/sync"),
)

# Every async -> sync rename beyond what unasync 0.6.0 does by itself. unasync already
# drops ``async``/``await`` and maps ``__aenter__``, ``__aexit__``, ``__aiter__``,
# ``__anext__``, ``asynccontextmanager``, ``AsyncIterator``, ``AsyncIterable``,
# ``AsyncGenerator`` and ``StopAsyncIteration``. Any other ``AsyncXxx`` name would be
# silently renamed to ``SyncXxx`` by unasync; the guards below reject that, so every such
# name must be listed here. Renames apply to NAME tokens (identifiers, attributes, import
# paths) and to plain one-line string literals whose whole content is a key.
REPLACEMENTS: dict[str, str] = {
    # worklease names (keep in step with the public pairs in worklease/__init__.py)
    "AsyncLease": "Lease",
    "AsyncRenewal": "Renewal",
    "AsyncBackend": "Backend",
    "AsyncMemoryBackend": "MemoryBackend",
    "AsyncVacuum": "Vacuum",
    "AsyncRunner": "Runner",
    "AsyncHold": "Hold",
    "AsyncBackendConformance": "BackendConformance",
    "AsyncWorkFn": "WorkFn",
    "AsyncTokenCallback": "TokenCallback",
    "AsyncRenewTogether": "RenewTogether",
    "AsyncReleaser": "Releaser",
    "AsyncLeader": "Leader",
    "AsyncPool": "Pool",
    "AsyncPostgresBackend": "PostgresBackend",
    "AsyncReleaseHub": "ReleaseHub",
    "AsyncReleaseWatch": "ReleaseWatch",
    "AsyncReleaseListener": "ReleaseListener",
    "AsyncRenewer": "Renewer",
    "AsyncRenewals": "Renewals",
    "AsyncCapabilities": "Capabilities",
    "AsyncAcquireWithCheckpoint": "AcquireWithCheckpoint",
    "AsyncRenewMany": "RenewMany",
    "AsyncFindAvailable": "FindAvailable",
    "AsyncAcquireMany": "AcquireMany",
    "AsyncReleaseMany": "ReleaseMany",
    "AsyncCheckpointMany": "CheckpointMany",
    "AsyncGroupCommit": "GroupCommit",
    "AsyncWriteOne": "WriteOne",
    "AsyncWriteMany": "WriteMany",
    "AsyncSurvey": "Survey",
    "AsyncBackendTransaction": "BackendTransaction",
    "AsyncTransactional": "Transactional",
    "AsyncPostgresTransaction": "PostgresTransaction",
    "AsyncMemoryTransaction": "MemoryTransaction",
    "AsyncLeaseTransaction": "LeaseTransaction",
    "AsyncReleaseWatching": "ReleaseWatching",
    "AsyncEtcdBackend": "EtcdBackend",
    "AsyncRedisBackend": "RedisBackend",
    # redis-py: the asyncio clients and their blocking twins
    "_aredis": "_sredis",
    # compat pairs: worklease._acompat (asyncio) -> worklease._compat (threads), and the
    # tests' own pair of modules of the same names
    "_acompat": "_compat",
    "asleep": "sleep",
    "AEvent": "Event",
    "aspawn": "spawn",
    "aspawn_after": "spawn_after",
    "astart_within": "start_within",
    "astart_pending": "start_pending",
    "ADeferredWorker": "Worker",
    "AWorker": "Worker",
    "acall": "call",
    "acleanup": "cleanup",
    "ashielded": "shielded",
    "acancel_worker": "cancel_worker",
    "ajoin_all": "join_all",
    "AHostCanceller": "HostCanceller",
    "ACancelGuard": "CancelGuard",
    "acheck_postgres": "check_postgres",
    "acheck_redis": "check_redis",
    "abounded": "bounded",
    "awithin": "within",
    "wait_timeout": "wait",
    "set_threadsafe": "set",
    "aloop_key": "loop_key",
    "aloop_gone": "loop_gone",
    "aworker_alive": "worker_alive",
    "aabandonable": "abandonable",
    "ARENEWER_LINGER": "RENEWER_LINGER",
    "ABATCH_LINGER": "BATCH_LINGER",
    "AsyncReleaseBatch": "ReleaseBatch",
    # a flavoured module imported by its path (tests importing a private piece)
    "_async": "_sync",
    # psycopg and psycopg_pool (import them from the package top level)
    "AsyncClientCursor": "ClientCursor",
    "AsyncCursor": "Cursor",
    "AsyncConnection": "Connection",
    "AsyncConnectionPool": "ConnectionPool",
    # httpx
    "AsyncClient": "Client",
    "aiter_lines": "iter_lines",
    "aclose": "close",
    # tests compat (tests._acompat)
    "aspawn_all": "spawn_all",
}

# Names allowed in generated output even though they match ^Sync[A-Z] or ^Async[A-Z].
ALLOWED_NAMES: frozenset[str] = frozenset()

SCRIPT_NAME = "scripts/unasync.py"
HEADER_LINE_1 = "# Generated from {source} by scripts/unasync.py -- do not edit."
HEADER_LINE_2 = '# Change the async source and run "python scripts/unasync.py".'
HEADER_RE = re.compile(r"^# Generated from \S+ by scripts/unasync\.py -- do not edit\.$")
DEFAULT_ROOT = Path(__file__).resolve().parent.parent

_ASYNC_SYNC_NAME_RE = re.compile(r"^(?:Sync|Async)[A-Z]")
_ASYNC_PATH_RE = re.compile(r"(?:^|[./])_async(?:[./]|$)")
_IS_SYNC_DECL_RE = re.compile(r"^_IS_SYNC(?P<ann>\s*:[^=]+)?\s*=\s*(?P<value>True|False)\b")


class GenerationError(Exception):
    """A problem that makes the run fail; the message names file and line."""


def _import_outside_scripts(name: str) -> ModuleType:
    """Import ``name`` without this file (``scripts/unasync.py``) shadowing ``unasync``."""
    here = os.path.normcase(str(Path(__file__).resolve().parent))
    saved = sys.path[:]
    sys.path[:] = [p for p in saved if os.path.normcase(os.path.abspath(p or ".")) != here]
    try:
        return importlib.import_module(name)
    finally:
        sys.path[:] = saved


_unasync = _import_outside_scripts("unasync")
_tokenize_rt = _import_outside_scripts("tokenize_rt")  # unasync's tokenizer (no py.typed)


# --------------------------------------------------------------------------------------
# Token transformation
# --------------------------------------------------------------------------------------


class Unasyncer:
    """unasync's token rewriting for one file, recording which table keys were used.

    Names are mapped with ``unasync.Rule._unasync_name`` (builtin table + ``replacements``
    + the ``Async*`` -> ``Sync*`` fallback). The token loop mirrors
    ``Rule._unasync_tokens`` with one fix: after dropping ``async``/``await`` it skips the
    next token only if it is whitespace (unasync drops any next token, so ``await(x)``
    would lose its parenthesis).
    """

    def __init__(self, replacements: Mapping[str, str]) -> None:
        self.replacements = dict(replacements)
        self.rule: Any = _unasync.Rule("/_async/", "/_sync/", self.replacements)
        self.table: dict[str, str] = dict(self.rule.token_replacements)
        self.used: set[str] = set()
        # (line, original, renamed) for string literals renamed by the Async* fallback
        self.string_fallbacks: list[tuple[int, str, str]] = []

    def rename(self, name: str) -> str:
        """What unasync turns ``name`` into (no bookkeeping)."""
        renamed: str = self.rule._unasync_name(name)
        return renamed

    def _map(self, name: str) -> str:
        if name in self.replacements:
            self.used.add(name)
        return self.rename(name)

    def transform(self, text: str) -> str:
        tokens = _tokenize_rt.src_to_tokens(text)
        out: list[Any] = []
        skip_ws = False
        for tok in tokens:
            if skip_ws:
                skip_ws = False
                if tok.name == "UNIMPORTANT_WS":
                    continue
            if tok.name == "NAME":
                if tok.src in ("async", "await"):
                    skip_ws = True
                    continue
                tok = tok._replace(src=self._map(tok.src))
            elif tok.name == "STRING":
                left, content, right = tok.src[0], tok.src[1:-1], tok.src[-1]
                renamed = self._map(content)
                if renamed != content:
                    if content not in self.table:
                        self.string_fallbacks.append((tok.line or 0, content, renamed))
                    tok = tok._replace(src=left + renamed + right)
            out.append(tok)
        result: str = _tokenize_rt.tokens_to_src(out)
        return result


def find_unused_replacements(texts: Iterable[str], replacements: Mapping[str, str]) -> list[str]:
    """Keys of ``replacements`` that match no token in any of ``texts`` (table hygiene)."""
    used: set[str] = set()
    for text in texts:
        unasyncer = Unasyncer(replacements)
        unasyncer.transform(text)
        used |= unasyncer.used
    return sorted(set(replacements) - used)


def validate_table(replacements: Mapping[str, str]) -> list[str]:
    """Problems with the table itself (non-identifiers, chains, no-op entries)."""
    problems = []
    for key, value in replacements.items():
        if not key.isidentifier() or not value.isidentifier():
            problems.append(f"REPLACEMENTS: {key!r} -> {value!r} is not identifier -> identifier")
        elif key == value:
            problems.append(f"REPLACEMENTS: {key!r} maps to itself")
        elif value in replacements:
            problems.append(f"REPLACEMENTS: value {value!r} (of {key!r}) is also a key")
    return problems


# --------------------------------------------------------------------------------------
# Checks on the source and on the output
# --------------------------------------------------------------------------------------


def _name_tokens(text: str, where: str) -> list[tokenize.TokenInfo]:
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError) as exc:
        raise GenerationError(f"{where}: cannot tokenize: {exc}") from exc
    return [t for t in tokens if t.type == tokenize.NAME]


def _version_dependent(node: ast.AST, unasyncer: Unasyncer) -> str | None:
    """What in ``node`` (part of an f-string expression) the renaming would touch."""
    if isinstance(node, ast.Await) or (isinstance(node, ast.comprehension) and node.is_async):
        return "await/async"
    name: str | None = None
    if isinstance(node, ast.Name):
        name = node.id
    elif isinstance(node, ast.Attribute):
        name = node.attr
    elif isinstance(node, ast.keyword):
        name = node.arg
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
        name = node.value
    if name and (name == "asyncio" or unasyncer.rename(name) != name):
        return repr(name)
    return None


def check_fstrings(text: str, source: str, unasyncer: Unasyncer) -> list[str]:
    """Reject f-string expressions whose renaming would depend on the Python version."""
    try:
        tree = ast.parse(text, filename=source)
    except SyntaxError as exc:
        return [f"{source}:{exc.lineno}: syntax error: {exc.msg}"]
    errors = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.JoinedStr):
            continue
        for part in node.values:
            if not isinstance(part, ast.FormattedValue):
                continue
            for sub in ast.walk(part.value):
                what = _version_dependent(sub, unasyncer)
                if what:
                    line = getattr(sub, "lineno", node.lineno)
                    errors.append(
                        f"{source}:{line}: {what} inside an f-string expression "
                        "(renamed on Python 3.12+ only); move it out of the f-string"
                    )
    return errors


def check_async_paths(text: str, source: str) -> list[str]:
    """Reject string literals naming an ``_async`` module path in unasynced ``text``.

    unasync renames a string only when its whole content is a key, so e.g. a
    ``monkeypatch.setattr("worklease._async.lease.x", ...)`` target would silently keep
    patching the async module. Docstrings and other bare string statements are exempt.
    """
    try:
        tree = ast.parse(text, filename=source)
    except SyntaxError as exc:
        return [f"{source}:{exc.lineno}: generated code does not parse: {exc.msg}"]
    bare = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    return [
        f"{source}:{node.lineno}: string {node.value!r} names an _async path, which unasync "
        "does not rewrite; refer to the module object instead"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in bare
        and _ASYNC_PATH_RE.search(node.value)
    ]


_ENTRY_POINT_RE = re.compile(r"^(?P<indent>[ \t]*)asyncio\.run\((?P<main>\w+)\(\)\)[ \t]*$", re.M)
_IMPORT_ASYNCIO_RE = re.compile(r"^import asyncio[ \t]*\n", re.M)


def strip_entry_point(text: str) -> str:
    """Turn an example's ``asyncio.run(main())`` into ``main()``.

    The ``import asyncio`` line goes too when nothing else uses asyncio; any other use is
    left for the guards to reject.
    """
    text, count = _ENTRY_POINT_RE.subn(r"\g<indent>\g<main>()", text)
    if count:
        names = [
            token
            for token in tokenize.generate_tokens(io.StringIO(text).readline)
            if token.type == tokenize.NAME and token.string == "asyncio"
        ]
        if len(names) == 1:  # only the import is left (prose in docstrings does not count)
            text = _IMPORT_ASYNCIO_RE.sub("", text)
    return text


def flip_is_sync(text: str, source: str) -> str:
    """Turn the module's ``_IS_SYNC = False`` into ``_IS_SYNC = True``."""
    uses = [t for t in _name_tokens(text, source) if t.string == "_IS_SYNC"]
    if not uses:
        return text
    decl_lines = {t.start[0] for t in uses if t.start[1] == 0}
    lines = text.splitlines(keepends=True)
    found = 0
    for lineno in sorted(decl_lines):
        match = _IS_SYNC_DECL_RE.match(lines[lineno - 1])
        if match is None:
            continue
        if match["value"] != "False":
            raise GenerationError(f"{source}:{lineno}: the async source must set _IS_SYNC = False")
        found += 1
        start, end = match.span("value")
        line = lines[lineno - 1]
        lines[lineno - 1] = line[:start] + "True" + line[end:]
    if found == 0:
        raise GenerationError(
            f"{source}:{uses[0].start[0]}: uses _IS_SYNC without a module-level "
            "`_IS_SYNC = False` declaration"
        )
    if found > 1:
        raise GenerationError(f"{source}: declares _IS_SYNC {found} times")
    return "".join(lines)


def guard_output(
    text: str, source: str, unasyncer: Unasyncer, allowed: frozenset[str]
) -> list[str]:
    """Reject leftovers of the async world in unasynced ``text``.

    ``text`` is the output before the header and formatting, so its line numbers are the
    source file's line numbers.
    """
    errors = []
    for tok in _name_tokens(text, source):
        name, line = tok.string, tok.start[0]
        if name in allowed:
            continue
        if name in ("async", "await"):
            errors.append(f"{source}:{line}: keyword {name!r} left in generated code")
        elif name == "asyncio":
            errors.append(
                f"{source}:{line}: 'asyncio' in generated code "
                "(use worklease._acompat: its twin is _compat)"
            )
        elif name in unasyncer.table:
            errors.append(f"{source}:{line}: {name!r} is a REPLACEMENTS key but was not renamed")
        elif _ASYNC_SYNC_NAME_RE.match(name):
            hint = ""
            if name.startswith("Sync"):
                hint = f" (unasync's rename of unmapped 'Async{name[4:]}'; add it to REPLACEMENTS)"
            errors.append(f"{source}:{line}: name {name!r} in generated code{hint}")
    for line, original, renamed in unasyncer.string_fallbacks:
        if renamed not in allowed:
            errors.append(
                f"{source}:{line}: string {original!r} would become {renamed!r} "
                "(unasync's Async* fallback); add it to REPLACEMENTS"
            )
    return errors


# --------------------------------------------------------------------------------------
# ruff
# --------------------------------------------------------------------------------------


def ruff_command() -> list[str]:
    """The ruff of this environment (``python -m ruff``), else ``ruff`` on PATH."""
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    exe = shutil.which("ruff")
    if exe is None:
        raise GenerationError("ruff not found (neither `python -m ruff` nor `ruff` on PATH)")
    return [exe]


def run_ruff(ruff: Sequence[str], args: Sequence[str], text: str, root: Path, where: str) -> str:
    """Run ruff on ``text`` via stdin in ``root`` (so the project's config applies)."""
    proc = subprocess.run(
        [*ruff, *args, "-"],
        input=text.encode("utf-8"),
        capture_output=True,
        cwd=root,
        check=False,
    )
    if proc.returncode != 0:
        detail = proc.stderr.decode("utf-8", "replace").strip()
        raise GenerationError(f"{where}: `ruff {' '.join(args)}` failed:\n{detail}")
    return proc.stdout.decode("utf-8")


def format_text(ruff: Sequence[str], text: str, filename: str, root: Path) -> str:
    return run_ruff(ruff, ["format", "--stdin-filename", filename], text, root, filename)


def fix_imports(ruff: Sequence[str], text: str, filename: str, root: Path) -> str:
    args = ["check", "--fix-only", "--select", "I,F401", "--stdin-filename", filename]
    return run_ruff(ruff, args, text, root, filename)


# --------------------------------------------------------------------------------------
# One file
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    source: PurePosixPath  # relative to root
    target: PurePosixPath


@dataclass
class Result:
    job: Job
    text: str | None = None
    errors: list[str] = field(default_factory=list)
    used: set[str] = field(default_factory=set)


def header_for(source: PurePosixPath) -> str:
    return HEADER_LINE_1.format(source=source) + "\n" + HEADER_LINE_2 + "\n"


def has_header(path: Path) -> bool:
    with path.open(encoding="utf-8", errors="replace") as f:
        return HEADER_RE.match(f.readline().rstrip("\r\n")) is not None


def transform_text(
    source_text: str,
    job: Job,
    *,
    replacements: Mapping[str, str],
    allowed: frozenset[str],
) -> Result:
    """The unasynced body of one file (no header, not formatted) and the guards' findings.

    This step parses with :mod:`ast`, so it runs on the calling thread only, never in the
    worker threads of :func:`generate_all`: on CPython 3.11 before 3.11.8 the AST
    constructor keeps its recursion-depth counter in interpreter-wide state (gh-106905), and
    when a garbage collection inside one thread's ``ast.parse`` runs a finalizer that
    switches threads, another thread's ``ast.parse`` resets the counter and the first fails
    with ``SystemError: AST constructor recursion depth mismatch``.
    """
    result = Result(job)
    src = str(job.source)
    try:
        unasyncer = Unasyncer(replacements)
        result.errors += check_fstrings(source_text, src, unasyncer)
        body = flip_is_sync(unasyncer.transform(strip_entry_point(source_text)), src)
        result.used = unasyncer.used
        result.errors += guard_output(body, src, unasyncer, allowed)
        result.errors += check_async_paths(body, src)
        if result.errors:
            return result
        try:
            compile(body, src, "exec", dont_inherit=True)
        except SyntaxError as exc:
            result.errors.append(f"{src}:{exc.lineno}: generated code does not compile: {exc.msg}")
            return result
        result.text = body
    except GenerationError as exc:
        result.errors.append(str(exc))
    except (tokenize.TokenError, SyntaxError) as exc:  # ruff's format check reports it too
        result.errors.append(f"{src}: cannot tokenize: {exc}")
    return result


def format_output(
    source_text: str, transformed: Result, root: Path, *, ruff: Sequence[str]
) -> Result:
    """The finished sync text of one file from :func:`transform_text`'s result: the source
    must be ruff-format clean (else that is the file's only error), then the header goes on
    and ruff sorts the imports and formats. Runs ruff in subprocesses and compiles from
    source text (no :mod:`ast` objects), so it is safe in worker threads."""
    job = transformed.job
    result = Result(job, used=transformed.used)
    src, dst = str(job.source), str(job.target)
    try:
        if format_text(ruff, source_text, src, root) != source_text:
            result.errors.append(f"{src}: not ruff-format clean; run `ruff format {src}` first")
            return result
        if transformed.errors or transformed.text is None:
            result.errors += transformed.errors
            return result
        body = transformed.text
        header = header_for(job.source)
        text = header + ("\n" + body if body.strip() else "")
        text = format_text(ruff, fix_imports(ruff, text, dst, root), dst, root)
        if not text.startswith(header):
            result.errors.append(f"{dst}: formatting moved the generated header")
            return result
        try:
            compile(text, dst, "exec", dont_inherit=True)
        except SyntaxError as exc:
            result.errors.append(
                f"{dst}:{exc.lineno}: formatted output fails to compile: {exc.msg}"
            )
            return result
        result.text = text
    except GenerationError as exc:
        result.errors.append(str(exc))
    return result


# --------------------------------------------------------------------------------------
# Whole tree
# --------------------------------------------------------------------------------------


def _py_files(root: Path, rel_dir: str) -> list[PurePosixPath]:
    base = root / rel_dir
    if not base.is_dir():
        return []
    found = (
        PurePosixPath(p.relative_to(root).as_posix())
        for p in base.rglob("*.py")
        if p.is_file() and "__pycache__" not in p.relative_to(base).parts
    )
    return sorted(found)


def plan(root: Path, rules: Sequence[tuple[str, str]]) -> list[Job]:
    """All (source, target) pairs, sorted."""
    jobs = []
    for src_dir, dst_dir in rules:
        if not (root / src_dir).is_dir():
            raise GenerationError(f"source directory {src_dir} does not exist (see RULES)")
        for source in _py_files(root, src_dir):
            rel = source.relative_to(PurePosixPath(src_dir))
            jobs.append(Job(source, PurePosixPath(dst_dir) / rel))
    return jobs


def existing_targets(root: Path, rules: Sequence[tuple[str, str]]) -> list[PurePosixPath]:
    return sorted(p for _, dst_dir in rules for p in _py_files(root, dst_dir))


def generate_all(
    root: Path,
    jobs: Sequence[Job],
    *,
    replacements: Mapping[str, str],
    allowed: frozenset[str],
) -> list[Result]:
    """Every job's result, in order: the token and :mod:`ast` work on this thread, one file
    after another (see :func:`transform_text` for why), the ruff subprocesses in worker
    threads (each file's start as soon as its transformation is done)."""
    ruff = ruff_command()
    workers = min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        pending: list[Future[Result]] = []
        for job in jobs:
            try:
                text = (root / job.source).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                unreadable: Future[Result] = Future()
                unreadable.set_result(Result(job, errors=[f"{job.source}: cannot read: {exc}"]))
                pending.append(unreadable)
                continue
            transformed = transform_text(text, job, replacements=replacements, allowed=allowed)
            pending.append(pool.submit(format_output, text, transformed, root, ruff=ruff))
        return [future.result() for future in pending]


def _remove_empty_dirs(root: Path, rules: Sequence[tuple[str, str]]) -> None:
    for _, dst_dir in rules:
        base = root / dst_dir
        if not base.is_dir():
            continue
        for dirpath in sorted((p for p in base.rglob("*") if p.is_dir()), reverse=True):
            if dirpath.name == "__pycache__":
                continue
            entries = list(dirpath.iterdir())
            if all(e.name == "__pycache__" and e.is_dir() for e in entries):
                for e in entries:
                    shutil.rmtree(e)
                dirpath.rmdir()


def run(
    root: Path,
    *,
    check: bool,
    hygiene: bool = True,
    rules: Sequence[tuple[str, str]] = RULES,
    replacements: Mapping[str, str] = REPLACEMENTS,
    allowed: frozenset[str] = ALLOWED_NAMES,
    out: Callable[[str], None] = print,
) -> int:
    """Generate (or with ``check``, verify) every target; return the exit status."""

    def err(msg: str) -> None:
        print(msg, file=sys.stderr)

    results: list[Result] = []
    errors = validate_table(replacements)
    if not errors:
        try:
            jobs = plan(root, rules)
            results = generate_all(root, jobs, replacements=replacements, allowed=allowed)
        except GenerationError as exc:
            errors = [str(exc)]
        else:
            errors = [e for r in results for e in r.errors]
    if hygiene and not errors:
        used = set().union(*(r.used for r in results))
        errors = [
            f"REPLACEMENTS key {key!r} matches nothing in any source file; remove it"
            for key in sorted(set(replacements) - used)
        ]
    if errors:
        for e in errors:
            err(f"unasync: error: {e}")
        err(f"unasync: failed with {len(errors)} error(s); nothing written")
        return 1

    outputs = {r.job.target: r.text for r in results if r.text is not None}
    sources = {r.job.target: r.job.source for r in results}
    on_disk = existing_targets(root, rules)
    orphans = [p for p in on_disk if p not in outputs]
    headerless = [p for p in on_disk if not has_header(root / p)]

    if check:
        changed, missing = [], []
        for target, text in outputs.items():
            path = root / target
            if not path.is_file():
                missing.append(target)
                continue
            current = path.read_bytes()
            if current != text.encode("utf-8"):
                changed.append(target)
                old = current.decode("utf-8", "replace").splitlines(keepends=True)
                diff = difflib.unified_diff(
                    old, text.splitlines(keepends=True), f"a/{target}", f"b/{target}"
                )
                out("".join(diff).rstrip("\n"))
        for target in missing:
            out(f"unasync: missing: {target} (from {sources[target]})")
        for target in orphans:
            out(f"unasync: orphan: {target} has no source")
        for target in headerless:
            out(f"unasync: no generated header: {target}")
        if changed or missing or orphans or headerless:
            out(
                f"unasync: out of date: {len(changed)} changed, {len(missing)} missing, "
                f"{len(orphans)} orphan(s), {len(headerless)} without header "
                f'-- run "python {SCRIPT_NAME}"'
            )
            return 1
        out(f"unasync: {len(outputs)} files up to date")
        return 0

    written = 0
    for target, text in outputs.items():
        path = root / target
        data = text.encode("utf-8")
        if path.is_file() and path.read_bytes() == data:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        written += 1
    deleted = 0
    for target in orphans:
        if target not in headerless:
            (root / target).unlink()
            deleted += 1
    if deleted:
        _remove_empty_dirs(root, rules)
    stray = [p for p in headerless if p not in outputs]
    for target in stray:
        err(f"unasync: error: {target} is in a generated directory but is not generated")
    out(f"unasync: {len(outputs)} files, {written} written, {deleted} stale file(s) deleted")
    return 1 if stray else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if any output is stale"
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=DEFAULT_ROOT,
        help="repository root (default: the parent of scripts/)",
    )
    parser.add_argument(
        "--no-hygiene",
        dest="hygiene",
        action="store_false",
        help="skip the check that every REPLACEMENTS key is used (for tests on small trees)",
    )
    args = parser.parse_args(argv)
    return run(args.root.resolve(), check=args.check, hygiene=args.hygiene)


if __name__ == "__main__":
    sys.exit(main())

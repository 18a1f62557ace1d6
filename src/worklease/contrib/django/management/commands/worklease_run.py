"""``manage.py worklease_run NAME [NAME ...]``: run the workers of ``WORKLEASE['WORKERS']``
until SIGTERM or Ctrl-C, then stop them gracefully (pools hand their work IDs over ABANDONED
with their checkpoints, leaders step down) and exit 0. When one of them fails, the others are
stopped the same way and the command exits 1; a second signal ends it without waiting."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from types import FrameType
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from worklease import Leader, Pool
from worklease._compat import Event, join_all, spawn
from worklease.contrib.django._backend import get_backend, reset
from worklease.contrib.django._conf import load, worker_factory

logger = logging.getLogger("worklease.contrib.django")

Service = tuple[str, Callable[[], None], Callable[[], None]]
"""What runs: a label, the blocking call, and what stops it."""


def services(name: str, built: object) -> list[Service]:
    """The pools and leaders a worker function returned, as services."""
    if isinstance(built, Pool):
        return [(f"{name}: pool", built.run, built.stop)]
    if isinstance(built, tuple) and len(built) == 2 and isinstance(built[0], Leader):
        leader, fn = built
        if not callable(fn):
            raise CommandError(f"worker {name!r}: the leader's term function is not callable")
        return [
            (f"{name}: leader of {leader.work_id!r}", lambda: leader.run_forever(fn), leader.stop)
        ]
    if isinstance(built, list | tuple) and built:
        return [service for item in built for service in services(name, item)]
    raise CommandError(
        f"worker {name!r} returned {type(built).__name__}: a worker function returns a "
        "worklease.Pool, a (worklease.Leader, function) pair, or a list of those (the sync "
        "flavour: this command runs them in threads)"
    )


class Command(BaseCommand):
    help = (
        "Run the worklease workers named in WORKLEASE['WORKERS'] (pools and leaders) until "
        "SIGTERM or Ctrl-C, then hand their work over and exit."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("names", nargs="*", metavar="NAME", help="workers to run")
        parser.add_argument("--list", action="store_true", help="list the configured workers")

    def handle(self, *args: str, **options: Any) -> None:
        names: list[str] = options["names"]
        try:
            conf = load()
            if options["list"] or not names:
                known = sorted(name for name, _ in conf.workers)
                if options["list"]:
                    for name, path in sorted(conf.workers):
                        self.stdout.write(f"{name}\t{path}")
                    return
                raise CommandError(
                    "name the workers to run: "
                    + (", ".join(known) or "none configured (set WORKLEASE['WORKERS'])")
                )
            factories = [(name, worker_factory(conf, name)) for name in names]
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        backend = get_backend()
        try:
            running = [s for name, factory in factories for s in services(name, factory(backend))]
            self._run(running)
        finally:
            reset()

    def _run(self, running: list[Service]) -> None:
        stop = Event()
        ended = Event()
        failures: list[str] = []

        def requested(signum: int, frame: FrameType | None) -> None:
            stop.set()
            ended.set()
            # A second signal is not asked politely: the default action (SIGINT raises
            # KeyboardInterrupt, SIGTERM ends the process) for a work function that never
            # looks at its renewal.
            signal.signal(signum, previous[signal.Signals(signum)])

        def body(label: str, call: Callable[[], None]) -> None:
            try:
                call()
            except Exception as exc:
                failure = f"{label}: {type(exc).__name__}: {exc}"
                logger.error("worklease_run: %s; stopping the others", failure, exc_info=exc)
                failures.append(failure)
            finally:
                ended.set()

        previous = {sig: signal.signal(sig, requested) for sig in (signal.SIGTERM, signal.SIGINT)}
        threads = []
        try:
            for label, call, _ in running:
                threads.append(spawn(body, label, call, name=f"worklease {label}"))
                self.stdout.write(f"running {label}")
            while not (stop.is_set() or failures) and any(t.is_alive() for t in threads):
                ended.wait(0.5)
                ended.clear()
            if stop.is_set() or failures:
                self.stdout.write("stopping: handing the work over")
            for _, _, halt in running:
                halt()
            join_all(threads)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if failures:
            raise CommandError("; ".join(failures))
        self.stdout.write("stopped")

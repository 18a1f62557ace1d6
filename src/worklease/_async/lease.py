"""The lease handle: acquire, checkpoint, renew, release, forget, renewal and hold."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from .._acompat import abounded, asleep, awithin
from .._batching import chunks, write_lanes
from .._deadline import bounded_by, current_deadline, earliest, self_bounded
from .._fairshare import PoolSurvey
from .._models import Checkpoint, DeclaredExit, ExitMode, Token
from .._options import (
    DEFAULT_CLEANUP_TIMEOUT,
    DEFAULT_POLL_INTERVAL,
    AcquireOptions,
    RenewalOptions,
    acquire_options,
    check_instance,
    configuring,
    hold_options,
    renewal_options,
)
from .._pacing import WaitPacing
from .._report import LeaseReporter
from .._validation import (
    Duration,
    check_exit_mode,
    check_holder_id,
    check_ttl,
    check_work_id,
    normalize_state,
)
from .._window import Backoff, TokenSeal, fresh, monotonic, seal_token, unseal
from ..errors import BackendError, BackendRequiredError, ConfigError, LeaseHeldError, LeaseLostError
from ..observers import LeaseObserver
from .backend import AsyncBackend, AsyncCapabilities, AsyncRenewMany, StateLike
from .group import AsyncGroupCommit
from .hold import AsyncHold
from .renewal import AsyncRenewal, AsyncRenewals
from .transaction import AsyncLeaseTransaction
from .watch import AsyncReleaseWatch, open_release_watch

__all__ = ["AsyncLease"]

_IS_SYNC = False

_ATTEMPT_FLOOR = 0.05
"""Seconds an acquire attempt may always take, even at the end of a waiting acquire's
timeout (a last attempt right at the deadline still gets a fair chance)."""

_SERVER_FIRST = 0.05
"""How much longer than a bounded attempt's own deadline the lease waits before abandoning
it, so a backend bounding its own call (PostgreSQL's statement timeout) ends it first and
cleanly."""


class AsyncLease:
    """Acquires, renews, checkpoints and releases leases on work IDs for one holder.

    ``holder_id`` names this process (unique per process, e.g. a pod name); ``ttl`` is the
    lease duration in seconds (or a ``timedelta``), from 1 ms to 100 years. ``observer``
    receives an event after every operation. One lease object may be shared by many tasks or
    threads. Bad settings raise ``ConfigError`` here, before any I/O.

    Leases are not re-entrant: acquiring a work ID this holder already holds raises
    ``LeaseHeldError``.
    """

    __module__ = "worklease"

    def __init__(
        self,
        backend: AsyncBackend,
        *,
        holder_id: str,
        ttl: Duration,
        observer: LeaseObserver | None = None,
    ) -> None:
        if backend is None:
            raise BackendRequiredError("a backend is required")
        if observer is not None:
            check_instance(observer, LeaseObserver, "observer (subclass it)", ConfigError)
        self._backend = backend
        self._holder_id = check_holder_id(holder_id)
        self._ttl = check_ttl(ttl)
        self._observer = observer if observer is not None else LeaseObserver()
        self._report = LeaseReporter(self._observer)
        self._capabilities = AsyncCapabilities.of(backend)
        self._self_bounded = self_bounded(backend)
        """The backend hands control back by any deadline it is given: a thread makes a
        hold's final writes itself rather than in a helper thread (``_compat.cleanup``)."""
        self._renewals = AsyncRenewals(self._renew_together, self._ttl)
        # Group commit: concurrent calls through this object share one statement per round
        # when the backend has the batch operation (see group.py).
        # A lone write is the backend's own call, awaited by the group with no call of the
        # lease's in between (each layer costs its share of every write).
        capabilities = self._capabilities
        ttl = self._ttl
        self._checkpoints: AsyncGroupCommit[tuple[Token, bytes | None]] | None = None
        if capabilities.checkpoint_many is not None:
            # Checkpoints go alone while the backend has a free lane (its pool's size), so
            # callers that find connections free run side by side; only a queue is grouped.
            self._checkpoints = AsyncGroupCommit(
                lambda item: backend.checkpoint(item[0], item[1], ttl),
                self._checkpoint_many,
                operation="checkpoint",
                lanes=lambda: write_lanes(backend),
            )
        self._renews: AsyncGroupCommit[Token] | None = None
        if capabilities.renew_many is not None:
            self._renews = AsyncGroupCommit(
                lambda token: backend.renew(token, ttl), self._renew_many, operation="renew"
            )
        self._releases: AsyncGroupCommit[tuple[Token, ExitMode]] | None = None
        if capabilities.release_many is not None:
            self._releases = AsyncGroupCommit(
                lambda item: backend.release(item[0], item[1]),
                self._release_many,
                operation="release",
            )

    @property
    def backend(self) -> AsyncBackend:
        """The backend this lease stores rows in."""
        return self._backend

    @property
    def holder_id(self) -> str:
        """The holder ID recorded on every lease this object acquires."""
        return self._holder_id

    @property
    def ttl(self) -> float:
        """The lease duration in seconds."""
        return self._ttl

    @property
    def observer(self) -> LeaseObserver:
        """The observer receiving lease events (a do-nothing one by default)."""
        return self._observer

    def __repr__(self) -> str:
        return f"<{type(self).__name__} holder_id={self._holder_id!r} ttl={self._ttl:g}s>"

    # -- acquire ------------------------------------------------------------------------------

    async def acquire(
        self,
        work_id: str,
        *,
        wait: bool = False,
        timeout: Duration | None = None,
        poll_interval: Duration = DEFAULT_POLL_INTERVAL,
    ) -> Token:
        """Acquire the lease on ``work_id`` and return its token.

        Raises ``LeaseHeldError`` when somebody (this holder included) holds it. With
        ``wait=True``, retries until acquired, waiting the poll interval or until the holder's
        expiry if that comes first (so a crashed holder's work is picked up right after it
        expires), or until the holder releases when the backend can tell (``watch_releases``);
        ``timeout`` (seconds) bounds the whole wait, the backend call in flight included
        (it is abandoned, and on PostgreSQL cancelled server-side, at the deadline), and ends
        it with ``TimeoutError``.
        An invalid argument raises ``TypeError``/``ValueError`` before any I/O.
        """
        check_work_id(work_id)
        options = acquire_options(wait, timeout, poll_interval)
        if options.wait:
            token, _ = await self._acquire(work_id, options, reading=False)
        else:  # the common call: one attempt, no wait to set up
            token, _ = await self._acquire_once(work_id, False, None)
        return token

    async def _acquire_with_prior(
        self, work_id: str, options: AcquireOptions
    ) -> tuple[Token, Checkpoint | None]:
        """Acquire, and read the checkpoint in the same step when the backend can (else the
        second item is ``None`` and the caller reads it)."""
        check_work_id(work_id)
        return await self._acquire(work_id, options, reading=True)

    async def _acquire(
        self, work_id: str, options: AcquireOptions, *, reading: bool
    ) -> tuple[Token, Checkpoint | None]:
        if not options.wait:
            return await self._acquire_once(work_id, reading, None)
        limit = options.timeout
        deadline = None if limit is None else monotonic() + limit
        pacing = WaitPacing(options.poll_interval)
        # Opened before the first attempt, so a release right after a refused attempt still
        # ends the wait that follows it.
        watch = self._watch_releases((work_id,))
        try:
            while True:
                started = datetime.now(UTC)
                try:
                    return await self._acquire_once(work_id, reading, deadline)
                except LeaseHeldError as held:
                    last_held = held
                except Exception as exc:
                    if deadline is not None and monotonic() >= deadline:
                        raise TimeoutError(
                            f"work ID {work_id!r}: the acquire did not succeed within the "
                            f"{limit:g}s timeout ({type(exc).__name__}: {exc})"
                        ) from exc
                    raise
                delay = pacing.next_delay(last_held.expires_at, started)
                if deadline is not None:
                    left = deadline - monotonic()
                    if left <= 0:
                        raise TimeoutError(
                            f"work ID {work_id!r} was still held after waiting {limit:g}s"
                        ) from last_held
                    delay = min(delay, left)
                if watch is None:
                    await asleep(delay)
                else:
                    await watch.wait(delay)  # ends early when the holder releases
        finally:
            if watch is not None:
                watch.close()

    async def _acquire_once(
        self, work_id: str, reading: bool, deadline: float | None
    ) -> tuple[Token, Checkpoint | None]:
        """One acquire attempt, reported; bounded by ``deadline`` (monotonic) when given."""
        combined = self._capabilities.acquire_with_checkpoint if reading else None
        with self._report.acquire(work_id) as call:
            start = call.start
            if deadline is None:
                raw, prior = await self._acquire_call(work_id, combined is not None)
            else:
                budget = max(deadline - start, _ATTEMPT_FLOOR)
                with bounded_by(start + budget):
                    raw, prior = await awithin(
                        budget + _SERVER_FIRST,
                        self._hand_back,
                        self._acquire_call,
                        work_id,
                        combined is not None,
                    )
            token = seal_token(raw, self._backend, start, self._ttl)
            call.result = (token, prior)
        return token, prior

    async def _acquire_call(self, work_id: str, reading: bool) -> tuple[Token, Checkpoint | None]:
        combined = self._capabilities.acquire_with_checkpoint
        if reading and combined is not None:
            return await combined.acquire_with_checkpoint(work_id, self._holder_id, self._ttl)
        return await self._backend.acquire(work_id, self._holder_id, self._ttl), None

    async def _hand_back(self, granted: tuple[Token, Checkpoint | None]) -> None:
        """Release a grant that arrived after its acquire was abandoned at the deadline
        (nobody holds its token), so the work ID is free again at once instead of after the
        TTL. The checkpoint is kept, and so is how the holder before left when it declared
        it (a retired work ID stays retired); otherwise the successor sees ABANDONED. The
        previous holder's ID now names this holder: the grant did happen."""
        token, prior = granted
        if prior is None:
            prior = await self._backend.read_checkpoint(token)
        mode = prior.prev_exit if prior.prev_exit.declarable else ExitMode.ABANDONED
        await self._backend.release(token, mode)

    async def _acquire_available(
        self, work_ids: list[str], *, known_free: bool = False
    ) -> list[tuple[Token, Checkpoint | None]]:
        """Acquire whichever of ``work_ids`` are free, with their checkpoints (for pools).

        Asks the backend which are free (``find_available``; skipped when the caller just
        read that: ``known_free``) and takes those in one step (``acquire_many``) when it
        can; otherwise tries them one by one. Work IDs somebody holds are left out. Each
        grant is reported like a single acquire and read.
        """
        capabilities = self._capabilities
        find = None if known_free else capabilities.find_available
        if find is None:
            free = list(work_ids)
        else:
            free = [
                work_id for part in chunks(work_ids) for work_id in await find.find_available(part)
            ]
        if not free:
            return []
        many = capabilities.acquire_many
        if many is None:
            return await self._acquire_each(free)
        # In chunks (see _batching): each commits on its own, and what was granted before a
        # failure is kept (its slots start); the failure is raised only when nothing was.
        grants: list[tuple[Token, Checkpoint | None]] = []
        for part in chunks(free):
            try:
                with self._report.acquire_many(list(part)) as call:
                    raw = await many.acquire_many(part, self._holder_id, self._ttl)
                    granted: list[tuple[Token, Checkpoint | None]] = [
                        (seal_token(token, self._backend, call.start, self._ttl), prior)
                        for token, prior in raw
                    ]
                    call.result = granted
            except Exception:
                if not grants:
                    raise
                break
            grants.extend(granted)
        return grants

    async def _acquire_each(self, work_ids: list[str]) -> list[tuple[Token, Checkpoint | None]]:
        """The one-by-one fallback of ``_acquire_available``: a failure other than a held
        lease is raised only when nothing was acquired (the grants are not dropped)."""
        grants: list[tuple[Token, Checkpoint | None]] = []
        failure: Exception | None = None
        for work_id in work_ids:
            try:
                # No read here when the backend could not return the checkpoint with the
                # acquire: the slot's hold reads it (and a failed read is handled there).
                grants.append(await self._acquire_once(work_id, True, None))
            except LeaseHeldError:
                continue
            except Exception as exc:
                failure = exc
                break
        if failure is not None and not grants:
            raise failure
        return grants

    async def _survey(self, work_ids: list[str], prefix: str) -> PoolSurvey | None:
        """The backend's survey of a pool group, or ``None`` when it has none."""
        survey = self._capabilities.survey
        return None if survey is None else await survey.survey(work_ids, prefix)

    def _watch_releases(self, work_ids: tuple[str, ...]) -> AsyncReleaseWatch | None:
        """A watch on ``work_ids`` when the backend reports releases, else ``None``."""
        return open_release_watch(self._capabilities.watch_releases, work_ids)

    # -- reads --------------------------------------------------------------------------------

    async def read_checkpoint(self, token: Token) -> Checkpoint:
        """The token's checkpoint and how the previous holder left.

        ``FencedError`` when the token was superseded or the row is gone.
        """
        unseal(token, self._backend)
        with self._report.read(token) as call:
            prior = call.result = await self._backend.read_checkpoint(token)
        return prior

    # -- writes -------------------------------------------------------------------------------

    def _writable(self, token: Token) -> TokenSeal:
        """The token's seal, refusing a token whose renewal already reported the loss."""
        seal = unseal(token, self._backend)
        cause = seal.lost_cause()
        if cause is not None:
            raise fresh(cause)
        return seal

    async def checkpoint(self, token: Token, state: StateLike | None) -> None:
        """Write ``state`` and extend the lease in one atomic step.

        ``state`` is copied; ``None`` or empty bytes clear the checkpoint. It may revive a
        lapsed lease nobody else took and whose holder declared no exit. Raises ``TypeError``
        for state that is not bytes-like, ``FencedError`` when superseded, and
        ``LeaseExpiredError`` after this holder released it. A transient failure once the
        renewal's window has closed (a thread's write is cut off at its end) raises the
        renewal's loss cause instead, with the failure as its ``__cause__``.
        """
        data = normalize_state(state)
        seal = self._writable(token)
        # Inside a renewal a thread's write is bounded by the window (server-side on
        # PostgreSQL): a call stuck on a lock or a hung synchronous standby never outlives
        # the lease. A deadline set around the call (a hold's final writes, run in the
        # calling thread) bounds it too, if sooner. With asyncio the renewal cancels the
        # block, and the call with it.
        deadline = earliest(seal.deadline(), current_deadline()) if _IS_SYNC else None
        with self._report.checkpoint(token, state) as start, bounded_by(deadline):
            group = self._checkpoints
            try:
                if group is None:
                    await self._backend.checkpoint(token, data, self._ttl)
                else:
                    await group.submit((token, data), token.work_id, deadline)
            except BackendError as exc:
                # Failed once the lease window had closed (a thread's write is cut off there):
                # the window's loss is what happened, the transient error only how it showed.
                lost = seal.lost_cause() if exc.transient else None
                if lost is None:
                    raise
                raise fresh(lost) from exc
            seal.extend(start, self._ttl)

    async def _checkpoint_many(
        self, items: list[tuple[Token, bytes | None]]
    ) -> list[LeaseLostError | None]:
        many = self._capabilities.checkpoint_many
        assert many is not None
        outcomes: list[LeaseLostError | None] = []
        for part in chunks(items):
            outcomes.extend(await many.checkpoint_many(part, self._ttl))
        return outcomes

    def transaction(self, token: Token) -> AsyncLeaseTransaction:
        """A transactional step: your own writes and the step's checkpoint commit together,
        only while ``token`` is the current grant (see ``AsyncLeaseTransaction``)::

            with lease.transaction(token) as tx:
                tx.connection.execute("INSERT INTO invoices ...")
                tx.checkpoint(b"invoice 42 done")

        ``TypeError`` when the backend has no transactions (the PostgreSQL and memory
        backends have them).
        """
        capability = self._capabilities.transaction
        if capability is None:
            raise TypeError(
                f"{type(self._backend).__name__} has no transaction(): transactional steps "
                "need a backend that offers them (PostgreSQL, memory)"
            )
        seal = self._writable(token)
        return AsyncLeaseTransaction(
            capability.transaction(token), token, seal, self._ttl, self._report
        )

    async def renew(self, token: Token) -> None:
        """Extend the lease by the TTL without touching the checkpoint.

        ``FencedError`` when superseded; ``LeaseExpiredError`` once the lease lapsed or was
        released (only a checkpoint can revive a lapsed lease).
        """
        seal = self._writable(token)
        with self._report.renew(token, 1) as start:
            group = self._renews
            if group is None:
                await self._backend.renew(token, self._ttl)
            else:
                await group.submit(token, token.work_id, None)
            seal.extend(start, self._ttl)

    async def _renew_many(self, tokens: list[Token]) -> list[LeaseLostError | None]:
        many = self._capabilities.renew_many
        assert many is not None
        outcomes: list[LeaseLostError | None] = []
        for part in chunks(tokens):
            outcomes.extend(await many.renew_many(part, self._ttl))
        return outcomes

    async def release(self, token: Token, mode: ExitMode | DeclaredExit) -> None:
        """Record how this holder leaves and make the work ID acquirable at once.

        ``mode`` is FINISHED, ABANDONED or RETIRED (anything else raises
        ``InvalidExitModeError`` with no I/O). ``FencedError`` when superseded;
        ``LeaseExpiredError`` when the lease already lapsed (nothing is recorded: the
        successor sees EXPIRED) or was already released. A renewal still running on the token
        is stopped first (it stays stopped if the release fails).
        """
        declared = check_exit_mode(mode)
        seal = self._writable(token)
        deadline = (
            earliest(seal.deadline(), current_deadline()) if _IS_SYNC else None
        )  # see checkpoint
        seal.finished()  # the holder gives the lease up: stop renewing it first
        with self._report.release(token, declared), bounded_by(deadline):
            group = self._releases
            if group is None:
                await self._backend.release(token, declared)
            else:
                await group.submit((token, declared), token.work_id, deadline)

    async def _release_many(
        self, items: list[tuple[Token, ExitMode]]
    ) -> list[LeaseLostError | None]:
        """One ``release_many`` per exit mode in the round; each item's outcome, in order."""
        many = self._capabilities.release_many
        assert many is not None
        outcomes: list[LeaseLostError | None] = [None] * len(items)
        for mode in dict.fromkeys(mode for _, mode in items):
            every = [i for i, (_, item_mode) in enumerate(items) if item_mode is mode]
            for indexes in chunks(every):
                results = await many.release_many([items[i][0] for i in indexes], mode)
                if len(results) != len(indexes):
                    raise BackendError(
                        f"release_many returned {len(results)} outcomes for {len(indexes)} tokens"
                    )
                for i, result in zip(indexes, results, strict=True):
                    outcomes[i] = result
        return outcomes

    async def forget(self, token: Token) -> None:
        """Delete the work ID's row for good (also after this holder's own release).

        The next holder sees ExitMode.NONE and a greater token. ``FencedError`` when the
        lease moved on or the row is already gone.
        """
        unseal(token, self._backend).finished()  # stop renewing a row about to go
        with self._report.forget(token):
            await self._backend.forget(token)

    # -- renewal and hold ---------------------------------------------------------------------

    def renewal(
        self,
        token: Token,
        *,
        interval: Duration | None = None,
        backoff: Backoff | None = None,
    ) -> AsyncRenewal:
        """A background renewal of ``token``, run while its context manager is entered.

        ``interval`` defaults to a third of the TTL; ``backoff`` paces retries of transient
        failures (default ``Backoff()``); bad values raise ``ConfigError``. See the renewal
        class for how loss is reported.
        """
        with configuring(ConfigError):
            options = renewal_options(interval, backoff)
        return self._renewal(token, options)

    def _renewal(self, token: Token, options: RenewalOptions) -> AsyncRenewal:
        return AsyncRenewal(self._renewals, token, self._writable(token), options)

    def hold(
        self,
        work_id: str,
        *,
        wait: bool = False,
        timeout: Duration | None = None,
        poll_interval: Duration = DEFAULT_POLL_INTERVAL,
        interval: Duration | None = None,
        backoff: Backoff | None = None,
        cleanup_timeout: Duration = DEFAULT_CLEANUP_TIMEOUT,
    ) -> AsyncHold:
        """Hold ``work_id`` for the duration of a ``with`` block (see the hold class).

        Bad arguments (the work ID included) raise ``ConfigError`` here, before any I/O.
        """
        with configuring(ConfigError):
            check_work_id(work_id)
            options = hold_options(
                wait=wait,
                timeout=timeout,
                poll_interval=poll_interval,
                interval=interval,
                backoff=backoff,
                cleanup_timeout=cleanup_timeout,
            )
        return AsyncHold(self, work_id, options)

    async def _renew_together(
        self, tokens: list[Token], attempts: list[int], timeout: float
    ) -> list[Exception | None]:
        """Renew ``tokens`` in one backend call when the backend can (else one by one);
        return each token's outcome (``None``: renewed), each reported to the observer."""
        renew_many = self._capabilities.renew_many
        if renew_many is None or len(tokens) == 1:
            outcomes: list[Exception | None] = []
            for token, attempt in zip(tokens, attempts, strict=True):
                try:
                    with self._report.renew(token, attempt):
                        await abounded(timeout, self._backend.renew, token, self._ttl)
                except Exception as exc:
                    outcomes.append(exc)
                else:
                    outcomes.append(None)
            return outcomes
        start = monotonic()
        results: list[Exception | None] = []
        for part in chunks(tokens):  # one deadline for the round, however many chunks
            results.extend(await self._renew_chunk(renew_many, part, start + timeout))
        duration = monotonic() - start
        for token, attempt, outcome in zip(tokens, attempts, results, strict=True):
            if unseal(token, self._backend).given_up:
                continue  # released or forgotten meanwhile: its renewal means nothing now
            self._report.renewed(token, attempt, duration, outcome)
        return results

    async def _renew_chunk(
        self, renew_many: AsyncRenewMany, tokens: Sequence[Token], deadline: float
    ) -> list[Exception | None]:
        """One chunk of a renewal round: each token's outcome (a failure of the call is
        every token's)."""
        try:
            left = deadline - monotonic()
            if left <= 0:
                raise TimeoutError("the renewal round ran out of time before this chunk")
            results: list[Exception | None] = list(
                await abounded(left, renew_many.renew_many, tokens, self._ttl)
            )
            if len(results) != len(tokens):
                raise BackendError(
                    f"renew_many returned {len(results)} outcomes for {len(tokens)} tokens"
                )
        except LeaseLostError as exc:
            # A loss is per token; a batch cannot be lost as a whole: treat it as a failed
            # attempt, retried like any other.
            error = BackendError(f"renew_many failed as a whole: {exc}", transient=True)
            error.__cause__ = exc
            results = [error] * len(tokens)
        except Exception as exc:
            results = [exc] * len(tokens)
        return results

    async def _release_together(
        self, tokens: list[Token], mode: ExitMode | DeclaredExit
    ) -> list[Exception | None]:
        """Release ``tokens`` with ``mode`` in one backend call when the backend can (else one
        by one); return each token's outcome (``None``: released), each reported like a
        single release. A token whose renewal reported a loss is refused as ``release``
        refuses it; every renewal still running on the tokens is stopped first."""
        declared = check_exit_mode(mode)
        outcomes: list[Exception | None] = [None] * len(tokens)
        batch: list[int] = []
        alone: list[int] = []
        seen: set[str] = set()
        for index, token in enumerate(tokens):
            try:
                self._writable(token).finished()
            except Exception as exc:
                outcomes[index] = exc
                continue
            (alone if token.work_id in seen else batch).append(index)
            seen.add(token.work_id)
        many = self._capabilities.release_many
        if many is None or len(batch) == 1:
            alone = batch + alone
            batch = []
        for part in chunks(batch):
            assert many is not None  # a batch only when the backend releases many
            chosen = [tokens[index] for index in part]
            start = monotonic()
            try:
                results: list[Exception | None] = list(await many.release_many(chosen, declared))
                if len(results) != len(chosen):
                    raise BackendError(
                        f"release_many returned {len(results)} outcomes for {len(chosen)} tokens"
                    )
            except Exception as exc:
                results = [exc] * len(chosen)
            duration = monotonic() - start
            for index, outcome in zip(part, results, strict=True):
                outcomes[index] = outcome
                self._report.released(tokens[index], declared, duration, outcome)
        for index in alone:
            try:
                with self._report.release(tokens[index], declared):
                    await self._backend.release(tokens[index], declared)
            except Exception as exc:
                outcomes[index] = exc
        return outcomes

    def _given_up(self, token: Token) -> bool:
        """Whether the holder already released or forgot ``token`` through this lease."""
        return unseal(token, self._backend).given_up

"""The lease handle: acquire, checkpoint, renew, release, forget, renewal and hold."""

from __future__ import annotations

from datetime import timedelta

from .._acompat import ThreadLock, abounded, aloop_key, asleep
from .._models import Checkpoint, ExitMode, Operation, Token
from .._pacing import WaitPacing
from .._validation import (
    check_exit_mode,
    check_holder_id,
    check_ttl,
    check_work_id,
    normalize_state,
    positive_seconds,
    state_size,
    to_seconds,
)
from .._window import Backoff, TokenSeal, fresh, monotonic, seal_token, unseal
from ..errors import (
    BackendError,
    BackendRequiredError,
    ConfigError,
    FencedError,
    LeaseHeldError,
    LeaseLostError,
)
from ..observers import (
    AcquireEvent,
    CheckpointEvent,
    FencedEvent,
    ForgetEvent,
    LeaseObserver,
    ReadCheckpointEvent,
    ReleaseEvent,
    RenewEvent,
    notify,
)
from .backend import AsyncBackend, StateLike
from .hold import AsyncHold
from .renewal import AsyncRenewal, AsyncRenewer
from .watch import open_release_watch

__all__ = ["AsyncLease"]

DEFAULT_POLL_INTERVAL = 2.0
DEFAULT_CLEANUP_TIMEOUT = 5.0


class AsyncLease:
    """Acquires, renews, checkpoints and releases leases on work IDs for one holder.

    ``holder_id`` names this process (unique per process, e.g. a pod name); ``ttl`` is the
    lease duration in seconds (or a ``timedelta``), at least 1 ms. ``observer`` receives an
    event after every operation. One lease object may be shared by many tasks or threads.

    Leases are not re-entrant: acquiring a work ID this holder already holds raises
    ``LeaseHeldError``.
    """

    __module__ = "worklease"

    def __init__(
        self,
        backend: AsyncBackend,
        *,
        holder_id: str,
        ttl: float | timedelta,
        observer: LeaseObserver | None = None,
    ) -> None:
        if backend is None:
            raise BackendRequiredError("a backend is required")
        if observer is not None and not isinstance(observer, LeaseObserver):
            raise ConfigError("observer must be a LeaseObserver (subclass it)")
        self._backend = backend
        self._holder_id = check_holder_id(holder_id)
        self._ttl = check_ttl(ttl)
        self._observer = observer if observer is not None else LeaseObserver()
        self._renewers: dict[object, AsyncRenewer] = {}
        self._renewers_lock = ThreadLock()

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
        timeout: float | timedelta | None = None,
        poll_interval: float | timedelta = DEFAULT_POLL_INTERVAL,
    ) -> Token:
        """Acquire the lease on ``work_id`` and return its token.

        Raises ``LeaseHeldError`` when somebody (this holder included) holds it. With
        ``wait=True``, retries until acquired, waiting the poll interval or until the holder's
        expiry if that comes first (so a crashed holder's work is picked up right after it
        expires), or until the holder releases when the backend can tell (``watch_releases``);
        ``timeout`` (seconds) bounds the wait and ends it with ``TimeoutError``.
        An invalid work ID raises ``TypeError``/``ValueError`` before any I/O.
        """
        check_work_id(work_id)
        poll = positive_seconds(poll_interval, "poll_interval")
        limit: float | None = None
        if timeout is not None:
            if not wait:
                raise ValueError("timeout applies to a waiting acquire: pass wait=True")
            limit = to_seconds(timeout, "timeout")
            if not limit >= 0:
                raise ValueError(f"timeout must be a non-negative duration, got {timeout!r}")
        token, _ = await self._acquire(work_id, wait, limit, poll, reading=False)
        return token

    async def _acquire_with_prior(
        self,
        work_id: str,
        *,
        wait: bool,
        timeout: float | timedelta | None,
        poll_interval: float | timedelta,
    ) -> tuple[Token, Checkpoint | None]:
        """Acquire, and read the checkpoint in the same step when the backend can (else the
        second item is ``None`` and the caller reads it)."""
        check_work_id(work_id)
        poll = positive_seconds(poll_interval, "poll_interval")
        limit = None if timeout is None else to_seconds(timeout, "timeout")
        return await self._acquire(work_id, wait, limit, poll, reading=True)

    async def _acquire(
        self, work_id: str, wait: bool, limit: float | None, poll: float, *, reading: bool
    ) -> tuple[Token, Checkpoint | None]:
        deadline = None if limit is None else monotonic() + limit
        pacing = WaitPacing(poll)
        # Opened before the first attempt, so a release right after a refused attempt still
        # ends the wait that follows it.
        watch = open_release_watch(self._backend, (work_id,)) if wait else None
        try:
            while True:
                try:
                    return await self._acquire_once(work_id, reading)
                except LeaseHeldError as held:
                    if not wait:
                        raise
                    last_held = held
                delay = pacing.next_delay(last_held.expires_at)
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

    async def _acquire_once(self, work_id: str, reading: bool) -> tuple[Token, Checkpoint | None]:
        start = monotonic()
        prior: Checkpoint | None = None
        combined = getattr(self._backend, "acquire_with_checkpoint", None) if reading else None
        try:
            if combined is not None:
                raw, prior = await combined(work_id, self._holder_id, self._ttl)
            else:
                raw = await self._backend.acquire(work_id, self._holder_id, self._ttl)
            token = seal_token(raw, self._backend, start, self._ttl)
        except Exception as exc:
            notify(self._observer.on_acquire, AcquireEvent(work_id, None, monotonic() - start, exc))
            raise
        notify(self._observer.on_acquire, AcquireEvent(work_id, token, monotonic() - start, None))
        if prior is not None:  # read in the same call: reported with no time of its own
            notify(
                self._observer.on_read_checkpoint,
                ReadCheckpointEvent(
                    token, prior.prev_exit, prior.prev_holder_id, state_size(prior.state), 0.0, None
                ),
            )
        return token, prior

    async def _acquire_available(
        self, work_ids: list[str]
    ) -> list[tuple[Token, Checkpoint | None]]:
        """Acquire whichever of ``work_ids`` are free, with their checkpoints (for pools).

        Asks the backend which are free (``find_available``) and takes those in one step
        (``acquire_many``) when it can; otherwise tries them one by one. Work IDs somebody
        holds are left out. Each grant is reported like a single acquire and read.
        """
        backend = self._backend
        find = getattr(backend, "find_available", None)
        free = list(await find(work_ids)) if find is not None else list(work_ids)
        if not free:
            return []
        many = getattr(backend, "acquire_many", None)
        if many is None:
            return await self._acquire_each(free)
        start = monotonic()
        try:
            raw = await many(free, self._holder_id, self._ttl)
            grants: list[tuple[Token, Checkpoint | None]] = [
                (seal_token(token, backend, start, self._ttl), prior) for token, prior in raw
            ]
        except Exception as exc:
            duration = monotonic() - start
            for work_id in free:
                notify(self._observer.on_acquire, AcquireEvent(work_id, None, duration, exc))
            raise
        duration = monotonic() - start
        for token, prior in grants:
            notify(self._observer.on_acquire, AcquireEvent(token.work_id, token, duration, None))
            assert prior is not None
            notify(
                self._observer.on_read_checkpoint,
                ReadCheckpointEvent(
                    token, prior.prev_exit, prior.prev_holder_id, state_size(prior.state), 0.0, None
                ),
            )
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
                grants.append(await self._acquire_once(work_id, True))
            except LeaseHeldError:
                continue
            except Exception as exc:
                failure = exc
                break
        if failure is not None and not grants:
            raise failure
        return grants

    # -- reads --------------------------------------------------------------------------------

    async def read_checkpoint(self, token: Token) -> Checkpoint:
        """The token's checkpoint and how the previous holder left.

        ``FencedError`` when the token was superseded or the row is gone.
        """
        unseal(token, self._backend)
        start = monotonic()
        try:
            prior = await self._backend.read_checkpoint(token)
        except Exception as exc:
            notify(
                self._observer.on_read_checkpoint,
                ReadCheckpointEvent(token, ExitMode.NONE, None, 0, monotonic() - start, exc),
            )
            raise
        notify(
            self._observer.on_read_checkpoint,
            ReadCheckpointEvent(
                token,
                prior.prev_exit,
                prior.prev_holder_id,
                state_size(prior.state),
                monotonic() - start,
                None,
            ),
        )
        return prior

    # -- writes -------------------------------------------------------------------------------

    def _writable(self, token: Token) -> TokenSeal:
        """The token's seal, refusing a token whose renewal already reported the loss."""
        seal = unseal(token, self._backend)
        cause = seal.lost_cause()
        if cause is not None:
            raise fresh(cause)
        return seal

    def _report_fenced(self, token: Token, operation: Operation, error: BaseException) -> None:
        if isinstance(error, FencedError):
            notify(self._observer.on_fenced, FencedEvent(token, operation, error))

    async def checkpoint(self, token: Token, state: StateLike | None) -> None:
        """Write ``state`` and extend the lease in one atomic step.

        ``state`` is copied; ``None`` or empty bytes clear the checkpoint. It may revive a
        lapsed lease nobody else took and whose holder declared no exit. Raises ``TypeError``
        for state that is not bytes-like, ``FencedError`` when superseded, and
        ``LeaseExpiredError`` after this holder released it.
        """
        data = normalize_state(state)
        size = state_size(state)
        seal = self._writable(token)
        start = monotonic()
        try:
            await self._backend.checkpoint(token, data, self._ttl)
        except Exception as exc:
            duration = monotonic() - start
            notify(self._observer.on_checkpoint, CheckpointEvent(token, size, duration, exc))
            self._report_fenced(token, Operation.CHECKPOINT, exc)
            raise
        seal.extend(start, self._ttl)
        notify(
            self._observer.on_checkpoint, CheckpointEvent(token, size, monotonic() - start, None)
        )

    async def renew(self, token: Token) -> None:
        """Extend the lease by the TTL without touching the checkpoint.

        ``FencedError`` when superseded; ``LeaseExpiredError`` once the lease lapsed or was
        released (only a checkpoint can revive a lapsed lease).
        """
        seal = self._writable(token)
        start = monotonic()
        await self._renew_once(token, 1, None)
        seal.extend(start, self._ttl)

    async def _renew_once(self, token: Token, attempt: int, timeout: float | None) -> None:
        """One backend renewal, reported to the observer (used by renew and renewals)."""
        start = monotonic()
        try:
            await abounded(timeout, self._backend.renew, token, self._ttl)
        except Exception as exc:
            duration = monotonic() - start
            notify(self._observer.on_renew, RenewEvent(token, attempt, duration, exc))
            self._report_fenced(token, Operation.RENEW, exc)
            raise
        notify(self._observer.on_renew, RenewEvent(token, attempt, monotonic() - start, None))

    async def release(self, token: Token, mode: ExitMode | str) -> None:
        """Record how this holder leaves and make the work ID acquirable at once.

        ``mode`` is FINISHED, ABANDONED or RETIRED (anything else raises
        ``InvalidExitModeError`` with no I/O). ``FencedError`` when superseded;
        ``LeaseExpiredError`` when the lease already lapsed (nothing is recorded: the
        successor sees EXPIRED) or was already released. A renewal still running on the token
        is stopped first (it stays stopped if the release fails).
        """
        declared = check_exit_mode(mode)
        seal = self._writable(token)
        seal.finished()  # the holder gives the lease up: stop renewing it first
        start = monotonic()
        try:
            await self._backend.release(token, declared)
        except Exception as exc:
            duration = monotonic() - start
            notify(self._observer.on_release, ReleaseEvent(token, declared, duration, exc))
            self._report_fenced(token, Operation.RELEASE, exc)
            raise
        notify(
            self._observer.on_release,
            ReleaseEvent(token, declared, monotonic() - start, None),
        )

    async def forget(self, token: Token) -> None:
        """Delete the work ID's row for good (also after this holder's own release).

        The next holder sees ExitMode.NONE and a greater token. ``FencedError`` when the
        lease moved on or the row is already gone.
        """
        unseal(token, self._backend).finished()  # stop renewing a row about to go
        start = monotonic()
        try:
            await self._backend.forget(token)
        except Exception as exc:
            notify(self._observer.on_forget, ForgetEvent(token, monotonic() - start, exc))
            self._report_fenced(token, Operation.FORGET, exc)
            raise
        notify(self._observer.on_forget, ForgetEvent(token, monotonic() - start, None))

    # -- renewal and hold ---------------------------------------------------------------------

    def renewal(
        self,
        token: Token,
        *,
        interval: float | timedelta | None = None,
        backoff: Backoff | None = None,
    ) -> AsyncRenewal:
        """A background renewal of ``token``, run while its context manager is entered.

        ``interval`` defaults to a third of the TTL; ``backoff`` paces retries of transient
        failures (default ``Backoff()``). See the renewal class for how loss is reported.
        """
        seal = self._writable(token)
        every = self._ttl / 3 if interval is None else positive_seconds(interval, "interval")
        if backoff is not None and not isinstance(backoff, Backoff):
            raise TypeError(f"backoff must be a Backoff, not {type(backoff).__name__}")
        return AsyncRenewal(self, token, seal, every, backoff or Backoff())

    def hold(
        self,
        work_id: str,
        *,
        wait: bool = False,
        timeout: float | timedelta | None = None,
        poll_interval: float | timedelta = DEFAULT_POLL_INTERVAL,
        interval: float | timedelta | None = None,
        backoff: Backoff | None = None,
        cleanup_timeout: float | timedelta = DEFAULT_CLEANUP_TIMEOUT,
    ) -> AsyncHold:
        """Hold ``work_id`` for the duration of a ``with`` block (see the hold class)."""
        check_work_id(work_id)
        positive_seconds(poll_interval, "poll_interval")
        if timeout is not None:
            if not wait:
                raise ValueError("timeout applies to a waiting acquire: pass wait=True")
            if not to_seconds(timeout, "timeout") >= 0:
                raise ValueError(f"timeout must be a non-negative duration, got {timeout!r}")
        if interval is not None:
            positive_seconds(interval, "interval")
        if backoff is not None and not isinstance(backoff, Backoff):
            raise TypeError(f"backoff must be a Backoff, not {type(backoff).__name__}")
        return AsyncHold(
            self,
            work_id,
            wait=wait,
            timeout=timeout,
            poll_interval=poll_interval,
            interval=interval,
            backoff=backoff,
            cleanup_timeout=positive_seconds(cleanup_timeout, "cleanup_timeout"),
        )

    def _renew_in_background(self, renewal: AsyncRenewal) -> None:
        """Hand ``renewal`` to the worker renewing this lease object's renewals (one per
        event loop), starting one if needed."""
        key = aloop_key()
        with self._renewers_lock:
            renewer = self._renewers.get(key)
            if renewer is None:
                renewer = self._renewers[key] = AsyncRenewer(self, key)
            renewer.add(renewal)

    def _retire_renewer(self, key: object, renewer: AsyncRenewer) -> bool:
        """End an idle renewer's worker and forget it, unless a renewal arrived meanwhile;
        decided under the lock ``_renew_in_background`` takes, so no renewal is left with
        a renewer whose worker ended."""
        with self._renewers_lock:
            if not renewer.retire_if_idle():
                return False
            if self._renewers.get(key) is renewer:
                del self._renewers[key]
            return True

    def _forget_renewer(self, key: object, renewer: AsyncRenewer) -> None:
        with self._renewers_lock:
            if self._renewers.get(key) is renewer:
                del self._renewers[key]

    async def _renew_together(
        self, tokens: list[Token], attempts: list[int], timeout: float
    ) -> list[Exception | None]:
        """Renew ``tokens`` in one backend call when the backend can (else one by one);
        return each token's outcome (``None``: renewed), each reported to the observer."""
        renew_many = getattr(self._backend, "renew_many", None)
        if renew_many is None or len(tokens) == 1:
            outcomes: list[Exception | None] = []
            for token, attempt in zip(tokens, attempts, strict=True):
                try:
                    await self._renew_once(token, attempt, timeout)
                except Exception as exc:
                    outcomes.append(exc)
                else:
                    outcomes.append(None)
            return outcomes
        start = monotonic()
        try:
            results: list[Exception | None] = list(
                await abounded(timeout, renew_many, tokens, self._ttl)
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
        duration = monotonic() - start
        for token, attempt, outcome in zip(tokens, attempts, results, strict=True):
            if unseal(token, self._backend).given_up:
                continue  # released or forgotten meanwhile: its renewal means nothing now
            notify(self._observer.on_renew, RenewEvent(token, attempt, duration, outcome))
            if outcome is not None:
                self._report_fenced(token, Operation.RENEW, outcome)
        return results

    def _given_up(self, token: Token) -> bool:
        """Whether the holder already released or forgot ``token`` through this lease."""
        return unseal(token, self._backend).given_up

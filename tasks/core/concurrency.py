"""Bounded concurrency of the trials stage: model calls in flight, and trials admitted.

As Inspect AI's ``max_connections`` (concurrent model requests) and ``max_samples`` (samples in
flight), two bounds:

- ``querylab run --max-concurrency N`` (default :data:`DEFAULT_MAX_CONCURRENCY`) bounds the
  model calls (HTTP requests) in flight across the whole trials stage (:func:`call_slot`, held
  around each request only: not while a trial runs a tool); a models-table entry's
  ``max_concurrency`` (a local model: its ``parallel`` slots) bounds the calls to that model in
  flight, whatever the stage's cap;
- ``--max-trials M`` (default :func:`default_max_trials`: ``2 * N``) bounds the trials admitted
  (started, not finished; :func:`trial_slot`), hence the sandbox sessions and memory.

Batch size is only the checkpoint / Parquet granularity: a batch runs its trials concurrently
(:func:`tasks.trials.stage.run_batch`).

Where the slots live:

- in one process (the default thread-pool task runner): :class:`Limiter`\\ s shared by every
  batch thread of the process (:func:`limiter`);
- on a Dask cluster (``QUERYLAB_TASK_RUNNER=dask`` / ``dask://host:8786``, see
  :mod:`tasks.core.task_runners`): ``distributed.Semaphore``\\ s held by the scheduler, so the caps
  span every worker process of the cluster (:func:`trial_slot` picks these when it runs inside
  a Dask worker).

A call takes its model slot before its stage slot, so calls waiting for a busy model never
hold stage slots other models' calls could use. Prefect global concurrency limits per model
(``QUERYLAB_MODEL_LIMITS=prefect``, :class:`tasks.core.llm.ModelLimits`) stay available on top:
they bound HTTP requests in flight across everything that shares the Prefect server.
"""

from __future__ import annotations

import collections
import contextvars
import functools
import heapq
import itertools
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

#: Model calls in flight across a stage unless ``--max-concurrency`` says otherwise.
DEFAULT_MAX_CONCURRENCY = 32


def default_max_trials(max_concurrency: int) -> int:
    """Trials admitted at once (started, not finished) when ``--max-trials`` is not given, for
    ``max_concurrency`` model calls in flight: ``2 * max_concurrency``. A trial spends most of
    its time in model calls but not all (tool calls, its sandbox session, its checkpoint), so
    the trials in flight must exceed the call slots for a slot freed by a trial running a tool
    or finishing to be taken at once; twice as many keeps every call slot busy while bounding
    the sandbox sessions and memory (Inspect AI likewise runs more samples than
    ``max_connections`` by default). Except ``max_concurrency`` 1: 1, a serial run (one trial
    after another, its calls in a deterministic order). ValueError below 1."""
    if int(max_concurrency) < 1:
        raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
    return 1 if int(max_concurrency) == 1 else 2 * int(max_concurrency)


def resolve_max_trials(max_concurrency: int, max_trials: int | None) -> int:
    """``max_trials``, or :func:`default_max_trials` of ``max_concurrency`` when None.
    ValueError for a bound below 1."""
    if max_trials is None:
        return default_max_trials(max_concurrency)
    if int(max_trials) < 1:
        raise ValueError(f"max_trials must be >= 1, got {max_trials}")
    return int(max_trials)


class Limiter:
    """A counting semaphore of ``limit`` slots that records how many are held (``in_use``)
    and the most ever held at once (``peak``). Thread-safe.

    A waiter may give its ``order``: ``(admission rank, calls made)`` of the trial it calls for
    (:func:`call_slot`). A freed slot goes to an ordered waiter before any other, chosen by
    what the stage is short of (``bench/latency_bound.py``, 200 trials of 5 calls at 64
    slots and 128 admitted, shows both):

    - while a trial is blocked waiting to be admitted (``short_of_admissions``, by default
      :func:`admissions_waiting` of any run; a stage's call limiter asks about its own run's
      trials only, :func:`call_slot`), the trial with the most calls made, then the oldest:
      with trials of equal length (the bench's 5 calls each) those are the trials nearest
      their end, which finish first and free their admissions for the waiting ones (the last
      trial was admitted at 4.0-5.4 s, where the rule below alone admitted it at 6.9-7.2 s,
      leaving it to make its 5 calls after most slots had gone idle). "Calls made" counts
      every call that took a slot, retries included, and says nothing of the calls a trial
      has left: a longer trial keeps its lead over shorter ones (bounded: of the trials
      admitted after a waiting call's, only those admitted within ``N x`` its calls made, or
      that had made more calls when it began to wait, can pass it);
    - while none is blocked (every trial admitted, or ``--max-trials`` not reached), by
      ``calls made x N + admission rank``, ``N`` the limiter's slots: a trial's next call
      ranks behind the first calls of the ``N`` trials admitted after it, so the
      last-admitted trials catch up with the older ones, while the trials stay staggered.
      (Fewest calls made first, Hu's highest-level-first rule, moved every trial in step:
      their sandboxed ``execute_python`` cells all ran in the same second at the end,
      300-550 ms each instead of 20-50 ms, and the run ended later.)

    Equal keys, and waiters without an ``order`` (after every ordered one), are served in
    arrival order. A released slot is handed to the chosen waiter directly (only it wakes)."""

    def __init__(self, limit: int, short_of_admissions: Callable[[], bool] | None = None):
        if int(limit) < 1:
            raise ValueError(f"a concurrency limit must be >= 1, got {limit}")
        self.limit = int(limit)
        self.in_use = 0
        self.peak = 0
        self._short = short_of_admissions or admissions_waiting
        self._mutex = threading.Lock()
        # ordered waiters in two heaps (one per rule), each entry [gate, served] in both;
        # a served entry left in the other heap is skipped, and that heap rebuilt when such
        # entries outnumber the live ones
        self._finishing: list[tuple[int, int, int, list]] = []
        self._spreading: list[tuple[int, int, int, list]] = []
        self._ordered = 0
        self._unordered: collections.deque[threading.Lock] = collections.deque()
        self._arrivals = itertools.count()

    @property
    def waiting(self) -> int:
        """Callers waiting for a slot now."""
        with self._mutex:
            return self._ordered + len(self._unordered)

    def has_waiters(self) -> bool:
        """Whether a caller waits for a slot now, read without the mutex (safe to call while
        holding another limiter's: :func:`admissions_waiting` is called so)."""
        return bool(self._ordered or self._unordered)

    def acquire(self, order: tuple[int, int] | None = None) -> None:
        """Wait for a free slot and take it (``order``: ``(admission rank, calls made)``, see
        the class)."""
        with self._mutex:
            if self.in_use < self.limit and not self._ordered and not self._unordered:
                self.in_use += 1
                self.peak = max(self.peak, self.in_use)
                return
            gate = threading.Lock()
            gate.acquire()
            entry = None
            if order is None:
                self._unordered.append(gate)
            else:
                rank, made = int(order[0]), int(order[1])
                entry, n = [gate, False], next(self._arrivals)
                heapq.heappush(self._finishing, (-made, rank, n, entry))
                heapq.heappush(self._spreading, (made * self.limit + rank, 0, n, entry))
                self._ordered += 1
        try:
            gate.acquire()  # released by release(): the slot was handed over, in_use unchanged
        except BaseException:
            # interrupted while waiting (a signal's exception in the main thread): leave the
            # queue, or give back the slot handed over meanwhile, so no slot is lost to a
            # waiter that is gone
            with self._mutex:
                if entry is not None and not entry[1]:
                    entry[1] = True  # skipped in both heaps from now on
                    self._ordered -= 1
                    handed = False
                elif entry is None and gate in self._unordered:
                    self._unordered.remove(gate)
                    handed = False
                else:
                    handed = True
            if handed:
                self.release()
            raise

    def _next_ordered(self) -> threading.Lock:
        use, other = ((self._finishing, self._spreading) if self._short()
                      else (self._spreading, self._finishing))
        while True:
            entry = heapq.heappop(use)[3]
            if not entry[1]:
                break
        entry[1] = True
        self._ordered -= 1
        if len(other) > 2 * self._ordered + 64:
            other[:] = [e for e in other if not e[3][1]]
            heapq.heapify(other)
        return entry[0]

    def release(self) -> None:
        """Give a slot back, to the chosen waiter if any (ValueError when none is held)."""
        with self._mutex:
            if self.in_use <= 0:
                raise ValueError("release() without acquire()")
            if self._ordered:
                self._next_ordered().release()
            elif self._unordered:
                self._unordered.popleft().release()
            else:
                self.in_use -= 1


_LIMITERS: dict[str, Limiter] = {}
_LIMITERS_LOCK = threading.Lock()


def limiter(name: str, limit: int,
            short_of_admissions: Callable[[], bool] | None = None) -> Limiter:
    """This process's :class:`Limiter` called ``name`` with ``limit`` slots (created on first
    use; the same name and limit always give the same object). ``short_of_admissions``
    replaces the default rule switch (:func:`admissions_waiting` of any run) of the limiter,
    whoever created it."""
    key = f"{name}#{int(limit)}"
    with _LIMITERS_LOCK:
        if key not in _LIMITERS:
            _LIMITERS[key] = Limiter(limit, short_of_admissions)
        lim = _LIMITERS[key]
        if short_of_admissions is not None and lim._short is admissions_waiting:
            lim._short = short_of_admissions
        return lim


def stage_slot_name(run_id: str, stage: str = "trials") -> str:
    """Name of the stage-wide cap of ``stage`` of run ``run_id``."""
    return f"querylab-{stage}-{run_id}"


def model_slot_name(model: str, base_url: str | None) -> str:
    """Name of the per-model cap of ``model`` at ``base_url`` (shared by every run of the
    process or cluster: the cap protects the endpoint)."""
    return f"querylab-model-{model}@{base_url or '-'}"


def in_dask_worker() -> bool:
    """True inside a task running on a Dask worker (``distributed`` already imported and a
    worker found); never imports ``distributed`` itself."""
    if "distributed" not in sys.modules:
        return False
    try:
        sys.modules["distributed"].get_worker()
    except (ValueError, AttributeError):
        return False
    return True


class _ClusterSlot:
    """A ``distributed.Semaphore`` of the scheduler (slots shared by every worker)."""

    def __init__(self, name: str, limit: int):
        from distributed import Semaphore

        self.sem = Semaphore(max_leases=int(limit), name=f"{name}#{int(limit)}")

    def acquire(self) -> None:
        self.sem.acquire()

    def release(self) -> None:
        self.sem.release()


_CLUSTER_SLOTS: dict[str, _ClusterSlot] = {}


def _slot(name: str, limit: int, short_of_admissions: Callable[[], bool] | None = None):
    if not in_dask_worker():
        return limiter(name, limit, short_of_admissions)
    key = f"{name}#{int(limit)}"
    with _LIMITERS_LOCK:
        if key not in _CLUSTER_SLOTS:
            _CLUSTER_SLOTS[key] = _ClusterSlot(name, limit)
        return _CLUSTER_SLOTS[key]


_PLANNED: dict[str, int] = {}


def trials_expected(run_id: str, n: int, max_trials: int) -> int:
    """Trials of the trials stage of ``run_id`` that may be in flight at once in this process
    once a batch of ``n`` trials starts: ``n`` added to what the stage's batches that started
    here before asked for, capped at ``max_trials`` (the trials admitted at once). Each batch
    calls it once as it starts, so batches running side by side (the thread-pool task runner
    starts every mapped batch at once) add up, where one batch's ``n`` alone would under-count
    (e.g. 8 batches of 25 with ``max_trials`` 128: 25, 50, ..., then 128). What
    :meth:`tasks.sandbox.session.Sandbox.reserve` is asked to prepare; an over-estimate only
    costs spare sandbox sessions (bounded there). Thread-safe; ValueError for ``max_trials``
    below 1."""
    if int(max_trials) < 1:
        raise ValueError(f"max_trials must be >= 1, got {max_trials}")
    with _LIMITERS_LOCK:
        total = _PLANNED.get(run_id, 0) + max(int(n), 0)
        _PLANNED[run_id] = min(total, int(max_trials))
        return _PLANNED[run_id]


@contextmanager
def trial_slot(run_id: str, max_trials: int) -> Iterator[None]:
    """Hold one of the ``max_trials`` trial slots of the trials stage of ``run_id`` for the
    block (a trial admitted: started, not finished); yields the trial's admission rank (0, 1,
    ... in this process, for :func:`as_trial`). In-process :class:`Limiter`, or the
    scheduler's semaphore inside a Dask worker. ValueError for a limit below 1."""
    s = _slot(stage_slot_name(run_id, "trials-admitted"), max_trials)
    if isinstance(s, Limiter) and s not in _ADMISSION_LIMITERS.get(run_id, ()):
        with _LIMITERS_LOCK:  # tuples replaced whole: read without the lock
            mine = _ADMISSION_LIMITERS.get(run_id, ())
            if s not in mine:
                _ADMISSION_LIMITERS[run_id] = (*mine, s)
    s.acquire()
    try:
        yield next(_ADMISSIONS)
    finally:
        s.release()


def admissions_waiting(run_id: str | None = None) -> bool:
    """True while a trial of this process (of run ``run_id``; None: of any run) is blocked in
    :func:`trial_slot` waiting to be admitted (the trials admitted are at their
    ``--max-trials``; a trial admitted at once never counts): what :class:`Limiter` serves its
    ordered waiters by. The admission limiters' own queues, read without a lock (it is called
    under a call limiter's mutex), so nothing is left to count down when a wait is interrupted.
    In-process trials only (a Dask worker's trials take the scheduler's semaphores, and its
    call slots are the scheduler's too, which serve their waiters their own way)."""
    if run_id is not None:
        return any(lim.has_waiters() for lim in _ADMISSION_LIMITERS.get(run_id, ()))
    return any(lim.has_waiters() for mine in list(_ADMISSION_LIMITERS.values())
               for lim in mine)


@contextmanager
def model_trial_slot(model: str, base_url: str | None, slots: int) -> Iterator[None]:
    """Hold one of the ``slots`` trial slots of the local model ``model`` at ``base_url`` for
    the block (taken before :func:`trial_slot`, so a trial waiting for its model holds no
    admission of the stage). A llama.cpp server keeps one prompt cache per slot: a trial whose
    calls follow one another on a slot is served each prompt from its previous one, where
    trials interleaved on a slot evict each other's prompt (``make run``'s local model: 19,942
    → 13,774 cached prompt tokens over its 5 trials, and ~1.7x its time). Shared by every run
    of the process or cluster, like the model's call cap. ValueError for ``slots`` below 1."""
    s = _slot(model_slot_name(model, base_url) + "-trials", slots)
    s.acquire()
    try:
        yield
    finally:
        s.release()


#: Admission ranks of this process's trials (:func:`trial_slot` yields the next one).
_ADMISSIONS = itertools.count()
#: This process's trial-admission limiters (:func:`trial_slot`), by run id.
_ADMISSION_LIMITERS: dict[str, tuple[Limiter, ...]] = {}
#: ``[admission rank, model calls that took a slot so far]`` of the trial this context runs
#: (:func:`as_trial`); None outside trials.
_TRIAL_RANK: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "querylab_trial_rank", default=None)


def as_trial(rank: int | None) -> None:
    """Mark the current context as running the trial of admission ``rank`` (from
    :func:`trial_slot`), with no model call made yet: its model calls' :func:`call_slot` waits
    are served by ``rank`` and the calls it has made so far (:class:`Limiter`)."""
    _TRIAL_RANK.set(None if rank is None else [int(rank), 0])


@contextmanager
def call_slot(
    run_id: str, max_concurrency: int, model: str | None = None,
    model_base_url: str | None = None, model_limit: int | None = None,
) -> Iterator[None]:
    """Hold one model call's slots for the block (one HTTP request in flight): the model's
    (when ``model_limit``: the models table's ``max_concurrency``), then the stage's
    (``max_concurrency`` calls across the trials stage of ``run_id``). In-process
    :class:`Limiter`\\ s (waiters served by their trial's admission rank and calls made so
    far, from :func:`as_trial`: the most calls made first while trials wait to be admitted,
    of ``run_id`` for the stage's limiter and of any run for the model's, shared by runs;
    else the ones admitted late and behind; see :class:`Limiter`), or the
    scheduler's semaphores inside a Dask worker. ValueError for a limit below 1."""
    trial = _TRIAL_RANK.get()
    order = None
    if trial is not None:
        order = (trial[0], trial[1])
        trial[1] += 1
    slots = []
    if model is not None and model_limit is not None:
        slots.append(_slot(model_slot_name(model, model_base_url), model_limit))
    slots.append(_slot(stage_slot_name(run_id), max_concurrency,
                       functools.partial(admissions_waiting, run_id)))
    with ExitStack() as stack:
        for s in slots:
            if isinstance(s, Limiter):
                s.acquire(order)
            else:
                s.acquire()
            stack.callback(s.release)
        yield

"""The forward ledger: every model forward a generation makes, with what it scored and what it took.

A :class:`Call` is one :meth:`~pacer.decoding.backend.ModelBackend.forward`: the model's ``role`` (``target`` or
``draft``), ``k`` new tokens scored after ``context`` cached ones, whether as a token ``tree`` (Ouroboros branches)
and its wall ``seconds``. :class:`MeteredBackend` wraps a backend and appends a call to the ledger that is active
(:func:`recording`: the decoding loop activates ``GenerationStats.calls`` for exactly the span of its wall time),
so that the time of a generation splits into its forwards and the rest (:func:`breakdown`), and the same forwards
can be priced with another machine's measured costs (:mod:`pacer.profiles`: the profile clock).

Outside a recording (calibration, the oracle's reference pass, diagnostics) nothing is recorded. On a GPU the
forward is timed between two device synchronisations, so that a call's seconds are its kernels' and not their
launch.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import NamedTuple

from ..timing import synchronize
from .backend import ModelBackend, Tree

TARGET, DRAFT = "target", "draft"


class Call(NamedTuple):
    """One forward: ``role`` (``target``/``draft``), ``k`` new tokens after ``context`` cached, as a ``tree`` or
    a causal chain, taking ``seconds`` (wall, synchronised on a GPU); ``rows``: the logits rows it kept. A named
    tuple: one is made for every forward, and a frozen dataclass costs several attribute writes more."""

    role: str
    k: int
    context: int
    tree: bool
    seconds: float
    rows: int = 1

    def to_list(self) -> list:
        """Compact form for benchmark records: ``[role initial, k, context, tree, seconds, rows]``."""
        return [self.role[0], self.k, self.context, int(self.tree), round(self.seconds, 6), self.rows]

    @classmethod
    def from_list(cls, x: Sequence) -> Call:
        return cls(TARGET if x[0] == "t" else DRAFT, int(x[1]), int(x[2]), bool(x[3]), float(x[4]),
                   int(x[5]) if len(x) > 5 else 1)

    @property
    def kind(self) -> str:
        """The breakdown part this call belongs to (see :func:`breakdown`)."""
        if self.role == TARGET:
            return "target_prefill" if self.context == 0 else "target_tree" if self.tree else "target_chain"
        # a draft forward reads one or two tokens it has not seen, plus any phrase it checks (one row each)
        return "draft_catch_up" if self.context == 0 or self.k - self.rows >= 2 else "draft"


_ledger: ContextVar[list[Call] | None] = ContextVar("pacer_ledger", default=None)


@contextmanager
def recording(calls: list[Call]) -> Iterator[list[Call]]:
    """Record every metered forward into ``calls`` while the block runs (this thread/context only)."""
    token = _ledger.set(calls)
    try:
        yield calls
    finally:
        _ledger.reset(token)


class MeteredBackend:
    """A :class:`~pacer.decoding.backend.ModelBackend` that records each forward into the active ledger (see the
    module docstring); everything else is the wrapped backend's (attributes are read through)."""

    def __init__(self, inner: ModelBackend, role: str) -> None:
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "role", role)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value) -> None:
        setattr(self.inner, name, value)

    def forward(self, ids: Sequence[int], *, keep: int = 0, hidden: bool = False, tree: Tree | None = None):
        return self._metered(self.inner.forward, ids, keep, hidden, tree)

    def forward_view(self, ids: Sequence[int], *, keep: int = 0, hidden: bool = False, tree: Tree | None = None):
        # a backend registered as a ModelBackend without subclassing it may not have forward_view: its forward
        return self._metered(getattr(self.inner, "forward_view", self.inner.forward), ids, keep, hidden, tree)

    def _metered(self, fwd, ids: Sequence[int], keep: int, hidden: bool, tree: Tree | None):
        calls = _ledger.get()
        if calls is None:
            return fwd(ids, keep=keep, hidden=hidden, tree=tree)
        context = self.inner.length
        sync = self.inner.device.type != "cpu"
        if sync:
            synchronize(self.inner.device)
        t = time.perf_counter()
        out = fwd(ids, keep=keep, hidden=hidden, tree=tree)
        if sync:
            synchronize(self.inner.device)
        calls.append(Call(self.role, len(ids), context, tree is not None, time.perf_counter() - t,
                          keep or len(ids)))
        return out

    # the abstract methods, explicitly (reads of these go to the wrapped backend anyway)
    def reset(self) -> None:
        self.inner.reset()

    def crop(self, length: int) -> None:
        self.inner.crop(length)

    def score(self, ids: Sequence[int]):
        return self.inner.score(ids)


ModelBackend.register(MeteredBackend)


def metered(backend: ModelBackend, role: str) -> ModelBackend:
    """``backend`` wrapped once in a :class:`MeteredBackend` of ``role`` (an already metered one as it is)."""
    return backend if isinstance(backend, MeteredBackend) else MeteredBackend(backend, role)  # type: ignore[return-value]


def first_round_end(roles: Iterable[str]) -> int:
    """How many of a generation's forwards, in order (given by their roles: ``target``/``draft`` or a record's
    initials ``t``/``d``), make its first round: all up to and including the first target forward (the prefill),
    after which the first tokens are committed; the time to first token (TTFT) is theirs."""
    n = 0
    for n, role in enumerate(roles, 1):
        if role[:1] == "t":
            return n
    return n


#: the parts of a generation's wall time, in the order a report shows them
PARTS = ("target_prefill", "target_chain", "target_tree", "draft", "draft_catch_up", "policy", "pool", "rest")


def breakdown(wall: float, calls: Sequence[Call], policy: float = 0.0, pool: float = 0.0) -> dict[str, float]:
    """Seconds of a generation by part: the target's prompt prefill (its first forward), its verification
    forwards as a chain and as a tree, draft forwards (one or two unread tokens, plus the phrase a forward
    checks), the draft's catch-up (its prompt, or more than two tokens it had not read), the length policy's
    checks and updates, the drafter's phrase-pool work, and ``rest``: the loop's own overhead, ``wall`` minus
    all of those. The parts add up to ``wall``."""
    out = dict.fromkeys(PARTS, 0.0)
    for c in calls:
        out[c.kind] += c.seconds
    out["policy"], out["pool"] = policy, pool
    out["rest"] = wall - sum(v for k, v in out.items() if k != "rest")
    return out

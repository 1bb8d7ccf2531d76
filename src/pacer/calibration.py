"""Calibration: what a forward costs on the machine that runs pacer, measured once per machine and model pair.

Speculative decoding pays only where verifying ``k`` tokens in one target forward costs much less than ``k``
forwards, and that depends on the CPU's matrix kernels, not on the models: on an AVX2-only CPU a bf16 forward costs
about ``k`` times one token's, on AVX-512/AMX CPUs it is nearly flat in ``k``. So pacer measures, where it runs:

* ``c_t(k)`` - one target forward scoring ``k`` new tokens after a realistic context (``CONTEXT`` cached tokens,
  :mod:`pacer.timing`), ``k`` from 1 to ``max_draft + 1``. Where the first points already grow like ``k`` the rest
  is extrapolated (a 16-token bf16 forward takes seconds on such a CPU, and no draft can pay there anyway);
* ``c_d`` - one draft token (one new token through the draft, with the drafter's vocabulary);
* the prefill cost per prompt token of the target, and of the draft (``c_pre``: what a draft model pays to catch up
  with tokens it has not read, see :func:`pacer.pricing.catch_up_pays`);
* ``c_tree(k)`` - a target forward over a chain and two branches (Ouroboros' candidates, :data:`TREE_KS`).

All of it at two contexts (:func:`contexts_of`): the short one and one near :data:`LONG_CONTEXT` tokens (within the
pair's context; there the draft's catch-up is a batch of :data:`CATCH_UP` tokens): a forward after 1,000 cached
tokens costs more, and grows faster with ``k``, than after 32. :meth:`Calibration.by_context` prices each round at
its context, linear between the two (:func:`pacer.costs.between`); the pricer's online refinement scales the costs
at each round's context.

Each point is the median of ``REPS`` forwards after a warm-up, with the cache cropped back between them (on a GPU
each forward is timed between two ``torch.cuda.synchronize()`` calls, :func:`pacer.timing.timed`, so that it
counts the kernels and not only their launch). A point whose forwards spread more than ``NOISY`` (max/min) is
measured again; if it still does, the calibration is *noisy*:
it is used with the slowest forward of each point (conservative) by the run that measured it, said in a note, and
cached **marked noisy**, which no later run decides on: a calibration taken while the machine was busy (a ``c_t(1)``
18x the quiet one, once) would otherwise decide every later run. The next start measures again and caches what it
measures, until one measures quiet; a quiet calibration already cached is never replaced by a noisy one (``pacer
calibrate`` on a busy machine).
An interrupted calibration (Ctrl-C) falls back to conservative costs (``c_t(k) = k c_t(1)``: every round is a
plain decoding step) with a note, and writes nothing.

The result is cached in ``$PACER_HOME/calibration/`` under a key of everything it depends on: both models'
fingerprints and dtypes, the draft vocabulary, the threads, the CPU (model, ISA flags, PyTorch's kernel level and
the environment switches that change it), the PyTorch version, the contexts measured (a cache of one context is
another key's, never read) and, for a pair on a GPU, the GPU. A cache file whose
key or checksum does not match, or that cannot be read, is re-measured with a note; it is written atomically
(:class:`pacer.cache.Store`).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from . import devices, timing
from .costs import BadField, ContextCosts, Costs, between, prefill_doubt, read_count
from .decoding.backend import Tree
from .machine import FORMAT, STORE, cpu_identity

#: the draft forwards measured besides one token: a phrase check over k new tokens (Ouroboros)
DRAFT_KS = (2, 4, 8)
#: the long context the costs are measured at besides the short one (:data:`pacer.timing.CONTEXT`), within the
#: pair's context: a forward after 1,000 cached tokens costs more, and grows faster with ``k``, than after 32
LONG_CONTEXT = 1024
#: the tree forwards measured (Ouroboros' candidate branches: a chain and two branches, ``Tree.branching``)
TREE_KS = (4, 8, 16)
#: the tokens the draft reads in one batch to time its catch-up after a long context
CATCH_UP = 16
REPS = 3
NOISY = 1.5
#: a curve is treated as growing like ``k`` (and extrapolated) once ``c_t(4) >= LINEAR * c_t(1)``
LINEAR = 2.5
#: ``FORMAT`` and ``STORE``, the cached calibrations and the machine choices kept with them, are
#: :mod:`pacer.machine`'s (where the dtype choice is measured too)


# ---------------------------------------------------------------------------------------------- calibration
@dataclass
class Calibration:
    """Measured costs (:class:`pacer.costs.Costs`, without the policy check, which each policy measures itself),
    the prefill cost per prompt token, what they were measured on (``key``) and how they came to be:
    ``source`` is ``measured``, ``cache``, ``conservative`` (interrupted) or ``given``."""

    costs: Costs
    prefill: float = 0.0
    key: dict = field(default_factory=dict)
    source: str = "measured"
    noisy: bool = False
    seconds: float = 0.0
    measured: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: the cache file holding this calibration (``""``: not cached: a home that cannot be written, a noisy one over
    #: a quiet one, interrupted or given)
    cached: str = ""
    #: the costs at each context measured (cached tokens -> costs): :attr:`costs` is the shortest one's
    contexts: dict[int, Costs] = field(default_factory=dict)

    def by_context(self, policy_per_check: float) -> ContextCosts:
        """What the pricer prices rounds with, the policy check included: the costs at each round's context,
        linear between the contexts measured (:func:`pacer.costs.between`), else :attr:`costs` at any."""
        if len(self.contexts) > 1:
            contexts = dict(self.contexts)
            return ContextCosts(lambda context: between(contexts, context), policy_per_check)
        return ContextCosts.fixed(replace(self.costs, policy_per_check=policy_per_check))

    def payload(self) -> dict:
        # prefill_warm: timed after a warm-up (a cache without it may hold a cold one), so not checked again by load()
        return {"costs": self.costs.to_dict(), "prefill": self.prefill, "seconds": round(self.seconds, 2),
                "measured": self.measured, "noisy": self.noisy, "prefill_warm": True,
                "contexts": {str(c): v.to_dict() for c, v in sorted(self.contexts.items())}}

    def verdict(self) -> str:
        """What the target's curve says, in one sentence. Whether drafting pays also depends on the draft's cost:
        :func:`regime` weighs both and is the one line that says so (except where the curve alone rules it out)."""
        g = self.costs.verification_growth(8)
        if g >= 4:
            return (f"scoring 8 tokens costs {g:.1f}x one token here (verification is not free on this CPU): "
                    f"drafting cannot pay, so rounds decode plainly")
        if g > FREE_GROWTH:
            return f"scoring 8 tokens costs {g:.1f}x one token here: at most short, confident drafts can pay"
        return f"scoring 8 tokens costs {g:.1f}x one token here (verification nearly free)"

    def to_dict(self) -> dict:
        return {**self.payload(), "key": self.key, "source": self.source, "noisy": self.noisy,
                "cached": self.cached or None, "notes": self.notes, "curve": self.costs.curve(),
                "verdict": self.verdict()}


def backend_version(loaded) -> str:
    """The runtime that computes the forwards (its backend record's: PyTorch's version, llama-cpp-python's)."""
    from . import backends

    return backends.of(loaded).version()


def calibration_key(pair, rows: torch.Tensor | None) -> dict:
    """Everything a calibration depends on (see the module docstring)."""
    t, d = pair.target_info, pair.draft_info
    key = {
        "format": FORMAT,
        "target": t.fingerprint, "target_dtype": t.weights,
        "draft": d.fingerprint if d else None, "draft_dtype": d.weights if d else None,
        "draft_rows": "full" if rows is None else int(len(rows)),
        "backend": t.backend, "runtime": backend_version(t),
        "threads": torch.get_num_threads(),
        "cpu": cpu_identity(),
        "torch": torch.__version__,
        "context": timing.CONTEXT,
        # the contexts measured: a cache of one context (made before costs were measured by context) is another
        # key's, never read
        "contexts": contexts_of(pair.target.context),
    }
    if pair.target.device.type != "cpu":  # (CPU keys stay as they were: their caches stay valid)
        key["device"] = devices.describe(pair.target.device)
    if any(info is not None and str(info.weights).startswith("int8") for info in (t, d)):
        from .quantize import DENSE_ROWS  # an int8 model reads a prompt another way from this many rows on

        key["int8_dense_rows"] = DENSE_ROWS
    return key


def contexts_of(context: int, max_draft: int = 16) -> list[int]:
    """The contexts a calibration measures for a target of ``context`` positions: the short one and
    :data:`LONG_CONTEXT`, each leaving room for the longest forward measured (one where the model is too short)."""
    room = context - max(max_draft + 1, TREE_KS[-1], CATCH_UP) - 2
    short = max(1, min(timing.CONTEXT, room))
    return sorted({short, max(short, min(LONG_CONTEXT, room))})


def _point(cm, tokens: list[int], base: int, reps: int, tree=None) -> tuple[float, float, bool]:
    """(median, slowest, noisy) seconds of ``reps`` forwards of ``tokens`` after ``base`` cached tokens (as a
    ``tree`` where given)."""
    keep = len(tokens) if tree is not None else 1
    times = [timing.timed(cm, tokens, base, keep, tree) for _ in range(reps)]
    if max(times) > NOISY * min(times):
        times += [timing.timed(cm, tokens, base, keep, tree) for _ in range(reps)]
        times = sorted(times)[: max(reps, len(times) - 2)]  # drop the two slowest (a stray stall)
    return statistics.median(times), max(times), max(times) > NOISY * min(times)


def measure(pair, rows: torch.Tensor | None, max_draft: int = 16, reps: int = REPS,
            progress: Callable[[str], None] | None = None) -> Calibration:
    """Measure ``c_t(k)`` for ``k`` in 1..``max_draft + 1`` (sparse, extrapolated once the curve grows like
    ``k``), ``c_d`` and the prefill cost on the pair's models (see the module docstring)."""
    say = progress or (lambda s: None)
    start = time.perf_counter()
    contexts = contexts_of(pair.target.context, max_draft)
    ctx = timing.token_ids(pair.vocab, contexts[0])
    ks = sorted(k for k in {1, 2, 3, 4, 6, 8, 12, max_draft + 1} if k <= max_draft + 1)
    target = pair.target
    target.reset()
    noisy = False
    with torch.inference_mode():
        # a model's first forward pays one-time costs (weights paged in, kernels chosen): warm up before the
        # prefill is timed, and keep the faster of two (a cold first forward once priced a Zen 4's prompt token
        # at 71 ms against 22 ms for a token of a 17-token forward)
        target.forward(ctx, keep=1)
        target.reset()
        prefill = timing.prefill(target, ctx)
        target.forward(ctx, keep=1)
        timing.timed(target, ctx[:1], len(ctx))  # warm-up
        med: dict[int, float] = {}
        worst: dict[int, float] = {}
        for k in ks:
            say(f"target, {k} token{'s' * (k > 1)}")
            med[k], worst[k], bad = _point(target, ctx[:k], len(ctx), reps)
            noisy |= bad
            if k == 4 and med[4] >= LINEAR * med[1]:
                break  # grows like k: the rest is extrapolated by Costs.target_cost
        for k in sorted(med):  # a point dearer than a longer forward was hit by a stall: measure it again
            if any(med[k] > NOISY * med[j] for j in med if j > k):
                say(f"target, {k} tokens again")
                med[k], worst[k], bad = _point(target, ctx[:k], len(ctx), reps)
        draft = dworst = draft_prefill = 0.0
        dcurve: dict[int, float] = {}
        if pair.draft_info is not None:
            say("draft, 1 token")
            dm = pair.draft_backend(rows)
            dm.forward(ctx, keep=1)  # warm-up, then the prefill per token (the draft's catch-up cost)
            dm.reset()
            draft_prefill = timing.prefill(dm, ctx)
            dm.forward(ctx, keep=1)
            timing.timed(dm, ctx[:1], len(ctx))
            draft, dworst, bad = _point(dm, ctx[:1], len(ctx), reps + 2)
            noisy |= bad
            dcurve = {1: dworst if noisy else draft}
            for k in DRAFT_KS:
                if k < len(ctx):
                    say(f"draft, {k} tokens")
                    med_k, worst_k, bad = _point(dm, ctx[:k], len(ctx), reps)
                    dcurve[k] = max(worst_k if noisy else med_k, dcurve[1])
        tree, tree_noisy = _tree(target, pair.vocab, ctx, reps, say, max(med))
        noisy |= tree_noisy
        # the same costs after a long context (the rounds of a long prompt or output run there)
        far: dict[int, Costs] = {}
        for c in contexts[1:]:
            far[c], far_noisy = _at_context(pair, target, dm if pair.draft_info is not None else None, c, ks,
                                            reps, say)
            noisy |= far_noisy
    target.reset()
    use = worst if noisy else med
    short = Costs(dworst if noisy else draft, dict(use), draft_prefill=draft_prefill,
                  tree=tree[1] if noisy else tree[0], draft_curve=dcurve if len(dcurve) > 1 else {})
    cal = Calibration(short, prefill, source="measured", noisy=noisy, seconds=time.perf_counter() - start,
                      measured=sorted(use), contexts={contexts[0]: short, **far})
    if noisy:
        cal.notes.append("the machine was too noisy for a stable measurement (forwards spread more than "
                         f"{NOISY}x): this run uses the slowest forward of each point")
    return cal


def _tree(target, vocab: int, ctx: list[int], reps: int, say: Callable[[str], None],
          most: int) -> tuple[tuple[dict, dict], bool]:
    """``((median, slowest), noisy)``: ``c_tree(k)`` for ``k`` in :data:`TREE_KS` up to ``most`` (the chain's last
    measured ``k``: where it grows like ``k`` the longer forwards take seconds; the first at least), a chain and two
    branches, after the ``ctx`` tokens ``target`` holds."""
    med: dict[int, float] = {}
    worst: dict[int, float] = {}
    noisy = False
    for k in [k for k in TREE_KS if k <= most] or TREE_KS[:1]:
        say(f"target tree, {k} tokens")
        med[k], worst[k], bad = _point(target, timing.token_ids(vocab, k, len(ctx)), len(ctx), reps,
                                       Tree.branching(k))
        noisy |= bad
    return (med, worst), noisy


def _at_context(pair, target, dm, context: int, ks: list[int], reps: int,
                say: Callable[[str], None]) -> tuple[Costs, bool]:
    """The costs after ``context`` cached tokens: the target's chain (``ks``, extrapolated once it grows like
    ``k``) and tree, the draft's token, its phrase checks and its catch-up per token (a batch of
    :data:`CATCH_UP`); ``(costs, noisy)`` (noisy: the slowest forward of each point)."""
    ids = timing.token_ids(pair.vocab, context)
    new = timing.token_ids(pair.vocab, max(ks[-1], CATCH_UP, TREE_KS[-1]), context)
    target.reset()
    target.forward(ids, keep=1)
    timing.timed(target, new[:1], context)  # warm-up
    pts: dict[int, tuple[float, float]] = {}
    noisy = False
    for k in ks:
        say(f"target, context {context}, {k} token{'s' * (k > 1)}")
        *pts[k], bad = _point(target, new[:k], context, reps)
        noisy |= bad
        if k == 4 and pts[4][0] >= LINEAR * pts[1][0]:
            break  # grows like k: the rest is extrapolated by Costs.target_cost
    (tmed, tworst), bad = _tree(target, pair.vocab, ids, reps, lambda s: say(f"{s}, context {context}"), max(pts))
    noisy |= bad
    target.reset()
    draft = catch_up = 0.0
    dcurve: dict[int, tuple[float, float]] = {}
    if dm is not None:
        dm.reset()
        dm.forward(ids, keep=1)
        timing.timed(dm, new[:1], context)  # warm-up
        for k in (1, *DRAFT_KS, CATCH_UP):
            say(f"draft, context {context}, {k} token{'s' * (k > 1)}")
            *dcurve[k], bad = _point(dm, new[:k], context, reps + 2 * (k == 1))
            noisy |= bad
        dm.reset()
    pick = 1 if noisy else 0
    if dcurve:
        draft = dcurve[1][pick]
        catch_up = dcurve.pop(CATCH_UP)[pick] / CATCH_UP
    return Costs(draft, {k: v[pick] for k, v in pts.items()}, draft_prefill=catch_up,
                 tree=(tworst if noisy else tmed),
                 draft_curve={k: max(v[pick], draft) for k, v in dcurve.items()} if len(dcurve) > 1 else {}), noisy


def conservative(pair, c1: float | None = None) -> Calibration:
    """Costs under which no draft pays (``c_t(k) = k · c_t(1)``): plain-decoding speed, never below."""
    c1 = c1 or 1.0
    return Calibration(Costs(c1 / 3, {1: c1, 2: 2 * c1}), source="conservative")


def cache_path(key: dict) -> Path:
    """The file the calibration for ``key`` is cached in."""
    return STORE.path(key)


def load(key: dict) -> tuple[Calibration | None, str]:
    """The cached calibration for ``key``, or ``(None, why)``."""
    p, why = STORE.get(key)
    if p is None:
        return None, why
    free = key.get("draft") is None  # no draft model (prompt lookup): its draft tokens cost nothing, c_d = 0
    try:
        cal = Calibration(Costs.from_dict(p["costs"], free_draft=free), float(p["prefill"]), key, "cache",
                          noisy=bool(p.get("noisy", False)), seconds=float(p.get("seconds", 0)),
                          measured=list(p.get("measured", [])))
        contexts = p.get("contexts")
        if not isinstance(contexts, dict):
            raise BadField("no 'contexts' {context: costs}")
        cal.contexts = {read_count(c, f"'contexts' key {c!r}", 1, key=True): Costs.from_dict(v, free_draft=free)
                        for c, v in contexts.items()}
        want = key.get("contexts") or []
        if sorted(cal.contexts) != sorted(want):  # one context where the key says two: never trusted
            raise BadField(f"costs at contexts {sorted(cal.contexts)}, not {sorted(want)}")
    except BadField as e:
        return None, f"calibration cache {cache_path(key)} holds unusable costs ({e})"
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        return None, f"calibration cache {cache_path(key)} cannot be read ({type(e).__name__})"
    bad = [b for c in cal.contexts.values() for b in c.problems(free)] or cal.costs.problems(free) or \
        ([] if math.isfinite(cal.prefill) and cal.prefill >= 0 else [f"target prefill is {cal.prefill}"])
    if bad:  # a file edited by hand with its checksum recomputed, say
        return None, f"calibration cache {cache_path(key)} holds unusable costs ({bad[0]})"
    if cal.noisy:  # cached marked noisy (the machine was busy): no later run decides on it
        return None, f"calibration cache {cache_path(key)} was measured on a busy machine (noisy)"
    cal.cached = str(cache_path(key))
    if not p.get("prefill_warm") and cal.prefill and \
            (why := prefill_doubt(timing.CONTEXT, cal.prefill, cal.costs.target)) is not None:
        # cached before the prefill was timed warm (a prefill measured warm is kept whatever it costs)
        return None, f"calibration cache {cache_path(key)}: {why}"
    return cal, ""


def save(cal: Calibration) -> str:
    """Cache ``cal`` (setting :attr:`Calibration.cached`): ``""``, or a note: a noisy one is cached marked noisy (the
    next start measures again, :func:`load`) unless a quiet one is cached, which stays; a home that cannot be
    written."""
    if cal.noisy:
        kept, _ = load(cal.key)  # pacer calibrate measures again over a quiet calibration: that one stays
        if kept is not None:
            return f"not cached: later runs use the calibration cached in {kept.cached}"
    note = STORE.keep(cal.key, cal.payload())
    if note:
        return note
    cal.cached = str(STORE.path(cal.key))
    return f"cached marked noisy in {cal.cached}: no later run decides on it, the next one measures again" \
        if cal.noisy else ""


def _stderr_progress(msg: str) -> None:
    """A progress line that rewrites itself on a terminal; elsewhere one line when measuring starts."""
    if sys.stderr.isatty():
        sys.stderr.write(f"\rpacer: calibrating this machine's forward costs (once, then cached): {msg:<24}")
    elif msg.startswith("target, 1 "):
        sys.stderr.write("pacer: calibrating this machine's forward costs (once, then cached) ...\n")
    sys.stderr.flush()


def load_or_measure(pair, rows: torch.Tensor | None, max_draft: int = 16, refresh: bool = False,
                    progress: bool = True) -> Calibration:
    """The calibration for ``pair`` with draft vocabulary ``rows``: cached, else measured and cached; an
    interrupted measurement gives :func:`conservative` costs. Notes go to ``Calibration.notes``."""
    key = calibration_key(pair, rows)
    notes: list[str] = []
    if not refresh:
        cal, why = load(key)
        if cal is not None:
            return cal
        if why:
            notes.append(f"{why}; re-measuring")
    try:
        cal = measure(pair, rows, max_draft, progress=_stderr_progress if progress else None)
    except KeyboardInterrupt:
        if progress and sys.stderr.isatty():
            sys.stderr.write("\n")
        cal = conservative(pair)
        cal.key = key
        cal.notes = [*notes, "calibration interrupted: decoding conservatively (every round a plain decoding "
                             "step); run `pacer calibrate` to measure"]
        return cal
    if progress:
        sys.stderr.write(f"{chr(13) if sys.stderr.isatty() else ''}pacer: calibrated in {cal.seconds:.1f}s: "
                         f"{cal.costs.curve()}\n")
    cal.key = key
    cal.notes = notes + cal.notes
    if note := save(cal):
        cal.notes.append(note)
    return cal


def plot(cal: Calibration, path: str | Path, title: str = "") -> None:
    """PNG: ``c_t(k)`` and ``c_t(k) / k`` against ``k``, with plain decoding's ``k · c_t(1)`` for reference."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .io import atomic_write_bytes

    c = cal.costs
    ks = list(range(1, max(c.target) + 1))
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    a.plot(ks, [c.target_cost(k) * 1e3 for k in ks], "o-", label="one target forward over k tokens")
    a.plot(ks, [k * c.target_cost(1) * 1e3 for k in ks], "--", color="gray", label="k plain decoding steps")
    a.scatter(cal.measured, [c.target[k] * 1e3 for k in cal.measured], color="black", zorder=3, s=12,
              label="measured")
    a.set_xlabel("k (new tokens scored)")
    a.set_ylabel("ms")
    a.legend(fontsize=8)
    b.plot(ks, [c.target_cost(k) / k * 1e3 for k in ks], "o-", label="target ms per scored token")
    b.axhline(c.draft * 1e3, color="tab:orange", label="draft ms per token")
    b.set_xlabel("k")
    b.set_ylabel("ms per token")
    b.legend(fontsize=8)
    fig.suptitle(title or "forward costs", fontsize=9)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(Path(path), buf.getvalue())


# ---------------------------------------------------------------------------------------------- the regime
#: ``c_t(8) / c_t(1)`` up to which verifying a block counts as nearly free
FREE_GROWTH = 1.5
#: the predicted speedup from which drafting is said to pay (below it, expect plain decoding's speed)
PAYS = 1.1


def regime(costs: Costs, backend: str, weights: str = "") -> str:
    """One line: which regime this machine is in for ``backend`` (its ``weights``, as measured) and what to expect
    of pacer there: the cost rule's own prediction (:func:`pacer.pricing.predicted_round`) at a typical
    acceptance, from the measured curve. Where drafting does not pay, the backend's anchor (its record's: the
    backend whose plain decoding of the same model file is the user's fastest plain path) is named."""
    from . import backends
    from .pricing import TYPICAL_ACCEPTANCE, predicted_round

    runs = f"{backend} {weights}".strip()
    g = costs.verification_growth(8)
    n, speedup = predicted_round(costs, TYPICAL_ACCEPTANCE)
    curve = f"c_t(8) = {g:.2f} c_t(1)"
    at = f"at a typical per-token acceptance of {TYPICAL_ACCEPTANCE:.2f}"
    if speedup >= PAYS:
        what = (f"verification nearly free on {runs} ({curve})" if g <= FREE_GROWTH else
                f"verification not free on {runs} ({curve}) but short drafts pay")
        return (f"regime: {what}: drafting pays - expect about {speedup:.1f}x over plain decoding (the cost "
                f"rule's prediction: {n} draft token{'s' if n > 1 else ''} a round {at})")
    why = (f"verification not free on {runs} ({curve})" if g > FREE_GROWTH else
           f"verification nearly free on {runs} ({curve}) but a draft token costs "
           f"{costs.draft / costs.target_cost(1):.2f} of a target forward")
    anchor = backends.get(backend).anchor
    return (f"regime: {why}: pacer decodes plainly here - expect about 1.0x (the cost rule's prediction {at}: "
            f"{speedup:.2f}x)" + (f"; {anchor}'s plain decoding (--backend {anchor}) is your fastest path"
                                  if anchor else ""))

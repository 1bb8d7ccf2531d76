"""pacer's per-row, cost-aware draft length inside vLLM, as a speculative proposer for vLLM's ``custom_class`` hook.

Start vLLM with (docs/vllm.md)::

    --speculative-config '{"method": "custom_class", "model": "pacer.integrations.vllm.PacerProposer",
                           "num_speculative_tokens": 8}'

**The hook** (vLLM 0.32, ``vllm/v1/spec_decode/custom_class_proposer.py`` and ``propose_draft_token_ids`` of
``vllm/v1/worker/gpu_model_runner.py``, which the CPU runner inherits): vLLM imports the class named by
``speculative_config.model``, builds it as ``cls(vllm_config)``, calls ``load_model(target_model)`` once (the CPU
runner unconditionally) and, after every engine step's bookkeeping, ``propose(sampled_token_ids,
num_tokens_no_spec, token_ids_cpu, slot_mappings=None)``: ``sampled_token_ids[i]`` the tokens row ``i`` committed
this step (the accepted draft tokens and one more; empty while the row is still prefilling a chunk),
``token_ids_cpu[i, :num_tokens_no_spec[i]]`` its whole text so far (prompt and output, this step's tokens included).
It returns one list of draft token ids per row, each of any length up to ``num_speculative_tokens`` (empty: no
speculation for that row); vLLM's rejection sampler verifies them, so the output is the target's own. The proposer
sees token ids only: no request ids, no hidden states, no sampling settings, no notice when a request ends.

**What it does per step.**

* *Rows are requests by their text*: a row's state (its phrase pool, the draft it was last given, its learned
  acceptance) is stored under a hash of its token prefix and found again next step under the prefix its new tokens
  extend (:class:`RowMemory`). Identical prefixes in two rows get two states; states not seen for ``max_idle`` calls
  are dropped (the request ended or was preempted for long).
* *Acceptance is learned per request*: the tokens a row committed tell how many of its last draft were accepted
  (:func:`observed_acceptance`); they update the row's :class:`pacer.pricing.CostMemory` (its survival
  calibrator).
* *Drafts* are prompt lookup, as pacer's ``lookup`` method (:mod:`pacer.methods.lookup`): continuations of the
  longest matching n-gram in a :class:`pacer.drafters.phrase.PhrasePool` of the request's prompt and output, each
  token with the lookup's confidence for its key length (:func:`lookup_draft`); the survival of ``d_1..d_i`` is the
  product of the confidences, calibrated by the row's memory (:func:`survival`), as pacer's cost-aware rule does.
* *Lengths* (:func:`pacer.pricing.batch_lengths`): all rows share one target forward, so the rule is pacer's
  :func:`pacer.pricing.gain_pays` on the batch: a forward scoring ``B`` decoding rows and ``D`` draft
  tokens yields ``E = B + Σ S`` tokens in ``c_t(B + D)`` seconds; the next draft token with the highest survival is
  added while it raises ``E / c_t``. For one row this is exactly pacer's single-generation rule for looked-up (free)
  tokens. Rows therefore get different lengths in one step: a row whose lookup is confident drafts long, one without a
  match or with a poor record drafts nothing.

**Costs**: the target's cost profile (``profile``: a ``pacer-profile/1`` file from ``pacer calibrate --export``,
priced at each step's mean context and extended to batch-sized forwards by :meth:`pacer.profiles.Profile.price`; or
plain costs, :func:`load_costs`), else :data:`DEFAULT_COSTS` (nearly flat: each extra scored token 1 % of a forward,
verification as on a GPU at small batch). Only ratios matter.

Settings: class attributes of :class:`PacerProposer` (subclass it to change them), overridden by
``vllm_config.additional_config["pacer"]`` (``--additional-config '{"pacer": {...}}'``) and by the environment
(``PACER_VLLM_PROFILE``, ``PACER_VLLM_LOG``: a JSON-lines file, one line per step with each row's draft length).

Nothing here imports vLLM: the pure parts run and are tested without it (tests/test_vllm_proposer.py); vLLM's
logger (``vllm.pacer``) is used only inside vLLM.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..bounds import MAX_KEY, MAX_PHRASE, MAX_POOL, Count
from ..costs import BadField, ContextCosts, Costs, show_value
from ..decoding.meter import TARGET, Call
from ..drafters.lookup import KEY_CONFIDENCE
from ..drafters.pool import PhrasePool
from ..errors import PacerError
from ..pricing import CostMemory, batch_lengths
from ..profiles import FORMAT as PROFILE_FORMAT
from ..profiles import Profile

#: nearly flat verification (each extra scored token costs 1 % of a forward): a GPU at small batch. A CPU target is
#: far from it (docs/cost-aware.md): give its profile.
DEFAULT_COSTS = Costs(draft=0.0, target={1: 1.0, 1024: 1.0 + 1023 * 0.01})

ENV_PROFILE = "PACER_VLLM_PROFILE"
ENV_LOG = "PACER_VLLM_LOG"

Prefix = tuple[int, bytes]


def prefix_key(tokens) -> Prefix:
    """A row's identity: its length and a 128-bit hash of its token ids (any int sequence or array; vLLM's rows are
    int32, hashed without a copy)."""
    a = np.ascontiguousarray(tokens, dtype=np.int32)
    return len(a), hashlib.blake2b(a, digest_size=16).digest()


def prefix_keys(tokens: np.ndarray, m: int) -> tuple[Prefix, Prefix]:
    """``(prefix_key(tokens[:-m]), prefix_key(tokens))`` in one pass over the text (the hash of the longer prefix
    goes on from the shorter one's)."""
    a = np.ascontiguousarray(tokens, dtype=np.int32)
    L = len(a)
    h = hashlib.blake2b(a[: L - m], digest_size=16)
    before = (L - m, h.digest())
    h.update(a[L - m :])
    return before, (L, h.digest())


#: where a profile's costs may sit: ``{"costs": {...}}`` (a cost profile), ``{"payload": {"costs": {...}}}`` (pacer's
#: calibration cache file, ``$PACER_HOME/calibration/*.json``)
NESTED = ("costs", "payload")


def load_costs(profile: Costs | Profile | dict | str | Path | None) -> tuple[Costs | Profile, str]:
    """``(costs, where they came from)``: a pacer cost profile (:class:`pacer.profiles.Profile`, ``pacer-profile/1``:
    ``pacer calibrate --export FILE``; priced at each step's context by :class:`PacerPlanner`), a :class:`Costs`, a
    dict with ``target`` (``{k: seconds}``) and optionally ``draft``, ``policy_per_check``, ``draft_prefill``, at the
    top or nested under :data:`NESTED` keys (a pacer calibration cache file works as it is), a JSON file holding one
    of these, or ``None`` for :data:`DEFAULT_COSTS`."""
    if profile is None or profile == "":
        return DEFAULT_COSTS, "default (nearly flat verification)"
    if isinstance(profile, Profile):
        if bad := profile.problems():
            raise PacerError(f"the given cost profile {profile.name} holds unusable costs ({bad[0]})")
        return profile, "given"
    if isinstance(profile, Costs):
        try:
            Costs.from_dict(profile.to_dict(), free_draft=True)
        except BadField as e:
            raise PacerError(f"the given costs: {e}") from None
        return profile, "given"
    source = "given"
    if isinstance(profile, str | Path):
        from ..io import BadJson, read_json

        path = Path(profile)
        try:
            profile = read_json(path, "the cost profile", "")
        except BadJson as e:
            raise PacerError(f"cannot read the cost profile {path}: {e.reason}; pass a file of `pacer calibrate "
                             f"--export`") from None
        source = str(path)
    if isinstance(profile, dict) and profile.get("format") == PROFILE_FORMAT:
        p = Profile.from_dict(profile, f"cost profile {source}")
        return p, f"{source}: {p.describe()}"
    d = profile
    while isinstance(d, dict) and "target" not in d:
        inner = [d[k] for k in NESTED if isinstance(d.get(k), dict)]
        if not inner:
            break
        d = inner[0]
    if not isinstance(d, dict) or "target" not in d:
        raise PacerError(f"cost profile {source}: no 'target' {{k: seconds}} (at the top or under "
                         f"{' / '.join(repr(k) for k in NESTED)}); pass a file of `pacer calibrate --export`")
    try:
        costs = Costs.from_dict(d, free_draft=True)  # looked-up draft tokens are free: 'draft' may be 0
    except BadField as e:
        raise PacerError(f"cost profile {source}: {e}; fix it or pass a file of `pacer calibrate --export`") \
            from None
    return costs, source


def lookup_draft(pool: PhrasePool, context: list[int], k: int) -> tuple[list[int], list[float]]:
    """Up to ``k`` looked-up tokens continuing ``context`` (chained: a continuation's end is looked up again), each
    with the lookup's confidence for the key it matched (:data:`pacer.drafters.lookup.KEY_CONFIDENCE`)."""
    ctx = list(context[-pool.key_len :])
    tokens: list[int] = []
    conf: list[float] = []
    while len(tokens) < k:
        found = pool.lookup(ctx, 1)
        if not found:
            break
        key, cont = found[0]
        c = KEY_CONFIDENCE.get(len(key), max(KEY_CONFIDENCE.values()))
        for x in cont[: k - len(tokens)]:
            tokens.append(int(x))
            conf.append(c)
        ctx = (ctx + list(cont))[-pool.key_len :]
    return tokens, conf


def survival(memory: CostMemory, confidence: list[float]) -> tuple[list[float], list[float]]:
    """``(raw, S)``: ``raw[i-1]`` the product of the first ``i`` confidences (the lookup policy's survival score),
    ``S[i-1]`` the probability that ``d_1..d_i`` are all accepted: ``raw`` calibrated by the row's memory, never
    rising along the draft (as :class:`pacer.policies.cost_aware.CostAwarePolicy` does)."""
    raw: list[float] = []
    S: list[float] = []
    r, prev = 1.0, 1.0
    for c in confidence:
        r *= c
        prev = min(prev, memory.calibrator(r))
        raw.append(r)
        S.append(prev)
    return raw, S


def observed_acceptance(draft: list[int], committed: list[int]) -> tuple[int, int]:
    """``(drafted, accepted)`` for a row given ``draft`` last step that then committed ``committed`` (vLLM's
    ``sampled_token_ids`` row: the accepted draft tokens and one more). The token after the accepted ones differs from
    the draft's there (greedy: the target's argmax; sampling with one-hot ``q``: drawn from the residual without
    it), so one equal to it means the scheduler verified fewer tokens than drafted (trimmed to its token budget or
    the model length): then only the committed ones count as drafted."""
    m = len(committed)
    if not draft or m == 0:
        return 0, 0
    n = 0
    while n < min(m - 1, len(draft)) and committed[n] == draft[n]:
        n += 1
    if n < len(draft) and n == m - 1 and committed[n] == draft[n]:
        return n, n  # trimmed: d_{n+1} was not verified
    return len(draft), n


@dataclass
class RowState:
    """One request as the proposer knows it: its phrase pool, what it has read of its text, its memory, the draft
    it was last given (and the raw scores of its tokens) and totals."""

    pool: PhrasePool
    memory: CostMemory = field(default_factory=CostMemory)
    seen: int = 0
    draft: list[int] = field(default_factory=list)
    raw: list[float] = field(default_factory=list)
    last_call: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0

    def observe(self, committed: list[int]) -> tuple[int, int]:
        """Learn from the verdict on the last draft (``committed``: the tokens the row committed since)."""
        drafted, accepted = observed_acceptance(self.draft, committed)
        if drafted:
            self.memory.update(list(self.raw[:drafted]), drafted, accepted)
            self.drafted += drafted
            self.accepted += accepted
        self.rounds += bool(committed)
        self.draft, self.raw = [], []
        return drafted, accepted


class RowMemory:
    """Row states keyed by their token prefix (:func:`prefix_key`): :meth:`take` the state stored under a row's
    previous prefix, :meth:`put` it back under the new one. Several states may share a key (identical texts);
    states idle for more than ``max_idle`` calls are dropped, and the oldest beyond ``capacity``."""

    def __init__(self, capacity: int = 4096, max_idle: int = 512) -> None:
        self.capacity, self.max_idle = capacity, max_idle
        self.states: OrderedDict[Prefix, list[RowState]] = OrderedDict()
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def take(self, key: Prefix) -> RowState | None:
        states = self.states.get(key)
        if not states:
            return None
        state = states.pop()
        self.size -= 1
        if not states:
            del self.states[key]
        return state

    def put(self, key: Prefix, state: RowState) -> None:
        self.states.setdefault(key, []).append(state)
        self.states.move_to_end(key)
        self.size += 1

    def evict(self, call: int) -> None:
        while self.states:
            key, states = next(iter(self.states.items()))
            if self.size <= self.capacity and all(call - s.last_call <= self.max_idle for s in states):
                return
            del self.states[key]
            self.size -= len(states)


@dataclass
class StepLog:
    """One :meth:`PacerPlanner.step`: per row the length of its last draft that was verified, how many of those
    were accepted, the lookup's candidate length and the length decided (``None``: a row without a sampled token);
    the rows' mean context (where a profile's costs were priced)."""

    call: int
    verified: list[int | None]
    accepted: list[int | None]
    candidates: list[int | None]
    lengths: list[int | None]
    context: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return dict(self.__dict__, seconds=round(self.seconds, 6))


class PacerPlanner:
    """The proposer's logic without vLLM: :meth:`step` takes each row's text and the tokens it committed this step
    and returns each row's draft. ``k``: the most tokens per row (vLLM's ``num_speculative_tokens``);
    ``max_len``: the model's length (a draft never runs past it)."""

    #: a profile's costs are priced at the batch's mean context rounded up to a multiple of this
    CONTEXT_STEP = 32
    #: beyond a profile's measured ``k``, forwards of these many tokens are priced as the profile prices them (a
    #: batch scores one token per row and its drafts: far more than one generation's verification)
    BATCH_KS = (24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096)

    def __init__(self, k: int, costs: Costs | Profile | None = None, ngram: int = 8, key_len: int = 3,
                 pool_size: int = 1 << 16, max_len: int | None = None, capacity: int = 4096,
                 max_idle: int = 512) -> None:
        k = setting_count("num_speculative_tokens", k)
        ngram, key_len = setting_count("ngram", ngram), setting_count("key_len", key_len)
        pool_size, capacity = setting_count("pool_size", pool_size), setting_count("capacity", capacity)
        max_idle = setting_count("max_idle", max_idle)
        max_len = None if max_len is None else setting_count("max_model_len", max_len)
        self.k, self.ngram, self.key_len, self.pool_size, self.max_len = k, ngram, key_len, pool_size, max_len
        costs, _ = load_costs(costs)  # checked however they come (DEFAULT_COSTS for None)
        self.profile = costs if isinstance(costs, Profile) else None
        #: the target's costs by context, the one shape pacer prices with (:class:`pacer.costs.ContextCosts`)
        self.curve = ContextCosts(self._batch_costs, step=self.CONTEXT_STEP, up=True) if self.profile is not None \
            else ContextCosts.fixed(costs)
        self.costs = self.curve.costs(self.CONTEXT_STEP)
        self.rows = RowMemory(capacity, max_idle)
        self.calls = 0
        self.last: StepLog | None = None

    def _batch_costs(self, context: int) -> Costs:
        """A profile's costs after ``context`` cached tokens (:meth:`pacer.profiles.Profile.costs`) extended to
        batch-sized forwards as :meth:`~pacer.profiles.Profile.price` prices them."""
        base = self.profile.costs(context)
        kmax = max(base.target)
        extra = {k: self.profile.price(Call(TARGET, k, context, False, 0.0)) for k in self.BATCH_KS if k > kmax}
        return replace(base, target={**base.target, **extra})

    def new_state(self) -> RowState:
        return RowState(PhrasePool(self.ngram, self.pool_size, self.key_len))

    def step(self, rows: list[tuple[Any, list[int]]]) -> list[list[int]]:
        """``rows[i] = (text, committed)``: row ``i``'s whole token sequence (a list or 1-d array) and the tokens it
        committed this step (its last ``len(committed)`` tokens; empty: not decoding this step, no draft)."""
        t0 = time.perf_counter()
        self.calls += 1
        n = len(rows)
        states: list[RowState | None] = [None] * n
        verified: list[int | None] = [None] * n
        accepted: list[int | None] = [None] * n
        contexts: list[list[int]] = [[] for _ in range(n)]  # each row's last key_len tokens
        lens = [0] * n
        keys: list[Prefix | None] = [None] * n
        for i, (text, committed) in enumerate(rows):
            m = len(committed)
            if not m:
                continue
            arr = np.ascontiguousarray(text, dtype=np.int32)
            L = len(arr)
            before, keys[i] = prefix_keys(arr, min(m, L))
            state = self.rows.take(before) if L > m else None
            if state is None:
                state = self.new_state()
            verified[i], accepted[i] = state.observe([int(x) for x in committed])
            # the pool learns the committed text as pacer.drafters.phrase.learn_committed does, reading only the new
            # part
            if state.seen == 0:
                state.pool.add_sequence(arr.tolist(), "prompt")
            elif L > state.seen:
                lo = max(0, state.seen - self.ngram - self.key_len)
                state.pool.add_sequence(arr[lo:].tolist(), "output", min_end=state.seen - lo)
            state.seen = L
            state.last_call = self.calls
            states[i], contexts[i], lens[i] = state, arr[-self.key_len :].tolist(), L
        drafts: list[list[int]] = [[] for _ in range(n)]
        candidates: list[int | None] = [None] * n
        S_rows: list[list[float]] = [[] for _ in range(n)]
        raws: list[list[float]] = [[] for _ in range(n)]
        for i, state in enumerate(states):
            if state is None:
                continue
            room = self.k if self.max_len is None else min(self.k, self.max_len - lens[i] - 1)
            if room > 0:
                drafts[i], conf = lookup_draft(state.pool, contexts[i], room)
                raws[i], S_rows[i] = survival(state.memory, conf)
            candidates[i] = len(drafts[i])
        decoding = sum(s is not None for s in states)
        context = sum(lens) // max(1, decoding)
        lengths = batch_lengths(S_rows, self.curve.costs(context), decoding)
        out: list[list[int]] = []
        for i, state in enumerate(states):
            if state is None:
                out.append([])
                continue
            d = drafts[i][: lengths[i]]
            state.draft, state.raw = d, raws[i][: lengths[i]]
            self.rows.put(keys[i], state)
            out.append(d)
        self.rows.evict(self.calls)
        self.last = StepLog(self.calls, verified, accepted, candidates,
                            [None if s is None else len(d) for s, d in zip(states, out, strict=True)], context,
                            time.perf_counter() - t0)
        return out


#: where each setting is set, for the message that refuses it
SETTING_WHERE = {"num_speculative_tokens": "--speculative-config's num_speculative_tokens",
                 "max_model_len": "vLLM's --max-model-len", "max_num_seqs": "vLLM's --max-num-seqs",
                 "log": f"additional_config['pacer']['log'] or ${ENV_LOG}",
                 "profile": f"additional_config['pacer']['profile'] or ${ENV_PROFILE}"}


def _where(name: str) -> str:
    return SETTING_WHERE.get(name, f"additional_config['pacer'][{name!r}]")


def _setting_ranges() -> dict[str, Count]:
    from ..methods.registry import MAX_DRAFT

    ranges = {"num_speculative_tokens": MAX_DRAFT, "ngram": MAX_PHRASE, "key_len": MAX_KEY, "pool_size": MAX_POOL,
              "max_model_len": MAX_MODEL_LEN, "max_num_seqs": MAX_SEQS, "capacity": 8 * MAX_SEQS,
              "max_idle": MAX_IDLE}
    return {name: Count(f"pacer vLLM setting {name}", 1, top) for name, top in ranges.items()}


#: the longest model length and the most sequences of a batch the proposer plans for (its row states are bounded by
#: them), and the most steps a row state is kept unseen
MAX_MODEL_LEN, MAX_SEQS, MAX_IDLE = 1 << 24, 1 << 16, 1 << 20


def setting_count(name: str, value: Any) -> int:
    """A whole-number setting of the proposer, checked where it is set: an integer (not a string, a float or a
    boolean: ``int()`` would take ``"8"``, truncate ``3.7`` and read ``True`` as 1) from 1 to the setting's maximum
    (:func:`_setting_ranges`: a phrase length, a pool size or a row count allocates by it)."""
    bound = _setting_ranges().get(name) or Count(f"pacer vLLM setting {name}", 1, MAX_IDLE)
    return bound.check(int(value) if isinstance(value, np.integer) else value, _where(name))


def setting_log(value: Any) -> Path | None:
    """The ``log`` setting checked where it is set: ``None``/``""`` (no log) or a path to a file that can be
    appended to (its folder exists; opened once here, so that the first engine step cannot fail on it)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str | os.PathLike):
        raise PacerError(f"pacer vLLM setting log is {show_value(value)}: it takes a file name; set {_where('log')}")
    path = Path(value)
    if path.is_dir():
        raise PacerError(f"pacer vLLM setting log {path} is a folder: give a file name in it; set {_where('log')}")
    if not path.parent.is_dir():
        raise PacerError(f"pacer vLLM setting log {path}: its folder {path.parent} does not exist; create it or set "
                         f"{_where('log')}")
    existed = path.exists()
    try:
        with path.open("a"):
            pass
    except OSError as e:
        raise PacerError(f"pacer vLLM setting log {path} cannot be written ({e.strerror or e}); set "
                         f"{_where('log')}") from None
    if not existed:
        path.unlink()  # created at the first step that logs: nothing is left by a proposer that never ran
    return path


class PacerProposer:
    """The vLLM ``custom_class`` proposer: ``vllm_config.speculative_config.model =
    "pacer.integrations.vllm.PacerProposer"``. Settings (class attributes; subclass to change them, or set them in
    ``--additional-config '{"pacer": {...}}'``; the environment overrides ``profile`` and ``log``)."""

    #: the target's costs (a ``pacer-profile/1`` file or :class:`~pacer.profiles.Profile`, a path, a dict or a
    #: :class:`Costs`: :func:`load_costs`; ``None``: :data:`DEFAULT_COSTS`)
    profile: Costs | Profile | dict | str | None = None
    #: a JSON-lines file: one line per step with each row's draft length (``None``: none)
    log: str | None = None
    #: the lookup's phrase length and longest key (pacer's ``lookup`` defaults)
    ngram: int = 8
    key_len: int = 3
    #: a row state unseen for this many steps is dropped
    max_idle: int = 512

    SETTINGS = ("profile", "log", "ngram", "key_len", "max_idle")

    def __init__(self, vllm_config) -> None:
        spec = vllm_config.speculative_config
        settings = {s: getattr(self, s) for s in self.SETTINGS}
        extra = getattr(vllm_config, "additional_config", None)
        mine = extra.get("pacer") if isinstance(extra, dict) else None
        if mine is not None:
            if not isinstance(mine, dict):
                raise PacerError(f"additional_config['pacer'] is {show_value(mine)}: it takes an object of settings "
                                 f"({', '.join(self.SETTINGS)})")
            unknown = set(mine) - set(self.SETTINGS)
            if unknown:
                raise PacerError(f"additional_config['pacer']: unknown settings {sorted(unknown)} "
                                 f"(known: {', '.join(self.SETTINGS)})")
            settings.update(mine)
        settings["profile"] = os.environ.get(ENV_PROFILE) or settings["profile"]
        settings["log"] = os.environ.get(ENV_LOG) or settings["log"]
        # every setting is checked here, when vLLM builds the proposer: an error in propose() would stop the engine
        # at its first request
        costs, source = load_costs(settings["profile"])
        max_len = getattr(getattr(vllm_config, "model_config", None), "max_model_len", None)
        max_seqs = getattr(getattr(vllm_config, "scheduler_config", None), "max_num_seqs", None)
        max_seqs = 256 if max_seqs is None else setting_count("max_num_seqs", max_seqs)
        self.k = setting_count("num_speculative_tokens", getattr(spec, "num_speculative_tokens", None))
        self.planner = PacerPlanner(self.k, costs, setting_count("ngram", settings["ngram"]),
                                    setting_count("key_len", settings["key_len"]), max_len=max_len,
                                    capacity=8 * max_seqs, max_idle=setting_count("max_idle", settings["max_idle"]))
        self.planner.new_state()  # the phrase pool's own checks, now
        self.log_path = setting_log(settings["log"])
        self.logger = _logger()
        self.logger.info("pacer proposer: up to %d lookup tokens per row, lengths by the cost-aware rule on %s "
                         "(%s%s)", self.k, source, self.planner.costs.curve(),
                         " at 32 tokens of context" if self.planner.profile is not None else "")

    def load_model(self, *args, **kwargs) -> None:
        """No model of its own (vLLM's CPU runner calls this with the target)."""

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec, token_ids_cpu,
                slot_mappings=None) -> list[list[int]]:
        rows = [(token_ids_cpu[i, : int(num_tokens_no_spec[i])], sampled)
                for i, sampled in enumerate(sampled_token_ids)]
        out = self.planner.step(rows)
        last = self.planner.last
        if last is not None:
            self.logger.debug("pacer step %d: draft lengths %s (candidates %s; last verified %s, accepted %s)",
                              last.call, last.lengths, last.candidates, last.verified, last.accepted)
            if self.log_path is not None:
                try:
                    with self.log_path.open("a") as f:
                        f.write(json.dumps(last.to_dict()) + "\n")
                except OSError as e:  # the log is a record, not the engine's work: said once, then not written
                    self.logger.warning("pacer proposer: cannot write the step log %s (%s); no longer logging",
                                        self.log_path, e.strerror or e)
                    self.log_path = None
        return out


def _logger() -> logging.Logger:
    """Under vLLM's logger where vLLM runs (``vllm.pacer``: its handlers and level), else a plain one."""
    try:
        from vllm.logger import init_logger
    except ImportError:
        return logging.getLogger(__name__)
    return init_logger("vllm.pacer")

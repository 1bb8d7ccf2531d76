"""Greedy speculative decoding must reproduce plain greedy decoding token for token, for every policy."""

import pytest
import torch

from conftest import FLAT
from pacer import Decoder
from pacer.decoding import ModelBackend, Output, speculative_generate
from pacer.decoding.meter import MeteredBackend
from pacer.decoding.stats import GenerationStats
from pacer.drafters import TokenDrafter
from pacer.policies import DraftPolicy, FixedPolicy, RoundResult
from pacer.sampling import SamplingConfig

PROMPTS = ["hello world, this is", "def f(x):\n    return", "a", "The 3 quick brown foxes"]
METHODS = ["sd", "heuristic", "confidence", "entropy", "oracle"]


@pytest.mark.parametrize("kind", ["close", "same", "random"])
@pytest.mark.parametrize("method", METHODS)
def test_greedy_sd_equals_plain(pairs, kind, method):
    dec = pairs[kind]
    for prompt in PROMPTS:
        ids = dec.encode(prompt)
        ar = dec.generate(ids, "ar", max_new_tokens=37)
        for gamma in (1, 2, 5, 40):
            res = dec.generate(ids, method, max_new_tokens=37, gamma=gamma)
            assert res.token_ids == ar.token_ids, (kind, method, prompt, gamma)
            st = res.stats
            assert st.new_tokens == len(ar.token_ids)
            assert all(0 <= n <= g for n, g in zip(st.accepted_counts, st.draft_lengths, strict=True))
            if method == "sd":
                assert max(st.draft_lengths) <= min(gamma, 36)


def test_draft_equal_to_target_accepts_everything(pairs):
    dec = pairs["same"]
    for prompt in PROMPTS:
        res = dec.generate(prompt, "sd", max_new_tokens=40, gamma=4)
        assert res.stats.acceptance_rate == 1.0
        if res.stats.finish_reason == "length":
            # the prefill gives the first token; then 4 accepted + the bonus token per target call, 3 + 1 at the end
            assert res.stats.draft_lengths == res.stats.accepted_counts == [0] + [4] * 7 + [3]
            assert res.stats.target_calls == 9 and res.stats.tau == 40 / 9


def test_random_draft_accepts_almost_nothing_and_is_exact(pairs):
    dec = pairs["random"]
    ids = dec.encode(PROMPTS[0])
    ar = dec.generate(ids, "ar", max_new_tokens=60)
    res = dec.generate(ids, "sd", max_new_tokens=60, gamma=4)
    assert res.token_ids == ar.token_ids
    assert res.stats.acceptance_rate < 0.1
    assert res.stats.target_calls >= 0.9 * res.stats.new_tokens


class CacheChecker(DraftPolicy):
    """Fixed-γ policy that asserts, after every round, that both caches hold exactly the committed prefix."""

    name = "check"

    def __init__(self, target: ModelBackend, drafter: TokenDrafter, prompt_len: int, out: Output, gamma: int):
        super().__init__(1, gamma)
        self.t, self.d, self.p, self.out, self.gamma, self.rounds = target, drafter, prompt_len, out, gamma, 0
        self.prefills = 0

    def should_continue(self, state):
        return state.n < self.gamma

    def prefilled(self, committed: int) -> None:
        # the target has read the prompt and given the first token; the draft has read nothing yet
        assert self.rounds == 0 and committed == len(self.out.ids) == 1
        assert self.t.length == self.p and self.d.backend.length == 0
        self.prefills = 1

    def update(self, state, result: RoundResult):
        assert self.prefills == 1
        self.rounds += 1
        committed = self.p + len(self.out.ids)
        if self.out.done:
            return
        # the target has everything but the newest token (the bonus/correction, fed next round)
        assert self.t.length == committed - 1
        # the draft never holds more than the accepted prefix, and at most two tokens behind
        assert committed - 2 <= self.d.backend.length <= committed - 1
        assert self.t.cache.get_seq_length() == self.t.length
        assert self.d.backend.cache.get_seq_length() == self.d.backend.length


@pytest.mark.parametrize("gamma", [1, 3, 8])
def test_cache_lengths_after_every_round(close, gamma):
    ids = close.encode(PROMPTS[1])
    out = Output(50, set())  # no EOS: run the whole budget
    drafter = TokenDrafter(close.draft_backend(), close.vocab)
    pol = CacheChecker(close.target, drafter, len(ids), out, gamma)
    speculative_generate(close.target, drafter, pol, ids, out, SamplingConfig(), GenerationStats())
    assert pol.prefills == 1 and pol.rounds > 5 and len(out.ids) == 50


def test_eos_and_max_new_tokens_inside_a_draft_block(pairs):
    dec = pairs["same"]  # accepts whole blocks, so every stop falls inside one
    ids = dec.encode(PROMPTS[0])
    ar = dec.generate(ids, "ar", max_new_tokens=30).token_ids
    # max_new_tokens inside a block of 8
    for m in (1, 2, 5, 7, 13):
        res = dec.generate(ids, "sd", max_new_tokens=m, gamma=8)
        assert res.token_ids == ar[:m] and res.stats.finish_reason in ("length", "eos")
    # EOS inside a block: make the 6th plain token an end token
    saved = set(dec.eos)
    try:
        dec.eos.add(ar[5])
        k = ar.index(ar[5])
        res = dec.generate(ids, "sd", max_new_tokens=30, gamma=8)
        assert res.token_ids == ar[: k + 1] and res.stats.finish_reason == "eos"
        assert dec.generate(ids, "ar", max_new_tokens=30).token_ids == ar[: k + 1]
    finally:
        dec.eos.clear()
        dec.eos.update(saved)


def test_stop_string_inside_a_block_matches_plain(pairs):
    dec = pairs["same"]
    ids = dec.encode(PROMPTS[2])
    full = dec.generate(ids, "ar", max_new_tokens=30)
    stop = dec.decode(full.token_ids[6:8])
    if not stop.strip("\ufffd"):
        pytest.skip("tokens decode to partial bytes")
    ar = dec.generate(ids, "ar", max_new_tokens=30, stop=[stop])
    sd = dec.generate(ids, "sd", max_new_tokens=30, stop=[stop], gamma=8)
    assert sd.token_ids == ar.token_ids and len(ar.token_ids) <= 8
    assert sd.stats.finish_reason == "stop" and stop not in sd.text


def test_sampling_is_reproducible_with_a_seed(close):
    s = SamplingConfig(temperature=0.8, top_k=50, top_p=0.9, seed=7)
    a = close.generate(PROMPTS[0], "sd", max_new_tokens=20, sampling=s)
    b = close.generate(PROMPTS[0], "sd", max_new_tokens=20, sampling=s)
    assert a.token_ids == b.token_ids
    c = close.generate(PROMPTS[0], "sd", max_new_tokens=20, sampling=SamplingConfig(0.8, 50, 0.9, seed=8))
    assert c.token_ids != a.token_ids


def test_gamma_larger_than_what_remains(close):
    ids = close.encode(PROMPTS[0])
    ar = close.generate(ids, "ar", max_new_tokens=3).token_ids
    res = close.generate(ids, "sd", max_new_tokens=3, gamma=16)
    assert res.token_ids == ar and max(res.stats.draft_lengths) <= 2


def test_stats_definitions(pairs):
    res = pairs["same"].generate(PROMPTS[0], "sd", max_new_tokens=15, gamma=3)
    st = res.stats
    # the prefill gives 1 token (a round that drafts nothing); 3 rounds of 3 drafted + 1 bonus = 12 tokens; 2
    # remain, so the last round drafts 1 (+1 bonus)
    assert st.draft_lengths == [0, 3, 3, 3, 1] and st.accepted_counts == [0, 3, 3, 3, 1]
    assert st.tau == pytest.approx(15 / 5) and st.acceptance_rate == 1.0
    assert st.per_position_acceptance() == [1.0, 1.0, 1.0]
    assert st.accepted_count_histogram() == {0: 1, 1: 1, 3: 3}
    d = st.to_dict()
    assert d["tokens_per_s"] > 0 and d["target_calls"] == 5 and d["wasted_draft_tokens"] == 0


def test_fixed_policy_bounds():
    assert FixedPolicy(3).max_draft == 3


def test_output_cut_by_the_context_window_says_context(close):
    ids = close.encode(PROMPTS[0])
    ids = (ids * (close.target.context // len(ids) + 1))[: close.target.context - 3]
    for method in ("ar", "sd"):
        res = close.generate(ids, method, max_new_tokens=10)
        if res.stats.finish_reason != "eos":
            assert len(res.token_ids) == 3 and res.stats.finish_reason == "context"
    assert close.generate(PROMPTS[0], "sd", max_new_tokens=3).stats.finish_reason in ("length", "eos")


def test_near_tie_is_measured_in_dtype_resolution_steps():
    import torch

    from pacer.decoding import Divergence, dtype_resolution

    # bf16 keeps 8 significant bits: spacing 0.125 in [16, 32), 0.25 in [32, 64)
    assert dtype_resolution(20.0, torch.bfloat16) == 0.125 and dtype_resolution(-40.0, torch.bfloat16) == 0.25
    assert dtype_resolution(40.0, torch.float32) == 2.0**-23 * 32
    one_step = Divergence(5, 1, 2, top2_gap=0.25, gap=0.25, resolution=0.25)
    assert one_step.near_tie and one_step.steps == 1.0 and "a near-tie" in one_step.describe()
    # the differing token far below the best logit: a real failure even if the top-2 are tied
    far = Divergence(5, 1, 2, top2_gap=0.0, gap=3.0, resolution=0.125)
    assert not far.near_tie and "NOT a near-tie" in far.describe()
    # one output ended there: the top-2 gap decides
    assert Divergence(5, 1, -1, top2_gap=0.125, resolution=0.125).near_tie
    assert not Divergence(5, 1, -1, top2_gap=0.5, resolution=0.125).near_tie
    # float32 resolution is ~1e-6: a gap of 0.01 is not a tie there
    assert not Divergence(5, 1, 2, 0.01, 0.01, dtype_resolution(30.0, torch.float32)).near_tie


def test_the_target_argmax_is_computed_up_to_the_first_rejection_unless_the_drafter_reads_all(pairs):
    """A drafter that learns from the target's text past a rejection (``reads_target_argmax``: phrase pools) is
    given the target's argmax at every verified row; any other only the rows up to the first rejection (each a
    pass over the whole vocabulary), and the output is the same."""
    from pacer.drafters.token import TokenDrafter
    from pacer.sampling import greedy_prefix

    logits = torch.full((5, 7), -1.0)
    for row, top in enumerate([3, 4, 0, 6, 2]):
        logits[row, top] = 2.0
    assert greedy_prefix([3, 4, 5, 6], logits) == [3, 4, 0]  # d_3 = 5 rejected: rows 3 and 4 are not read
    assert greedy_prefix([3, 4, 0, 6], logits) == [3, 4, 0, 6, 2]  # all accepted: the bonus row too
    assert greedy_prefix([], logits[:1]) == [3]

    class Seen(TokenDrafter):
        def observe(self, tokens, target_argmax, accepted):
            seen.append((len(target_argmax), accepted, len(self.last)))

        def propose(self, *args, **kwargs):
            d = super().propose(*args, **kwargs)
            self.last = d.tokens
            return d

    dec = pairs["close"]
    outputs = []
    for reads in (False, True):
        seen: list[tuple[int, int, int]] = []
        drafter = Seen(dec.draft_backend(), dec.vocab)
        drafter.reads_target_argmax = reads
        outputs.append(dec.generate("hello world", "sd", gamma=4, max_new_tokens=24, drafter=drafter).token_ids)
        assert seen and all(n + 1 <= got <= γ + 1 for got, n, γ in seen)
        assert all(got == (γ + 1 if reads else n + 1) for got, n, γ in seen)
    assert outputs[0] == outputs[1] == dec.generate("hello world", "ar", max_new_tokens=24).token_ids


def test_a_long_prompt_is_fed_apart_where_a_hidden_forward_scores_every_row(pairs):
    """A backend whose hidden-state forward computes every row's logits (llama.cpp's embeddings mode) gets a long
    unread input without ``hidden`` first, then the last token with it: the states of that token are the same,
    no row of the prompt is scored, and the output is plain decoding's."""
    from pacer.decoding.backend import HIDDEN_SPLIT

    class WithStates(FixedPolicy):
        hidden_layers = (-1,)

    dec = pairs["close"]
    prompt = list(range(5, 5 + HIDDEN_SPLIT + 8))
    want = dec.generate(prompt, "ar", max_new_tokens=12).token_ids
    for every_row in (False, True):
        drafter = TokenDrafter(dec.draft_backend(), dec.vocab)
        drafter.backend.inner.hidden_scores_every_row = every_row
        res = dec.generate(prompt, "sd", max_new_tokens=12, policy=WithStates(3), drafter=drafter)
        assert res.token_ids == want
        first = [c for c in res.stats.calls if c.role == "draft"][:2]
        # the draft reads the prompt and the prefill's token
        assert [(c.k, c.rows) for c in first] == ([(len(prompt), 1), (1, 1)] if every_row else
                                                  [(len(prompt) + 1, 1), (1, 1)])


class Logged(MeteredBackend):
    """A metered backend that also logs each forward, in order, into a shared list of events."""

    def __init__(self, inner, role: str, events: list) -> None:
        super().__init__(inner, role)
        object.__setattr__(self, "events", events)

    def _metered(self, fwd, ids, keep, hidden, tree):
        self.events.append((self.role, len(ids)))
        return super()._metered(fwd, ids, keep, hidden, tree)


@pytest.mark.parametrize("method", ["sd", "heuristic", "confidence", "ouroboros", "lookup", "sampled"])
def test_the_first_token_is_streamed_before_the_draft_reads_the_prompt(method):
    """Time to first token as plain decoding's: the target's prefill gives the first token, which is committed
    and streamed (``on_tokens``) before the draft's first forward; that forward reads the prompt and the token
    together (no extra draft forward), and the output is plain decoding's (greedy) or the target's own first
    sample (sampling: the same seed gives plain decoding's first token)."""
    from pacer.tiny import tiny_pair

    dec = Decoder(*tiny_pair("close"), threads=1, costs=FLAT)
    events: list = []
    dec.pair.target = Logged(dec.pair.target.inner, "target", events)
    open_draft = dec.pair.draft_backend
    dec.pair.draft_backend = lambda rows=None: Logged(open_draft(rows).inner, "draft", events)
    ids = dec.encode(PROMPTS[0])
    sampling = SamplingConfig(temperature=1.0, seed=3) if method == "sampled" else SamplingConfig()
    ar = dec.generate(ids, "ar", max_new_tokens=20, sampling=sampling).token_ids
    events.clear()
    res = dec.generate(ids, "sd" if method == "sampled" else method, max_new_tokens=20, sampling=sampling,
                       on_tokens=lambda new: events.append(("emit", len(new))))
    assert events[:2] == [("target", len(ids)), ("emit", 1)], events[:4]
    assert res.token_ids[0] == ar[0]
    if method != "sampled":
        assert res.token_ids == ar
    drafts = [i for i, e in enumerate(events) if e[0] == "draft"]
    if method == "lookup":  # no draft model: nothing to read
        assert not drafts and res.stats.draft_tokens > 0
        return
    assert drafts and events[drafts[0]] == ("draft", len(ids) + 1)  # the prompt and the first token, one forward
    assert res.stats.draft_forwards == len(drafts) and res.stats.draft_tokens > 0
    assert res.stats.ttft == res.stats.calls[0].seconds  # the prefill alone

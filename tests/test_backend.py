"""The loop depends only on the model-backend interface: a pure-Python fake backend (deterministic logits, no
``transformers``, no ``nn.Module``) runs every rule, the oracle and Ouroboros's tree verification end to end,
with outputs equal to plain decoding and caches that hold exactly the committed tokens after every round."""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import pytest
import torch

from pacer.decoding import (
    ModelBackend,
    Output,
    Tree,
    autoregressive_generate,
    speculative_generate,
)
from pacer.decoding.stats import GenerationStats
from pacer.drafters import TokenDrafter
from pacer.drafters.phrase import PhraseDrafter, PhraseOptions
from pacer.policies import ConfidencePolicy, DraftPolicy, EntropyPolicy, FixedPolicy, HeuristicPolicy, OraclePolicy
from pacer.sampling import SamplingConfig

V = 17


class FakeBackend(ModelBackend):
    """Logits of a position are a fixed function of the tokens it sees: its visible prefix (cached tokens plus the
    new tokens it attends to, as a :class:`Tree` says) hashed with ``salt``. Two salts disagree now and then, as a
    draft and a target do; ``agree`` makes the "draft" copy the target on that fraction of contexts."""

    def __init__(self, salt: int, agree_with: int | None = None, agree: float = 0.0, context: int = 1 << 20):
        self.salt, self.agree_with, self.agree = salt, agree_with, agree
        self.context, self.vocab_size = context, V
        self.device, self.dtype, self.identity = torch.device("cpu"), torch.float32, self
        self.tokens: list[int] = []  # the cache: what the backend has seen, in order
        self.forwards = 0

    @property
    def length(self) -> int:
        return len(self.tokens)

    def _row(self, seen: Sequence[int]) -> torch.Tensor:
        salt = self.salt
        if self.agree_with is not None and zlib.crc32(bytes(str(list(seen[-3:])), "ascii")) % 100 < 100 * self.agree:
            salt = self.agree_with
        g = torch.Generator().manual_seed(zlib.crc32(bytes(f"{salt}:{list(seen[-4:])}:{len(seen)}", "ascii")))
        return torch.randn(V, generator=g) * 3

    def reset(self) -> None:
        self.tokens = []

    def forward(self, ids, *, keep=0, hidden=False, tree=None):
        ids = list(ids)
        tree = tree or Tree.chain(len(ids))
        assert tree.attend.shape == (len(ids), len(ids)) and len(tree.depth) == len(ids)
        rows = []
        for i in range(len(ids)):
            seen = self.tokens + [ids[j] for j in range(len(ids)) if tree.attend[i, j]]
            assert len(seen) == self.length + tree.depth[i] + 1, "a tree row must see its whole path"
            rows.append(self._row(seen))
        self.tokens += ids
        self.forwards += 1
        logits = torch.stack(rows)[-keep:] if keep else torch.stack(rows)
        h = (torch.stack([torch.full((4,), float(t)) for t in ids]),) * 2 if hidden else None
        return logits, h

    def crop(self, length: int) -> None:
        del self.tokens[length:]

    def score(self, ids):
        return torch.stack([self._row(list(ids[: i + 1])) for i in range(len(ids))])


class Checked(DraftPolicy):
    """Wraps a policy; after every round checks that both caches hold exactly the committed tokens."""

    def __init__(self, inner: DraftPolicy, target: FakeBackend, draft: FakeBackend, prompt: int, out: Output):
        super().__init__(inner.min_draft, inner.max_draft)
        self.inner, self.t, self.d, self.prompt, self.out = inner, target, draft, prompt, out
        self.needs_reference = inner.needs_reference
        self.rounds = 0

    def reset(self) -> None:
        self.inner.reset()

    def should_continue(self, state) -> bool:
        return self.inner.should_continue(state)

    def update(self, state, result) -> None:
        self.inner.update(state, result)
        self.rounds += 1
        committed = self.prompt + len(self.out.ids) - result.committed  # before this round's commit
        assert self.t.length == committed + result.accepted  # rolled back to the accepted draft
        assert self.d.length <= committed + result.accepted


PROMPT = [1, 2, 3, 4, 5]


def plain(n: int = 40) -> list[int]:
    out = Output(n, eos=set())
    autoregressive_generate(FakeBackend(salt=1), PROMPT, out, SamplingConfig(), GenerationStats())
    return out.ids


@pytest.mark.parametrize("policy", [FixedPolicy(gamma=3), HeuristicPolicy(gamma=2), ConfidencePolicy(0.3),
                                    EntropyPolicy(2.0), FixedPolicy(gamma=8)], ids=lambda p: p.describe())
def test_every_rule_on_a_fake_backend_reproduces_plain_decoding(policy):
    target, draft = FakeBackend(salt=1), FakeBackend(salt=2, agree_with=1, agree=0.7)
    out = Output(40, eos=set())
    checked = Checked(policy, target, draft, len(PROMPT), out)
    stats = GenerationStats()
    ids = speculative_generate(target, TokenDrafter(draft, V), checked, PROMPT, out, SamplingConfig(), stats)
    assert ids == plain()
    # every target forward but the prefill is a verification the policy hears of
    assert checked.rounds == stats.target_calls - 1 and stats.draft_tokens > 0
    assert 0 < stats.accepted_tokens < stats.draft_tokens  # the fake draft agrees sometimes, not always
    assert target.forwards == stats.target_calls  # one target forward per round, nothing else


def test_oracle_on_a_fake_backend_drafts_exactly_the_agreeing_tokens():
    target, draft = FakeBackend(salt=1), FakeBackend(salt=2, agree_with=1, agree=0.7)
    reference = plain()
    drafter = TokenDrafter(draft, V)
    oracle = OraclePolicy()
    oracle.set_reference(drafter.agreement(PROMPT, reference))
    stats = GenerationStats()
    ids = speculative_generate(target, drafter, oracle, PROMPT, Output(40, set()), SamplingConfig(), stats)
    assert ids == reference
    assert stats.accepted_tokens == stats.draft_tokens > 0  # it never drafts a token the target rejects
    # ... and drafts every agreeing token: each round runs to the first disagreement (or the budget), after the
    # prefill's token (a round that drafts nothing)
    agree, pos, expected = drafter.agreement(PROMPT, reference), 1, [0]
    while pos < len(reference):
        run = 0
        while pos + run < len(agree) and agree[pos + run] and run < min(oracle.max_draft, len(reference) - pos - 1):
            run += 1
        expected.append(run)
        pos += run + 1
    assert stats.draft_lengths == expected and 0 in expected[1:] and max(expected) > 1


def test_ouroboros_tree_verification_on_a_fake_backend():
    """Phrase drafting and candidate branches (a token tree in one target forward) through the interface alone:
    the pool is seeded with the target's own continuation, so branches are accepted and extend rounds."""
    target, draft = FakeBackend(salt=1), FakeBackend(salt=2, agree_with=1, agree=0.5)
    ref = plain(60)
    d = PhraseDrafter(draft, V, PhraseOptions(warm_start=False, candidates=2, sources=("verify", "output")))
    seq = PROMPT + ref
    d.pool.add_sequence(seq, "output")
    stats = GenerationStats()
    ids = speculative_generate(target, d, FixedPolicy(gamma=2), PROMPT, Output(60, set()), SamplingConfig(), stats)
    assert ids == ref
    rep = d.report()
    assert rep["candidate_accepted_tokens"] > 0 and rep["candidate_rounds"] > 0


def test_sampling_on_a_fake_backend_is_reproducible():
    s = SamplingConfig(temperature=1.0, seed=3)
    runs = []
    for _ in range(2):
        target, draft = FakeBackend(salt=1), FakeBackend(salt=2, agree_with=1, agree=0.7)
        runs.append(speculative_generate(target, TokenDrafter(draft, V), FixedPolicy(gamma=3), PROMPT,
                                         Output(30, set()), s, GenerationStats()))
    assert runs[0] == runs[1] and len(runs[0]) == 30

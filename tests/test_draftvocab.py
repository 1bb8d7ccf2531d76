"""A reduced draft vocabulary (pacer.draftvocab): same logits on the kept rows, never a proposal outside them,
greedy output identical to plain decoding and sampling still in the target's distribution."""

from __future__ import annotations

import json

import pytest
import torch

from pacer import PacerError, SamplingConfig
from pacer.backends.transformers import TransformersBackend
from pacer.bench.methods import parse_methods
from pacer.drafters import TokenDrafter
from pacer.draftvocab import coverage, frequent_ids, load_or_build, special_ids
from pacer.policies import DRAFT_FEATURES, FixedPolicy
from test_sampling import (
    ALPHA,
    PROMPT,
    SMALL_VOCAB,
    _decoder,
    chi2_pvalue,
    exact_drafted_joint,
    exact_joint,
    sample_first_tokens,
)

#: every other byte plus the specials (ids 256..258): half the tiny vocabulary
HALF = list(range(0, 256, 2)) + [256, 257, 258]


def test_restricted_head_gives_the_same_logits_on_kept_rows(close):
    model = close.draft_info.model
    rows = torch.tensor(HALF)
    full, part = TransformersBackend(model), TransformersBackend(model, rows)
    ids = close.encode("hello world, this is")
    lf, hf = full.forward(ids, hidden=True, keep=3)
    lp, hp = part.forward(ids, hidden=True, keep=3)
    assert lp.shape == lf.shape == (3, 259) and part.length == full.length == len(ids)
    # the prompt's tokens are scored too (a continuation often repeats them)
    scored = part.scored_rows()
    assert set(scored.tolist()) == set(HALF) | set(ids) and any(i not in HALF for i in ids)
    torch.testing.assert_close(lp[:, scored], lf[:, scored])
    outside = torch.ones(259, dtype=torch.bool)
    outside[scored] = False
    assert torch.isinf(lp[:, outside]).all() and (lp[:, outside] < 0).all()
    assert len(hp) == len(hf) and all(torch.equal(a, b) for a, b in zip(hp, hf, strict=True))
    # the cache continues as usual after a restricted forward
    l2f, _ = full.forward([5])
    l2p, _ = part.forward([5])
    torch.testing.assert_close(l2p[:, scored], l2f[:, scored])
    part.reset()  # a new sequence forgets the old prompt's rows
    assert torch.equal(part.scored_rows(), rows)
    part.forward([2, 4])
    assert torch.equal(part.scored_rows(), rows)


class Reading(FixedPolicy):
    """A fixed γ that reads every draft feature (a plain fixed γ reads none, and the drafter computes none)."""

    draft_features = DRAFT_FEATURES


def test_drafter_never_proposes_outside_the_rows(close):
    rows = torch.tensor(HALF)
    drafter = TokenDrafter(TransformersBackend(close.draft_info.model, rows), close.vocab)
    drafter.reset()
    ids = close.encode("The 3 quick brown foxes")
    d = drafter.propose(ids, Reading(gamma=12), 12, SamplingConfig(), torch.Generator())
    assert len(d.tokens) == 12 and set(d.tokens) <= set(HALF) | set(ids)
    assert len(d.state.prob) == 12 and all(0 < p <= 1 for p in d.state.prob)


@pytest.mark.parametrize("phrases", [False, True])
def test_greedy_features_over_the_scored_ids_equal_the_full_rows(close, phrases):
    """A greedy drafter reads only the ids a reduced head scores (every other probability is 0): its tokens and
    features (probability, top two, entropy) equal those computed over the whole vocabulary row."""
    from pacer.decoding.drafter import token_features
    from pacer.drafters.phrase import PhraseDrafter, PhraseOptions
    from pacer.policies.base import DraftState

    rows = torch.tensor(HALF)
    make = (lambda b: PhraseDrafter(b, close.vocab, PhraseOptions(warm_start=False))) if phrases else (
        lambda b: TokenDrafter(b, close.vocab))
    drafter = make(TransformersBackend(close.draft_info.model, rows))
    ids = close.encode("The 3 quick brown foxes jump over the 3 quick brown")
    drafter.reset()
    d = drafter.propose(ids, Reading(gamma=10), 10, SamplingConfig(), torch.Generator())
    assert drafter.scored_ids() is not None and len(d.tokens) == 10
    # the same tokens drafted one by one, features over the full row
    ref = TransformersBackend(close.draft_info.model, rows)
    full, pending = DraftState(), ids
    for x in d.tokens:
        q = torch.softmax(ref.forward(pending, keep=1)[0][-1, : close.vocab], -1)
        assert int(q.argmax()) == x
        token_features(q, x, full)
        pending = [x]
    for name in ("prob", "top_prob", "second_prob", "entropy"):
        assert len(getattr(d.state, name)) == 10, name
        assert getattr(d.state, name) == pytest.approx(getattr(full, name), rel=1e-4, abs=1e-6), name
    assert d.state.second_token == full.second_token


@pytest.mark.parametrize("method", ["sd", "entropy", "heuristic", "oracle", "ouroboros"])
def test_greedy_output_identical_with_a_reduced_draft_vocab(pairs, method):
    for kind in ("close", "same"):
        dec = pairs[kind]
        for prompt in ("hello world, this is", "def f(x):\n    return"):
            ids = dec.encode(prompt)
            ar = dec.generate(ids, "ar", max_new_tokens=30)
            res = dec.generate(ids, method, max_new_tokens=30, gamma=5, options={"draft_vocab": HALF})
            assert res.token_ids == ar.token_ids, (kind, method, prompt)
            if method == "oracle":  # drafts exactly to the reduced draft's first mismatch
                assert res.stats.accepted_tokens == res.stats.draft_tokens
    # tokens outside the rows: the target emits them itself, so a target output using them is still reproduced
    dec = pairs["same"]
    ar = dec.generate("hello world", "ar", max_new_tokens=30)
    assert any(t not in HALF for t in ar.token_ids)
    res = dec.generate("hello world", "sd", max_new_tokens=30, gamma=4, options={"draft_vocab": HALF})
    assert res.token_ids == ar.token_ids and res.stats.acceptance_rate < 1.0


def test_decoder_default_draft_vocab_applies_to_every_method(close):
    from pacer import Decoder

    dec = Decoder(close.target_info, close.draft_info, threads=1, draft_vocab=HALF)
    assert torch.equal(dec.make_drafter("sd").backend.rows, torch.tensor(HALF))
    assert torch.equal(dec.make_drafter("ouroboros", warm_start=False).backend.rows, torch.tensor(HALF))
    assert dec.make_drafter("sd", draft_vocab=0).backend.rows is None  # per call: back to the full vocabulary
    # a method with and without the reduced vocabulary never share an Ouroboros warm-start pool
    assert dec.make_drafter("ouroboros").pool is not dec.make_drafter("ouroboros", draft_vocab=0).pool
    assert dec.make_drafter("ouroboros").pool is dec.make_drafter("ouroboros").pool
    ar = dec.generate("a", "ar", max_new_tokens=20)
    assert dec.generate("a", "sd", max_new_tokens=20).token_ids == ar.token_ids


def test_sampling_with_a_reduced_draft_vocab_keeps_the_target_distribution():
    """q is zero outside the rows and renormalised inside: rejection sampling must stay exact."""
    dec = _decoder("sharp")
    rows = list(range(0, SMALL_VOCAB, 2))
    cfg = SamplingConfig(temperature=1.0)
    exact = exact_joint(dec.target.model, PROMPT, cfg)
    counts, drafted_counts, drafted, _ = sample_first_tokens(dec, PROMPT, "sd", cfg, 2500,
                                                             options={"draft_vocab": rows})
    assert drafted >= 2 * 2500
    # odd tokens (never drafted) are still produced at the drafted positions, by the target
    assert drafted_counts[:, 1::2].sum() > 0 and drafted_counts[1::2].sum() > 0
    assert chi2_pvalue(counts.sum(1), exact.sum(1)) > ALPHA
    assert chi2_pvalue(counts, exact) > ALPHA
    assert chi2_pvalue(drafted_counts, exact_drafted_joint(dec.target.model, PROMPT, cfg)) > ALPHA


def test_frequent_ids_counts_and_keeps_specials(close):
    tok = close.tokenizer
    texts = ["aaaabbbccd"] * 3 + ["zz"]
    always = special_ids(tok, close.eos)
    assert close.eos <= always and len(always) >= 2
    ids = frequent_ids(tok, len(always) + 3, texts, always)
    a, b, c = (tok.convert_tokens_to_ids(x) for x in "abc")
    assert ids == sorted(always | {a, b, c})  # the three most frequent, then ties cut; specials always
    assert coverage(torch.tensor(ids), [a, b, a]) == 1.0
    assert coverage(torch.tensor(ids), [a, tok.convert_tokens_to_ids("z")]) == 0.5


def test_load_or_build_caches_and_refuses_bad_sizes(close, tmp_path, monkeypatch):
    import pacer.draftvocab as dv

    monkeypatch.setattr(dv, "sharegpt_texts", lambda conversations=0: ["hello there, general kenobi"] * 4)
    rows = load_or_build(close, 40, home=tmp_path)
    assert len(rows) == 40 and rows.tolist() == sorted(rows.tolist())
    files = list((tmp_path / "draft-vocab").glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["payload"]["ids"] == rows.tolist()

    def boom(conversations=0):
        raise AssertionError("counted again instead of reading the cache")

    monkeypatch.setattr(dv, "sharegpt_texts", boom)
    assert torch.equal(load_or_build(close, 40, home=tmp_path), rows)
    for bad in (3, 259, 10_000):
        with pytest.raises(PacerError, match="draft_vocab must be 0"):
            load_or_build(close, bad, home=tmp_path)


def test_bench_method_option_end_to_end(tmp_path, capsys, monkeypatch):
    import pacer.draftvocab as dv
    from pacer.bench import records as rec_io
    from pacer.cli import main

    spec = parse_methods("ar,sd:gamma=4:draft_vocab=32768,pacer:draft_vocab=0")
    assert spec[1].request().options == {"draft_vocab": 32768}
    with pytest.raises(PacerError, match="hf-assisted takes"):
        parse_methods("hf-assisted:draft_vocab=100")
    with pytest.raises(PacerError, match="takes no option 'ngram'"):
        parse_methods("sd:ngram=3")
    monkeypatch.setenv("PACER_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(dv, "sharegpt_texts", lambda conversations=0: ["the quick brown fox, 1 2 3"] * 8)
    out = tmp_path / "b"
    assert main(["bench", "--quick", "--n", "2", "--max-new-tokens", "10", "--no-progress", "--out", str(out),
                 "--methods", "ar,sd:gamma=3:draft_vocab=64,sd:gamma=3"]) == 0
    recs, _ = rec_io.read_answers(out / "answers.jsonl")
    assert {r["method"] for r in recs} == {"ar", "sd:gamma=3:draft_vocab=64", "sd:gamma=3"}
    assert all(r["lossless"] for r in recs if r["method"] != "ar")
    assert list((tmp_path / "home" / "draft-vocab").glob("*-64-sharegpt.json"))
    capsys.readouterr()


def test_auto_reduces_only_large_vocabularies_and_falls_back(close, capsys, monkeypatch):
    from types import SimpleNamespace

    import pacer.draftvocab as dv

    assert dv.auto_size(close) == 0 and close.draft_rows("auto") is None  # 259 tokens: nothing to gain
    big = SimpleNamespace(draft_info=SimpleNamespace(vocab_size=151936, backend="transformers"), tokenizer=object())
    assert dv.auto_size(big) == dv.AUTO_SIZE
    big.draft_info.backend = "llamacpp"  # llama.cpp computes the whole head (its record): nothing to reduce
    assert dv.auto_size(big) == 0
    # auto with a corpus that cannot be read: the full vocabulary, and a note says why
    monkeypatch.setattr(dv, "auto_size", lambda dec: 64)

    def missing(conversations=0):
        raise PacerError("the ShareGPT data is not installed; run `bash scripts/setup.sh`")

    monkeypatch.setattr(dv, "sharegpt_texts", missing)
    from pacer import Decoder

    dec = Decoder(close.target_info, close.draft_info, threads=1)
    assert dec.draft_vocab == "auto" and dec.make_drafter("sd").backend.rows is None
    assert "drafting from the full vocabulary (the ShareGPT data is not installed" in capsys.readouterr().err
    with pytest.raises(PacerError, match="not installed"):  # asked for explicitly: an error
        dec.draft_rows(64)


def test_cli_draft_vocab_values(capsys):
    from pacer.cli import main
    from pacer.pair import parse_draft_vocab as parse

    assert parse("auto") == "auto" and parse("0") == 0 and parse("32768") == 32768
    assert main(["generate", "hi", "--draft-vocab", "lots"]) == 2
    assert "--draft-vocab must be auto or a number of tokens" in capsys.readouterr().err


class WordIds:
    """A tokenizer stand-in whose texts are their token ids, space-separated."""

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [[int(w) for w in t.split()] for t in texts]}


def test_frequent_ids_break_ties_by_the_lower_id():
    """Ties at the cut keep the lower ids, whatever order the corpus first shows them in."""
    texts = ["9 7 5 3 3", "8 3 6"]  # 3 three times; 9, 8, 7, 6, 5 once each, the higher ones seen first
    assert frequent_ids(WordIds(), 3, texts) == [3, 5, 6]
    assert frequent_ids(WordIds(), 3, texts, always=[1]) == [1, 3, 5]
    assert frequent_ids(WordIds(), 8, texts, vocab=12) == [0, 1, 3, 5, 6, 7, 8, 9]  # filled up from the lowest


def test_a_cached_draft_vocabulary_of_the_wrong_size_is_counted_again(close, tmp_path, monkeypatch):
    import pacer.draftvocab as dv
    from pacer.cache import checksum

    monkeypatch.setattr(dv, "sharegpt_texts", lambda conversations=0: ["hello there, general kenobi"] * 4)
    rows = load_or_build(close, 40, home=tmp_path)
    (path,) = (tmp_path / "draft-vocab").glob("*.json")
    doc = json.loads(path.read_text())
    old = doc["payload"]["ids"]
    for ids in (old[:-1], old + [old[-1] + 1], []):  # with a valid checksum: refused for its size, not its hash
        path.write_text(json.dumps({**doc, "payload": {"ids": ids}, "sha256": checksum({"ids": ids})}))
        again = load_or_build(close, 40, home=tmp_path)
        assert torch.equal(again, rows) and json.loads(path.read_text())["payload"]["ids"] == rows.tolist()


def test_backends_on_the_same_rows_share_one_restricted_head(close):
    """A drafter's backend lives for one generation: its restricted head is gathered once per (head, rows) and
    shared by the next backends (read-only), another row set gets its own, a replaced head weight its own."""
    from pacer.backends.transformers import TransformersBackend as Backend

    model = close.draft_info.model
    rows = torch.tensor(HALF)
    a, b = Backend(model, rows), Backend(model, rows)
    assert a._w is b._w and torch.equal(a._w, model.get_output_embeddings().weight.detach()[rows])
    c = Backend(model, torch.tensor(HALF[:-1]))
    assert c._w is not a._w and c._w.shape[0] == len(HALF) - 1
    head = model.get_output_embeddings()
    old = head.weight
    head.weight = torch.nn.Parameter(old.detach() * 2, requires_grad=False)
    try:
        d = Backend(model, rows)
        assert torch.equal(d._w, head.weight.detach()[rows])
    finally:
        head.weight = old
    assert torch.equal(Backend(model, rows)._w, old.detach()[rows])

"""The llama.cpp backend: tiny random models written as GGUF files in the test (no download) run every method with
llama.cpp's own kernels, and the output is llama.cpp's own plain greedy decoding of the same file, token for token.

What is checked: the GGUF writer and the backend compute what transformers computes for the same weights (float32,
so the logits agree closely); ``ar`` on this backend is llama-cpp-python's own greedy generation; every drafting
method equals ``ar``; the KV cache holds exactly the committed tokens after every round (sequence removal, no
re-evaluation); a token tree scores each branch as the chain it stands for; settings this backend cannot take are
one-line errors before any model loads."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import FLAT
from pacer import Decoder
from pacer.backends.llamacpp import GgufModel, LlamaCppBackend, LlamaModel, lib
from pacer.decoding import Tree
from pacer.errors import PacerError
from pacer.tiny import save_tiny_gguf, tiny_pair, tiny_tokenizer

PROMPTS = ["hello world, this is", "def f(x):\n    return", "The 3 quick brown foxes"]
DRAFTING = ["sd", "heuristic", "confidence", "entropy", "oracle", "ouroboros", "lookup"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The tiny ``close`` pair as two GGUF files (float32 tensors), plus the transformers pair they came from."""
    folder = tmp_path_factory.mktemp("gguf")
    t, d = tiny_pair("close")
    return (save_tiny_gguf(t.model, t.tokenizer, folder / "target.gguf"),
            save_tiny_gguf(d.model, d.tokenizer, folder / "draft.gguf"), (t, d))


def gguf(path, name: str) -> GgufModel:
    return GgufModel(LlamaModel(path), tiny_tokenizer(), name, name, torch.float32, extra={"file_type": "ALL_F32"})


@pytest.fixture(scope="module")
def dec(files):
    return Decoder(gguf(files[0], "t"), gguf(files[1], "d"), threads=1, costs=FLAT)


def test_gguf_forward_matches_transformers(files, dec):
    """Same weights, same logits: the GGUF writer's tensor names, llama.cpp's rotary embedding and the backend's
    positions are right (float32 weights on both sides; llama.cpp keeps its KV cache in float16: the tolerance)."""
    t, _ = files[2]
    ids = dec.encode(PROMPTS[1])
    ref = t.model(torch.tensor([ids])).logits[0]
    be = dec.target
    be.reset()
    got, _ = be.forward(ids)
    assert got.shape == ref.shape
    assert torch.allclose(got, ref, atol=5e-2, rtol=1e-3), (got - ref).abs().max()  # f16 KV cache
    assert torch.equal(got.argmax(-1), ref.argmax(-1))


def test_ar_is_llama_cpps_own_greedy_decoding(files, dec):
    """pacer's plain decoding on this backend is what llama-cpp-python's own generation loop emits (greedy)."""
    from llama_cpp import Llama

    llm = Llama(str(files[0]), n_ctx=256, n_threads=1, verbose=False)
    for prompt in PROMPTS:
        ids = dec.encode(prompt)
        ar = dec.generate(ids, "ar", max_new_tokens=30).token_ids
        own = []
        for tok in llm.generate(ids, temp=0.0, reset=True):
            own.append(int(tok))
            if len(own) == len(ar) or tok in dec.eos:
                break
        assert own == ar, prompt


@pytest.mark.parametrize("method", DRAFTING)
def test_every_method_equals_plain_decoding(dec, method):
    for prompt in PROMPTS:
        ids = dec.encode(prompt)
        ar = dec.generate(ids, "ar", max_new_tokens=33)
        for gamma in (None, 1, 3, 8):
            res = dec.generate(ids, method, max_new_tokens=33, gamma=gamma)
            assert res.token_ids == ar.token_ids, (method, prompt, gamma)
            assert res.stats.new_tokens == len(ar.token_ids)


def test_cache_holds_exactly_the_committed_tokens_after_every_round(dec, monkeypatch):
    """After every roll-back the target's and the draft's llama.cpp caches end at the committed length: sequence
    0's highest position is ``length - 1`` and nothing lies beyond it (branch sequences dropped too)."""
    ll = lib()
    checked = []
    crop = LlamaCppBackend.crop

    def checked_crop(self, length):
        crop(self, length)
        mem = self._mem
        assert ll.llama_memory_seq_pos_max(mem, 0) == self.length - 1
        for s in range(1, 9):
            assert ll.llama_memory_seq_pos_max(mem, s) == -1  # no branch left behind
        checked.append(self.length)

    monkeypatch.setattr(LlamaCppBackend, "crop", checked_crop)
    for method in ("sd", "ouroboros"):
        ids = dec.encode(PROMPTS[0])
        ar = dec.generate(ids, "ar", max_new_tokens=40)
        assert dec.generate(ids, method, max_new_tokens=40, gamma=5).token_ids == ar.token_ids
    assert len(checked) > 10


def test_crop_then_refeed_equals_scoring_from_scratch(dec):
    be = dec.target
    be.reset()
    ids = dec.encode(PROMPTS[2])
    be.forward(ids[:12])
    be.crop(7)
    assert be.length == 7
    got, _ = be.forward(ids[7:10])
    ref = be.score(ids[:10])[7:]
    assert torch.allclose(got, ref, atol=1e-4)
    assert be.length == 10


def test_tree_scores_each_branch_as_its_chain(dec):
    """A chain with two branches after it, scored in one llama.cpp batch through per-token sequence ids: every
    row equals scoring that token's own path as a plain sequence."""
    be = dec.target
    ids = dec.encode(PROMPTS[0])
    prefix, chain, b1, b2 = ids[:5], ids[5:8], [40, 41, 42], [50, 51]
    be.reset()
    be.forward(prefix)
    n = len(chain) + len(b1) + len(b2)
    attend = torch.zeros(n, n, dtype=torch.bool)
    attend[:, :3] = True
    attend[:3, :3] = torch.ones(3, 3, dtype=torch.bool).tril()
    attend[3:6, 3:6] = torch.ones(3, 3, dtype=torch.bool).tril()
    attend[6:, 6:] = torch.ones(2, 2, dtype=torch.bool).tril()
    tree = Tree(attend, (0, 1, 2, 3, 4, 5, 3, 4))
    got, _ = be.forward(chain + b1 + b2, tree=tree)
    assert be.length == len(prefix) + len(chain)  # the branches are not kept
    ref1 = be.score(prefix + chain + b1)
    ref2 = be.score(prefix + chain + b2)
    assert torch.allclose(got[:6], ref1[5:], atol=1e-4)
    assert torch.allclose(got[6:], ref2[8:], atol=1e-4)


def test_hidden_states_are_the_final_normed_layer(files, dec):
    t, d = files[2]
    be = dec.draft_backend()
    ids = dec.encode(PROMPTS[0])
    _, hs = be.forward(ids, hidden=True, keep=1)
    assert be.hidden_layers == (-1,) and len(hs) == 1
    ref = d.model(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]
    assert torch.allclose(hs[0], ref, atol=2e-2)  # llama.cpp's float16 KV cache


def test_sampling_runs_and_is_seeded(dec):
    from pacer.sampling import SamplingConfig

    s = SamplingConfig(temperature=0.8, seed=3)
    a = dec.generate(PROMPTS[0], "sd", max_new_tokens=20, sampling=s)
    b = dec.generate(PROMPTS[0], "sd", max_new_tokens=20, sampling=s)
    assert a.token_ids == b.token_ids and (len(a.token_ids) == 20 or a.stats.finish_reason == "eos")
    assert a.stats.draft_tokens > 0


def test_block_verification_runs_on_llamacpp(dec):
    """Block verification through the same loop on llama.cpp's kernels: seeded draws reproducible, other draws than
    token-level's of the same seed, drafts accepted; greedy output unchanged (exact matching), block refused there."""
    from pacer.sampling import SamplingConfig

    runs = {v: [dec.generate(PROMPTS[0], "sd", max_new_tokens=24, gamma=4,
                             sampling=SamplingConfig(1.0, seed=s, verify=v)) for s in (3, 3, 4, 5)]
            for v in ("token", "block")}
    a, b, *_ = runs["block"]
    assert a.token_ids == b.token_ids and a.stats.accepted_tokens > 0
    assert [r.token_ids for r in runs["block"]] != [r.token_ids for r in runs["token"]]
    ar = dec.generate(PROMPTS[1], "ar", max_new_tokens=20).token_ids
    assert dec.generate(PROMPTS[1], "sd", max_new_tokens=20, sampling=SamplingConfig(verify="token")).token_ids == ar
    with pytest.raises(PacerError, match="needs sampling"):
        dec.generate(PROMPTS[1], "sd", max_new_tokens=20, sampling=SamplingConfig(verify="block"))


def test_reduced_draft_vocabulary_is_refused(dec):
    with pytest.raises(PacerError, match="whole vocabulary"):
        dec.generate(PROMPTS[0], "sd", max_new_tokens=4, options={"draft_vocab": 64})


def test_transformers_checkpoint_is_refused_on_llamacpp(dec):
    with pytest.raises(PacerError, match="llamacpp"):
        dec.generate(PROMPTS[0], "pacer", max_new_tokens=4, options={"path": "src/pacer/checkpoints/pacer-default"})


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "pacer", *args], capture_output=True, text=True, timeout=300)


def test_cli_bad_settings_are_one_line_errors_before_loading(tmp_path):
    (tmp_path / "folder").mkdir()
    for extra, words in (
        (["--target", str(tmp_path / "folder")], "runs GGUF files"),
        (["--quantize", "int8"], "transformers backend"),
        (["--draft-vocab", "1000"], "whole vocabulary"),
    ):
        r = run_cli("generate", "hi", "--backend", "llamacpp", *extra)
        assert r.returncode == 2, r.stderr
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and words in lines[0], r.stderr


def test_cli_generate_on_gguf_files(files, tmp_path, monkeypatch):
    """``pacer generate --backend llamacpp`` on two GGUF files; their tokenizer comes from pacer's verified cache
    (transformers cannot rebuild the tiny byte-level tokenizer from a GGUF, so the test seeds the cache)."""
    from pacer.cache import Manifest, file_sha256

    home = tmp_path / "home"
    monkeypatch.setenv("PACER_HOME", str(home))
    for f in files[:2]:
        folder = home / "tokenizers" / file_sha256(f, home)[:24]
        tiny_tokenizer().save_pretrained(folder)
        Manifest(folder).write()
    r = run_cli("generate", "hello", "--backend", "llamacpp", "--target", str(files[0]), "--draft", str(files[1]),
                "--method", "sd", "--gamma", "3", "--max-new-tokens", "12", "--threads", "1", "--json")
    assert r.returncode == 0, r.stderr
    import json

    out = json.loads(r.stdout)
    assert out["stats"]["new_tokens"] == 12


def test_auto_backend_picks_llamacpp_for_gguf_pairs_only(files, tmp_path):
    from pacer.backends import resolve

    t, d = str(files[0]), str(files[1])
    assert resolve("auto", ["default-target", "default-draft"]) == "llamacpp"
    assert resolve("auto", [t, d]) == "llamacpp"
    assert resolve("auto", [t, None]) == "llamacpp"
    assert resolve("auto", [str(tmp_path), d]) == "transformers"  # a model folder
    assert resolve("auto", [t, d], quantize="int8") == "transformers"
    assert resolve("auto", [t, d], draft_vocab=1000) == "transformers"
    assert resolve("auto", [t, d], device="cuda") == "transformers"  # llama.cpp runs on the CPU in this build
    assert resolve("transformers", [t, d]) == "transformers"


def test_a_build_with_llamas_amx_kernels_is_refused_before_it_crashes(files, monkeypatch, capsys):
    """llama.cpp 0.3.36's AMX kernels die with an illegal instruction (no Python error, no message) on an AMX
    Xeon: a build that reports them is not used - ``auto`` takes PyTorch and says why, ``--backend llamacpp`` is a
    one-line error (exit 2) before any model loads - unless PACER_LLAMA_AMX=1 says it is known to work."""
    from pacer import backends
    from pacer.backends import llamacpp

    amx = b"CPU : AVX2 = 1 | AVX512 = 1 | AVX512_BF16 = 1 | AMX_INT8 = 1 | LLAMAFILE = 1 | "
    monkeypatch.delenv(llamacpp.LLAMA_AMX_ENV, raising=False)
    assert "AMX kernels" in llamacpp.llama_amx_problem(amx)
    assert llamacpp.llama_amx_problem(amx.replace(b"AMX_INT8 = 1 | ", b"")) is None
    monkeypatch.setattr(llamacpp, "llama_amx_problem", lambda info=None: "built with llama.cpp's AMX kernels")
    t, d = str(files[0]), str(files[1])
    assert backends.resolve("auto", [t, d]) == "transformers"
    assert "AMX" in backends.reason("transformers")
    with pytest.raises(PacerError, match="AMX kernels"):
        backends.check("llamacpp", t, d)
    monkeypatch.undo()
    monkeypatch.setenv(llamacpp.LLAMA_AMX_ENV, "1")
    assert llamacpp.llama_amx_problem(amx) is None
    env = {**os.environ, llamacpp.LLAMA_AMX_ENV: "0"}
    bad = ("import sys, pacer.backends.llamacpp as m; "
           "m.llama_amx_problem = lambda info=None: 'built with AMX kernels'; "
           "from pacer.cli import main; sys.exit(main())")
    r = subprocess.run([sys.executable, "-c", bad, "generate", "hi", "--backend", "llamacpp", "--target", t,
                        "--draft", d], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 2 and "AMX kernels" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_near_tie_counts_the_backends_block_noise(dec):
    """llama.cpp's quantized kernels score a token differently inside a block of 4 or more: the diagnosis measures
    that noise with a cache of its own and counts a gap within twice it as a near-tie, nothing wider."""
    from pacer.decoding import Divergence

    be = dec.target
    ids = dec.encode(PROMPTS[2])
    be.reset()
    be.forward(ids[:5])
    noise = be.block_noise(ids)
    assert be.length == 5  # the backend's own cache is untouched
    assert 0.0 <= noise < 0.1  # float32 tensors: the kernels agree closely
    assert Divergence(3, 1, 2, 0.3, 0.3, 1e-6, noise=0.2).near_tie
    assert not Divergence(3, 1, 2, 0.5, 0.5, 1e-6, noise=0.2).near_tie
    assert not Divergence(3, 1, 2, 0.3, 0.3, 1e-6).near_tie  # transformers: the dtype's steps decide


def chain_tree(chain: int, branches: list[int]) -> Tree:
    """The tree of a chain of ``chain`` tokens followed by branches of the given lengths (each sees the chain)."""
    n = chain + sum(branches)
    attend = torch.zeros(n, n, dtype=torch.bool)
    attend[:, :chain] = True
    attend[:chain, :chain] = torch.ones(chain, chain, dtype=torch.bool).tril()
    depth, o = list(range(chain)), chain
    for k in branches:
        attend[o : o + k, o : o + k] = torch.ones(k, k, dtype=torch.bool).tril()
        depth += range(chain, chain + k)
        o += k
    return Tree(attend, tuple(depth))


def test_the_most_branches_over_two_rounds_leave_nothing_behind(dec):
    """Two rounds of a chain with MAX_BRANCHES (8) branches: every branch row equals scoring its own path, and
    after each round no branch sequence holds a cell (the 8th included), so the next round's branches see only
    the committed text."""
    from pacer.backends.llamacpp import MAX_BRANCHES

    ll = lib()
    be = dec.target
    ctx = dec.encode(PROMPTS[0])[:5]
    be.reset()
    be.forward(ctx)
    for rnd in range(2):
        chain = [30 + rnd, 31 + rnd, 32 + rnd]
        branches = [[40 + 10 * rnd + b, 100 + b, 150 + b] for b in range(MAX_BRANCHES)]
        got, _ = be.forward(chain + sum(branches, []), tree=chain_tree(3, [3] * MAX_BRANCHES))
        assert be.length == len(ctx) + 3
        for s in range(1, 1 + MAX_BRANCHES):
            assert ll.llama_memory_seq_pos_max(be._mem, s) == -1, f"branch sequence {s} left behind"
        ref = be.score(ctx + chain)
        assert torch.allclose(got[:3], ref[len(ctx):], atol=1e-4)
        for b, branch in enumerate(branches):
            ref = be.score(ctx + chain + branch)[len(ctx) + 3 :]
            assert torch.allclose(got[3 + 3 * b : 6 + 3 * b], ref, atol=1e-4), (rnd, b)
        ctx += chain


def test_a_forward_over_several_batches_reads_each_batchs_own_rows(files, monkeypatch):
    """A forward longer than llama.cpp's batch is fed in batches; every row read (logits and hidden states) is
    the row of its own batch: the same as one batch, and a 600-token prompt (two batches of 512) the same as two
    forwards of 300."""
    import pacer.backends.llamacpp as lb

    model = LlamaModel(files[0])
    ids = [(7 * i + 3) % 250 + 3 for i in range(40)]
    one = LlamaCppBackend(model)
    ref, ref_h = one.forward(ids, hidden=True)
    monkeypatch.setattr(lb, "N_BATCH", 16)  # 40 tokens: batches of 16, 16 and 8
    small = LlamaCppBackend(model)
    got, got_h = small.forward(ids, hidden=True)
    assert torch.allclose(got, ref, atol=1e-3) and torch.allclose(got_h[0], ref_h[0], atol=1e-3)
    last, _ = LlamaCppBackend(model).forward(ids, keep=5)  # the kept rows lie in the last batch
    assert torch.allclose(last, ref[-5:], atol=1e-3)
    monkeypatch.undo()
    long = [(11 * i + 5) % 250 + 3 for i in range(600)]
    whole, _ = LlamaCppBackend(model, context=1024).forward(long)
    halves = LlamaCppBackend(model, context=1024)
    split = torch.cat([halves.forward(long[:300])[0], halves.forward(long[300:])[0]])
    assert whole.shape == (600, model.n_vocab) and torch.allclose(whole, split, atol=1e-3)


def test_forward_view_reads_llamas_own_buffer_where_it_can(files, monkeypatch):
    """``forward_view`` gives the rows ``forward`` copies: a view of llama.cpp's output buffer where the kept rows
    are the last batch's (no copy: the next decode writes into it), a copy where they span batches or a tree's
    rows; and the loop reads it only before the next forward (every method still equals ``ar``: above)."""
    import ctypes

    import pacer.backends.llamacpp as lb

    def in_llama(t: torch.Tensor, b: LlamaCppBackend, batch_row: int) -> bool:
        at = ctypes.cast(b._lib.llama_get_logits_ith(b._ctx, batch_row), ctypes.c_void_p).value
        return t.data_ptr() == at

    model = LlamaModel(files[0])
    ids = [(7 * i + 3) % 250 + 3 for i in range(40)]
    ref, _ = LlamaCppBackend(model).forward(ids)
    b = LlamaCppBackend(model)
    got, _ = b.forward_view(ids, keep=6)
    assert torch.allclose(got, ref[-6:], atol=1e-3) and in_llama(got, b, 34)  # llama.cpp's memory, no copy
    copied, _ = LlamaCppBackend(model).forward(ids, keep=6)
    assert torch.equal(copied, got)
    kept = got.clone()
    b.forward_view([5], keep=1)  # the next decode writes where the view points
    assert not torch.equal(got, kept)
    monkeypatch.setattr(lb, "N_BATCH", 16)  # 40 tokens: batches of 16, 16 and 8; 12 rows span two of them
    b = LlamaCppBackend(model)
    spans, _ = b.forward_view(ids, keep=12)
    assert not in_llama(spans, b, 7) and torch.allclose(spans, ref[-12:], atol=1e-3)
    b = LlamaCppBackend(model)
    tail, _ = b.forward_view(ids, keep=8)
    assert in_llama(tail, b, 0) and torch.allclose(tail, ref[-8:], atol=1e-3)


def test_scoring_fewer_tokens_than_branch_sequences(dec):
    """A context of fewer cells than its sequences (1 + MAX_BRANCHES) aborted the process inside llama.cpp; a short
    text is scored like any other."""
    be = dec.target
    ids = dec.encode(PROMPTS[1])
    be.reset()
    full, _ = be.forward(ids[:8])
    for n in (1, 3, 8):
        assert torch.allclose(be.score(ids[:n]), full[:n], atol=1e-4)


def test_a_drafters_context_is_reused_by_the_next_generation(dec, monkeypatch):
    """A drafter's llama.cpp backend lives for one generation; its context (KV cache cleared) serves the next one
    instead of a new context per request, and the outputs stay the target's."""
    made = []
    real = LlamaModel.new_context
    monkeypatch.setattr(LlamaModel, "new_context", lambda self, *a, **k: made.append(a) or real(self, *a, **k))
    runs = [dec.generate(p, "sd", max_new_tokens=12, gamma=3).token_ids for p in PROMPTS * 2]
    assert len(made) <= 1, made  # the first generation may create the draft's context, no other does
    ar = [dec.generate(p, "ar", max_new_tokens=12).token_ids for p in PROMPTS]
    assert runs[:3] == runs[3:] == ar


def _seed_tokenizers(home, *paths) -> None:
    """Put the tiny tokenizer in pacer's verified cache for these GGUF files (transformers cannot rebuild it from
    a tiny GGUF)."""
    from pacer.cache import Manifest, file_sha256

    for f in paths:
        folder = home / "tokenizers" / file_sha256(f, home)[:24]
        tiny_tokenizer().save_pretrained(folder)
        Manifest(folder).write()


def test_draft_quant_auto_keys_its_copy_by_content_skips_a_q4_0_draft_and_survives_a_full_disk(
        files, tmp_path, monkeypatch, capsys):
    """The Q4_0 copy's folder is keyed by the draft's sha256, not its file name (another draft of the same name
    gets its own copy); a draft already Q4_0 is run as it is (never re-encoded); llama.cpp failing to write the copy
    (a full disk) is a note and the draft as it is, with nothing half-written left, as a read-only home is."""
    from pacer import timing
    from pacer.backends import llamacpp as lc

    home = tmp_path / "home"
    monkeypatch.setenv("PACER_HOME", str(home))
    monkeypatch.setattr(timing, "timed", lambda cm, tokens, base, keep=1, tree=None:
                        {"Q4_0": 0.5}.get(lc._file_type(cm.llama), 1.0))
    made = []
    requantize = lc.requantize
    monkeypatch.setattr(lc, "requantize", lambda *a: (made.append(a[0]), requantize(*a)))
    other = tmp_path / "other" / "draft.gguf"  # the same file name, other weights
    other.parent.mkdir()
    t, _ = files[2]
    from pacer.tiny import save_tiny_gguf

    save_tiny_gguf(tiny_pair("random")[1].model, t.tokenizer, other)
    _seed_tokenizers(home, files[0], files[1], other)

    def load(draft) -> Decoder:
        return Decoder.from_pretrained(str(files[0]), str(draft), backend="llamacpp", threads=1, draft_quant="auto",
                                       progress=False)

    copies = {Path(load(d).draft_info.extra["path"]) for d in (files[1], other)}
    assert len(copies) == 2 and made == [files[1], other]  # two drafts named draft.gguf: two copies
    from pacer.cache import sha256_file

    assert {sha256_file(d)[:16] for d in (files[1], other)} == {c.parent.name.split("-")[1] for c in copies}

    q4 = tmp_path / "q4" / "draft-q4.gguf"  # a draft shipped as Q4_0 already
    q4.parent.mkdir()
    requantize(files[1], q4, "Q4_0")
    _seed_tokenizers(home, q4)
    made.clear()
    d = load(q4).draft_info
    assert d.weights == "gguf:Q4_0" and d.extra["path"] == str(q4) and made == []

    def full_disk(src, out, file_type):  # what llama.cpp reports when its write fails
        out.write_bytes(b"half")
        raise PacerError(f"llama.cpp cannot re-encode {src} as {file_type} (No space left on device); pass "
                         f"--draft-quant none")

    monkeypatch.setattr(lc, "requantize", full_disk)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)  # another key: not chosen yet
    for c in copies:
        shutil.rmtree(c.parent)
    capsys.readouterr()
    d = load(files[1]).draft_info
    assert d.weights == "gguf:ALL_F32" and d.extra["path"] == str(files[1])
    assert "cannot be made" in capsys.readouterr().err
    assert not any(p.name.endswith(".tmp") or p.suffix == ".gguf" for p in (home / "gguf").rglob("*"))


def test_draft_quant_auto_runs_a_verified_q4_0_copy_where_it_times_faster(files, tmp_path, monkeypatch, capsys):
    """``--draft-quant auto`` on llama.cpp: the draft's GGUF re-encoded as Q4_0 once, under ``$PACER_HOME`` with a
    manifest (checked before every use; a damaged copy is made again, an interrupted one leaves nothing), timed
    against the draft as loaded once per key (the choice is kept: no re-timing, no rebuild), run where it is
    faster and never where it is not; ``none`` keeps the file as it is; the output stays plain decoding's."""
    from pacer import timing
    from pacer.backends import llamacpp as lc
    from pacer.cache import Manifest

    home = tmp_path / "home"
    monkeypatch.setenv("PACER_HOME", str(home))
    _seed_tokenizers(home, *files[:2])
    made, timed = [], []
    requantize = lc.requantize
    monkeypatch.setattr(lc, "requantize", lambda *a: (made.append(a[2]), requantize(*a)))
    speed = {"Q4_0": 0.5, "ALL_F32": 1.0}  # the copy twice as fast

    def fake_timed(cm, tokens, base, keep=1, tree=None):
        timed.append(1)
        return speed[lc._file_type(cm.llama)]

    monkeypatch.setattr(timing, "timed", fake_timed)

    def load(quant: str) -> Decoder:
        return Decoder.from_pretrained(str(files[0]), str(files[1]), backend="llamacpp", threads=1,
                                       draft_quant=quant, progress=False)

    dec = load("auto")
    d = dec.draft_info
    assert d.weights == "gguf:Q4_0" and d.extra["converted_from"] == "ALL_F32" and made == ["Q4_0"] and timed
    copy = Path(d.extra["path"])
    assert copy.parent.parent == home / "gguf" and Manifest(copy.parent).check() is None
    assert d.fingerprint == load("none").draft_info.fingerprint  # the same draft, another encoding
    ids = dec.encode(PROMPTS[0])
    ar = dec.generate(ids, "ar", max_new_tokens=24).token_ids
    assert dec.generate(ids, "sd", max_new_tokens=24, gamma=4).token_ids == ar

    n = len(timed)
    assert load("auto").draft_info.extra["path"] == str(copy) and len(timed) == n and made == ["Q4_0"]  # kept
    none = load("none").draft_info
    assert none.weights == "gguf:ALL_F32" and none.extra["path"] == str(files[1])

    with open(copy, "r+b") as f:  # damaged on disk: made again before it is trusted
        f.seek(copy.stat().st_size // 2)
        f.write(b"\xff" * 64)
    capsys.readouterr()
    assert load("auto").draft_info.weights == "gguf:Q4_0" and made == ["Q4_0", "Q4_0"] and len(timed) == n
    assert "cannot be trusted" in capsys.readouterr().err and Manifest(copy.parent).check() is None

    monkeypatch.setattr(lc, "requantize", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    shutil.rmtree(copy.parent)
    with pytest.raises(KeyboardInterrupt):  # interrupted while writing: nothing half-written is left
        load("auto")
    assert not copy.parent.exists() and not list((home / "gguf").glob(".*.tmp"))

    speed["Q4_0"] = 0.95  # another key (threads), where the copy is not faster enough: the file as it is
    monkeypatch.setattr(lc, "requantize", requantize)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert load("auto").draft_info.weights == "gguf:ALL_F32" and len(timed) > n
    n = len(timed)
    assert load("auto").draft_info.weights == "gguf:ALL_F32" and len(timed) == n  # the choice is kept

    def read_only(folder, fill):
        raise PermissionError(13, "Permission denied", str(folder))

    shutil.rmtree(copy.parent)  # a home that cannot be written: a note, and the file as it is (the copy saves time)
    monkeypatch.setattr(lc, "write_folder", read_only)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    capsys.readouterr()
    assert load("auto").draft_info.weights == "gguf:ALL_F32"
    assert "cannot be written (Permission denied)" in capsys.readouterr().err

"""llama-cpp-python's own prompt lookup as a peer in ``pacer bench`` (:mod:`pacer.bench.peer`): parsed from
``--methods``, run on the tiny GGUF target through the bench's runner, its output compared with plain decoding's."""

from __future__ import annotations

import pytest
import torch

from pacer.bench import data
from pacer.bench.methods import parse_methods
from pacer.bench.peer import PEER
from pacer.errors import PacerError


def test_the_peer_is_a_method_spec():
    specs = parse_methods(f"{PEER}:num_pred_tokens=2,{PEER}:num_pred_tokens=10,{PEER}")
    assert [s.label for s in specs] == ["ar", f"{PEER}:num_pred_tokens=2", f"{PEER}:num_pred_tokens=10", PEER]
    assert all(s.greedy_only and not s.is_ar and not s.is_anchor for s in specs[1:])
    assert specs[1].opts == {"num_pred_tokens": 2}
    for bad, says in ((f"{PEER}:num_pred_tokens=0", "num_pred_tokens must be an integer in 1..64"),
                      (f"{PEER}:num_pred_tokens=x", "num_pred_tokens must be an integer"),
                      (f"{PEER}:gamma=3", f"{PEER} takes num_pred_tokens only, not 'gamma'"),
                      (f"{PEER}:verify=block", "verifies no draft")):
        with pytest.raises(PacerError, match=says):
            parse_methods(bad)


QUESTIONS = [data.Question("t", "1", "code", ("def f(x):\n    return f(x) + f(x) + f(",), chat=False),
             data.Question("t", "2", "text", ("hello world, this is hello world, this is",), chat=False)]


@pytest.fixture(scope="module")
def gguf_pair(tmp_path_factory):
    pytest.importorskip("llama_cpp")
    from conftest import FLAT
    from pacer import Decoder
    from pacer.backends.llamacpp import GgufModel, LlamaModel
    from pacer.tiny import save_tiny_gguf, tiny_pair, tiny_tokenizer

    folder = tmp_path_factory.mktemp("peer")
    t, d = tiny_pair("close")
    paths = (save_tiny_gguf(t.model, t.tokenizer, folder / "target.gguf"),
             save_tiny_gguf(d.model, d.tokenizer, folder / "draft.gguf"))
    models = [GgufModel(LlamaModel(p), tiny_tokenizer(), n, n, torch.float32, extra={"file_type": "ALL_F32",
                                                                                      "path": str(p)})
              for p, n in zip(paths, ("t", "d"), strict=True)]
    return Decoder(*models, threads=1, costs=FLAT)


def test_the_peer_runs_through_the_bench_and_is_checked_against_plain_decoding(gguf_pair, tmp_path):
    from pacer.bench.peer import LlamaLookupPeer, gguf_path
    from pacer.bench.report import write_report
    from pacer.bench.runner import Bench

    dec = gguf_pair
    specs = parse_methods(f"ar,{PEER}:num_pred_tokens=2,{PEER}:num_pred_tokens=10")
    peer = LlamaLookupPeer(dec, gguf_path(dec), 1, dec.target.context)
    bench = Bench(dec, specs, QUESTIONS, tmp_path, 24, progress=False, decoders={s.label: peer for s in specs[1:]})
    bench.run()
    ar = {r["question_id"]: r for r in bench.records if r["method"] == "ar"}
    peers = [r for r in bench.records if r["method"].startswith(PEER)]
    assert len(peers) == 4 and bench.flagged == 0
    for r in peers:
        ids = r["choices"][0]["token_ids"][0]
        assert r["lossless"] is True and ids == ar[r["question_id"]]["choices"][0]["token_ids"][0]
        assert len(ids) == 24 or ids[-1] in dec.eos
    summary = write_report(tmp_path, bench.records, [s.label for s in specs], {})
    for s in specs[1:]:
        row = summary["groups"]["overall"][s.label]
        assert row["lossless_checked"] == row["lossless_identical"] == 2 and row["speedup"] > 0


def test_every_peer_generation_reads_its_whole_prompt(gguf_pair):
    """llama-cpp-python keeps the cache of the last prompt and reuses its prefix: the peer must not, or its second
    run of a question (another num_pred_tokens, another repeat) would skip the prefill every method pays."""
    from pacer.bench.peer import LlamaLookupPeer, gguf_path

    dec = gguf_pair
    peer = LlamaLookupPeer(dec, gguf_path(dec), 1, dec.target.context)
    read: list[int] = []
    real = peer.llm.eval
    peer.llm.eval = lambda tokens: (read.append(len(tokens)), real(tokens))[1]
    ids = dec.encode(QUESTIONS[1].turns[0])
    for k in (2, 10, 2):
        read.clear()
        peer.generate(ids, 8, k)
        assert read and read[0] >= len(ids), (k, read)


def test_a_prompt_longer_than_one_batch_runs(gguf_pair, monkeypatch):
    """A prompt over llama.cpp's batch (512 tokens in the bench: a summary's article) is read in several batches;
    with a draft model llama-cpp-python keeps every row's logits, and the peer must size that store for the whole
    context (it failed to broadcast past the first batch). The tiny target is given a batch of 4 tokens."""
    from pacer.backends import llamacpp
    from pacer.bench.peer import LlamaLookupPeer, gguf_path

    dec = gguf_pair
    ids = dec.encode(QUESTIONS[1].turns[0])
    want, _, _ = LlamaLookupPeer(dec, gguf_path(dec), 1, dec.target.context).generate(ids, 8, 2)
    monkeypatch.setattr(llamacpp, "N_BATCH", 4)
    assert len(ids) > 3 * llamacpp.N_BATCH
    got, _, _ = LlamaLookupPeer(dec, gguf_path(dec), 1, dec.target.context).generate(ids, 8, 2)
    assert got == want and got


def test_pacer_bench_runs_the_peer_on_a_gguf_target(gguf_pair, tmp_path, monkeypatch, capsys):
    """``pacer bench --backend llamacpp`` with the peer in --methods: it runs beside ar on the run's GGUF target and
    is checked against it (the tiny pair's tokenizer comes from pacer's verified cache, seeded here)."""
    import json
    from pathlib import Path

    from pacer.cache import Manifest, file_sha256
    from pacer.cli import main
    from pacer.tiny import tiny_tokenizer

    home = tmp_path / "home"
    monkeypatch.setenv("PACER_HOME", str(home))
    paths = [gguf_pair.target_info.extra["path"], gguf_pair.draft_info.extra["path"]]
    for f in paths:
        folder = home / "tokenizers" / file_sha256(Path(f), home)[:24]
        tiny_tokenizer().save_pretrained(folder)
        Manifest(folder).write()
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question_id": "1", "category": "code", "turns": [QUESTIONS[0].turns[0]]})
                         + "\n")
    out = tmp_path / "run"
    rc = main(["bench", "--backend", "llamacpp", "--target", paths[0], "--draft", paths[1], "--questions",
               str(questions), "--max-new-tokens", "8", "--threads", "1", "--no-progress", "--out", str(out),
               "--methods", f"ar,{PEER}:num_pred_tokens=2"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    row = summary["groups"]["overall"][f"{PEER}:num_pred_tokens=2"]
    assert row["lossless_checked"] == row["lossless_identical"] == 1
    assert f"{PEER}:num_pred_tokens=2" in json.loads((out / "run.json").read_text())["command"]
    oracle = summary["priced_oracle"]["groups"]["overall"][f"{PEER}:num_pred_tokens=2"]  # the oracle's pass ran
    assert oracle["sources"] == f"{PEER}:2" and oracle["questions"] == 1  # priced with its own candidates
    lines = capsys.readouterr().out.splitlines()  # the printed summary has the oracle's columns
    assert lines[0].split()[-3:] == ["oracle", "of", "it"]
    peer = next(ln.split() for ln in lines if ln.startswith(f"{PEER}:"))
    assert peer[-3] == "1/1" and float(peer[-1]) == pytest.approx(oracle["of_oracle"], abs=0.006)


def test_the_oracle_prices_the_peer_with_its_own_candidates():
    """llama-cpp-python's lookup after ``1 2`` proposes what followed the last ``1 2`` before (its 2-gram key),
    ``num_pred_tokens`` of it: ``3 4`` agree with the continuation, then 9 != 7."""
    pytest.importorskip("llama_cpp")
    from pacer.bench.limit import peer_lengths, peer_set, source_set

    prompt, ref = [1, 2, 3, 4, 9, 1, 2], [3, 4, 7]
    assert peer_lengths(prompt, ref, 2) == [2, 1, 0] and peer_lengths(prompt, ref, 1) == [1, 1, 0]
    assert source_set(f"{PEER}:num_pred_tokens=2") == peer_set(f"{PEER}:num_pred_tokens=2") == f"{PEER}:2"
    assert source_set(PEER) == f"{PEER}:10"  # llama-cpp-python's default

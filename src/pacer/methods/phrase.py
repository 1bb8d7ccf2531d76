"""Ouroboros phrase drafting (:mod:`pacer.drafters.phrase`) with the fixed rule (``ouroboros``) or PACER's layer
(``pacer+ouroboros``): the same policies as ``sd`` and ``pacer``, another drafter."""

from __future__ import annotations

from ..bounds import MAX_POOL  # (re-exported here)
from ..drafters.phrase import PhraseDrafter, PhraseOptions
from ..drafters.pool import check_pool_file
from .learned import BLOCK, PATH, learned
from .registry import MAX_KEY, MAX_PHRASE, Build, Method, Option, register
from .rules import THRESHOLD, fixed

#: pacer+ouroboros's siblings, chosen on the 40 development questions (8 kinds, 256 new tokens, greedy; AMD EPYC
#: Zen 4, transformers bf16; docs/bench/dev40-zen4, in the repository's history): against none, the same overall
#: speedup (2.52x against 2.53x plain decoding, Zen 4 profile clock; 2.33x against 2.34x wall), a better median
#: question (1.08x against 1.06x pacer) and a better median on 5 of the 8 kinds (writing, coding, math, stem,
#: rag_qa), where none was 0.97-0.98x pacer on coding and stem
SIBLINGS = 4

#: the most candidate or sibling branches of a round, and the largest tree one verification may score (the largest
#: phrase pool: :data:`pacer.bounds.MAX_POOL`)
MAX_BRANCHES, MAX_TREE = 16, 1024

PHRASE_OPTIONS = (
    Option("ngram", int, "ouroboros / lookup: phrase length (default 6 / 8)", to="drafter", minimum=1,
           maximum=MAX_PHRASE),
    Option("pool_size", int, "ouroboros: phrase pool capacity in entries (default 20000)", to="drafter", minimum=1,
           maximum=MAX_POOL),
    Option("candidates", int, "ouroboros: candidate phrases verified per round (default 2)", to="drafter",
           minimum=0, maximum=MAX_BRANCHES),
    Option("candidate_len", int, "ouroboros: longest candidate phrase (default: ngram)", to="drafter", minimum=1,
           maximum=MAX_PHRASE),
    Option("key_len", int, "ouroboros / lookup: longest n-gram key (default 2 / 3)", to="drafter", minimum=1,
           maximum=MAX_KEY),
    Option("sources", str, "ouroboros: phrase sources, a subset of prompt,output,verify,lookahead", to="drafter"),
    Option("warm_start", bool, "ouroboros: share the pool across generations (default true)", to="drafter"),
    Option("pool_file", str, "ouroboros: load the pool from / save it to this file (a symbolic link: its target "
           "is updated)", to="drafter",
           path=True, preflight=check_pool_file),
    Option("phrases", bool, "ouroboros: draft phrase by phrase (false: token by token, candidates only)",
           to="drafter"),
    Option("siblings", int, "ouroboros: most sibling branches per round - the draft's second choice beside a draft "
           f"token, where the cost rule prices it as paying at the hit rate the drafter learnt (default 0; "
           f"pacer+ouroboros: {SIBLINGS})",
           to="drafter", minimum=0, maximum=MAX_BRANCHES),
    Option("choose", bool, "ouroboros: per round, the draft model, a phrase verified alone or both, by predicted "
           "payoff from what each earned in this generation (default true; greedy, under the cost rule)",
           to="drafter"),
    Option("lookup_len", int, "ouroboros: longest phrase a round verifies alone from the generation's own text "
           "(default 16)", to="drafter", minimum=1, maximum=MAX_PHRASE),
    Option("tree_size", int, "ouroboros: most tokens one verification scores with the branches (0: no cap)",
           to="drafter", minimum=0, maximum=MAX_TREE),
)


def phrase_drafter(method: str, **defaults):
    """The method's drafter: its ``defaults`` (the best configuration measured on the development questions),
    overridden by the options given."""
    def build(b: Build) -> PhraseDrafter:
        options = {**defaults, **b.options}
        # each method (with its options) keeps its own warm-start pool: one method never sees another's output
        tag = method + "".join(f"|{k}={v}" for k, v in sorted(options.items()))
        tag += f"|draft_vocab={len(b.rows)}" if b.rows is not None else ""
        return PhraseDrafter(b.pair.draft_backend(b.rows), b.pair.vocab, PhraseOptions(pool_tag=tag, **options))

    return build


register(Method("ouroboros", "Ouroboros: phrase drafting from an n-gram pool, candidate phrases verified in the "
                "same forward; fixed γ", fixed, phrase_drafter("ouroboros"), options=PHRASE_OPTIONS, extras=True))
register(Method("pacer+ouroboros", "PACER's layer deciding the length of Ouroboros phrase drafts",
                learned("pacer"), phrase_drafter("pacer+ouroboros", siblings=SIBLINGS),
                options=(THRESHOLD, PATH, BLOCK, *PHRASE_OPTIONS), extras=True))

"""The training-free draft-length rules: fixed ``γ``, Hugging Face's heuristic schedule, and the draft's
confidence, entropy and cumulative probability (llama.cpp's ``--draft-p-min`` is the confidence rule)."""

from __future__ import annotations

from ..policies.rules import ConfidencePolicy, CumProbPolicy, EntropyPolicy, FixedPolicy, HeuristicPolicy
from .registry import MAX_DRAFT, Build, Method, Option, register

#: the length of the fixed rules when ``gamma`` is not given (their cap under the cost-aware rule)
DEFAULT_GAMMA = 4


def fixed(b: Build) -> FixedPolicy:
    return FixedPolicy(gamma=DEFAULT_GAMMA if b.gamma is None else b.gamma, **b.bounds)


def heuristic(b: Build) -> HeuristicPolicy:
    gamma = b.options.get("initial", DEFAULT_GAMMA if b.gamma is None else b.gamma)
    return HeuristicPolicy(gamma=gamma, **b.bounds)


def threshold_of(b: Build) -> dict:
    """A rule's threshold: the one given, else none under the cost-aware rule (it decides on the rule's survival
    proxy), else the rule's default."""
    if "threshold" in b.options:
        return {"threshold": b.options["threshold"]}
    return {"threshold": None} if b.cost_aware else {}


register(Method("sd", "speculative decoding with a fixed draft length γ", fixed))
register(Method("heuristic", "Hugging Face's schedule: γ += 2 after a fully accepted round, else γ -= 1", heuristic,
                options=(Option("initial", int, "heuristic: initial draft length (default: gamma)", minimum=1,
                                maximum=MAX_DRAFT, explicit=True),)))
_THRESHOLD_HELP = ("threshold of confidence / pacer / specdecpp (a probability) or entropy (nats); default: the "
                   "cost-aware rule decides, else the rule's or checkpoint's own")
#: a probability threshold (confidence, pacer, specdecpp)
THRESHOLD = Option("threshold", float, _THRESHOLD_HELP, minimum=0.0, maximum=1.0, explicit=True)
register(Method("confidence", "stop once the draft's top probability falls below a threshold (llama.cpp p-min)",
                lambda b: ConfidencePolicy(**b.bounds, **threshold_of(b)), options=(THRESHOLD,)))
register(Method("entropy", "stop once the draft's entropy exceeds a threshold (AdaEDL-like)",
                lambda b: EntropyPolicy(**b.bounds, **threshold_of(b)),
                options=(Option("threshold", float, _THRESHOLD_HELP, minimum=0.0, explicit=True),)))
register(Method("cumprob", "stop once the product of the draft's probabilities of its tokens falls below a threshold",
                lambda b: CumProbPolicy(**b.bounds, **threshold_of(b)), options=(THRESHOLD,)))

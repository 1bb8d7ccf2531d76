"""``hf-assisted``: transformers' own assisted generation (``model.generate(..., assistant_model=draft)``) on
the pair already loaded in a :class:`pacer.api.Decoder`, measured like our methods.

What transformers 5.24 does (``generation/candidate_generator.py``, ``generation/utils.py``): the
assistant's ``generation_config`` is filled with the global defaults ``num_assistant_tokens=20``,
``num_assistant_tokens_schedule="constant"``, ``assistant_confidence_threshold=0.4`` (the assistant stops
drafting once its top probability falls below it; the threshold is re-fitted from an ROC curve only when
scikit-learn is installed). With ``schedule="heuristic"`` it adds 2 after a fully accepted round and
subtracts 1 otherwise, and *writes the final length back* into the assistant's ``generation_config`` so it
would carry over into the next call - we save and restore those three fields around every call, so each
generation starts from the defaults.

Rounds are counted by wrapping ``AssistedCandidateGenerator.update_candidate_strategy`` (called once per
target verification with the candidate length and the number of matches, after the cut at EOS / max length)
and checked against a forward hook on the target that counts its calls.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from ..errors import PacerError
from .methods import HF_KEYS


@dataclass
class HFResult:
    token_ids: list[int]
    wall_time: float
    draft_lengths: list[int] = field(default_factory=list)
    accepted_counts: list[int] = field(default_factory=list)  # accepted draft tokens per round (no bonus)
    target_calls: int = 0
    draft_forwards: int = 0
    finish_reason: str = ""


@contextmanager
def _quiet_transformers():
    from transformers.utils import logging

    old = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(old)


def hf_assisted_generate(dec, ids: list[int], max_new_tokens: int, opts: dict | None = None) -> HFResult:
    """Greedy assisted generation from prompt ids ``ids``; stops at :attr:`Decoder.eos` like our loop."""
    from transformers.generation.candidate_generator import AssistedCandidateGenerator

    if dec.draft_info is None:
        raise PacerError("hf-assisted needs a draft model (--draft)")
    if not dec.pair.record.torch_modules:
        raise PacerError(f"hf-assisted is transformers' own loop and runs on transformers models only; drop it "
                         f"from --methods with --backend {dec.backend}")
    opts = dict(opts or {})
    target, draft = dec.target_info.model, dec.draft_info.model  # transformers models: this peer is HF-only
    gc = draft.generation_config
    saved = {attr: getattr(gc, attr, None) for attr in HF_KEYS.values()}
    rounds: list[tuple[int, int]] = []
    calls = {"target": 0, "draft": 0}
    original = AssistedCandidateGenerator.update_candidate_strategy

    def counting(self, input_ids, scores, num_matches):
        rounds.append((int(scores.shape[1]) - 1, int(num_matches)))
        return original(self, input_ids, scores, num_matches)

    def count(key: str):
        def hook(module, args, output) -> None:
            calls[key] += 1

        return hook

    budget = min(max_new_tokens, dec.target.context - len(ids))
    eos = sorted(dec.eos)
    pad = getattr(target.generation_config, "pad_token_id", None)
    hooks = [target.register_forward_hook(count("target")), draft.register_forward_hook(count("draft"))]
    AssistedCandidateGenerator.update_candidate_strategy = counting
    try:
        for key, attr in HF_KEYS.items():
            if key in opts:
                setattr(gc, attr, opts[key])
        x = torch.tensor([ids], dtype=torch.long)
        with _quiet_transformers(), torch.inference_mode():
            start = time.perf_counter()
            out = target.generate(
                input_ids=x, attention_mask=torch.ones_like(x), assistant_model=draft, do_sample=False,
                max_new_tokens=budget, eos_token_id=eos, pad_token_id=pad if pad is not None else eos[0],
            )
            wall = time.perf_counter() - start
    finally:
        AssistedCandidateGenerator.update_candidate_strategy = original
        for h in hooks:
            h.remove()
        for attr, value in saved.items():
            setattr(gc, attr, value)
    new = out[0, len(ids):].tolist()
    if new and new[-1] in dec.eos:
        reason = "eos"
    elif len(new) >= budget:
        reason = "length"
    else:
        reason = "other"
    return HFResult(new, wall, [r[0] for r in rounds], [r[1] for r in rounds], calls["target"],
                    calls["draft"], reason)

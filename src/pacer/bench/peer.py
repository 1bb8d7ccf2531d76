"""llama-cpp-python's own prompt lookup decoding as a peer in ``pacer bench``: what a llama.cpp user already has.

``lookup@llamacpp:num_pred_tokens=K`` runs ``llama_cpp.Llama(target.gguf, draft_model=LlamaPromptLookupDecoding(
num_pred_tokens=K))`` greedily on the run's GGUF target (llama-cpp-python's README advises ``K = 10`` on a GPU and
``K = 2`` on a CPU), on the run's threads and context, with the same prompt ids as every method, reading the whole
prompt every time (llama-cpp-python would otherwise reuse the cache of a prompt it ran before). Its output is
compared with plain decoding's like every method's (its speed is its wall time, the prefill included). It decodes
greedily only; its rounds are llama-cpp-python's own, so the record holds no forwards or draft lengths.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..errors import ContextError, PacerError

#: the peer's method name in ``--methods`` (``lookup@llamacpp:num_pred_tokens=K``)
PEER = "lookup@llamacpp"
#: its one option, the draft tokens a round proposes (llama-cpp-python's default 10), and its range
NUM_PRED_TOKENS, DEFAULT_PRED_TOKENS, MAX_PRED_TOKENS = "num_pred_tokens", 10, 64


def check_options(opts: dict, raw: str) -> None:
    """The peer's options as written in ``--methods`` (only ``num_pred_tokens``, an integer in range), or a
    one-line error."""
    for k, v in opts.items():
        if k != NUM_PRED_TOKENS:
            raise PacerError(f"method '{raw}': {PEER} takes {NUM_PRED_TOKENS} only, not '{k}'")
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_PRED_TOKENS:
            raise PacerError(f"method '{raw}': {NUM_PRED_TOKENS} must be an integer in 1..{MAX_PRED_TOKENS}, "
                             f"got {v!r}")


def gguf_path(dec) -> str | None:
    """The GGUF file of ``dec``'s target (``None``: it was not loaded from one)."""
    return (dec.target_info.extra or {}).get("path")


class LlamaLookupPeer:
    """The peer's model: one ``llama_cpp.Llama`` of the GGUF target at ``path`` with a prompt-lookup draft model
    (each generation sets its ``num_pred_tokens``); ``dec``: the run's decoder, whose tokenizer encodes the prompts
    and decodes the outputs (the same ids every method gets)."""

    def __init__(self, dec, path: str, threads: int, context: int) -> None:
        try:
            from llama_cpp import Llama
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding
        except ImportError as e:
            raise PacerError(f"{PEER} needs llama-cpp-python ({e}); install it (scripts/setup.sh) or drop {PEER} "
                             f"from --methods") from None
        from ..backends.llamacpp import N_BATCH

        self.dec, self.context, self._lookup = dec, context, LlamaPromptLookupDecoding
        # logits_all=True: with a draft model llama-cpp-python keeps every row's logits, but it sizes that store by
        # the argument (n_batch rows when False), so a prompt longer than one batch failed to broadcast
        self.llm = Llama(model_path=path, n_ctx=context, n_batch=N_BATCH, n_threads=threads,
                         n_threads_batch=threads, draft_model=LlamaPromptLookupDecoding(), logits_all=True,
                         verbose=False)

    def encode(self, prompt, chat: bool = False, history: Sequence[dict] = ()) -> list[int]:
        return self.dec.encode(prompt, chat=chat, history=history)

    def generate(self, ids: list[int], max_new_tokens: int, num_pred_tokens: int = DEFAULT_PRED_TOKENS) \
            -> tuple[list[int], float, str]:
        """``(token ids, wall seconds, finish reason)`` of one greedy generation from ``ids`` (the prefill
        included), at most ``max_new_tokens`` and the context's room, ending at an end-of-sequence id."""
        if len(ids) >= self.context:
            raise ContextError(f"the prompt has {len(ids)} tokens but {PEER}'s context is {self.context}")
        budget = min(max_new_tokens, self.context - len(ids))
        self.llm.draft_model = self._lookup(num_pred_tokens=num_pred_tokens)
        self.llm.reset()  # no prompt cache kept from the last generation: every run reads its whole prompt
        out: list[int] = []
        reason = "length"
        start = time.perf_counter()
        for tok in self.llm.generate(list(ids), temp=0.0, top_k=1, reset=True):
            out.append(int(tok))  # an end-of-sequence id is kept, as pacer's output keeps it
            if out[-1] in self.dec.eos:
                reason = "eos"
                break
            if len(out) >= budget:
                break
        return out, time.perf_counter() - start, reason

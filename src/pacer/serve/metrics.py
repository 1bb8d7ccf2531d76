"""Server metrics in Prometheus' text format, named as vLLM (and llama.cpp's server) name them.

Speculative decoding, per round ``t`` with ``γ_t`` draft tokens of which ``n_t`` were accepted:

* ``pacer:spec_decode_num_drafts_total`` - rounds that drafted (``γ_t > 0``);
* ``pacer:spec_decode_num_draft_tokens_total`` - ``Σ γ_t``;
* ``pacer:spec_decode_num_accepted_tokens_total`` - ``Σ n_t``;
* ``pacer:spec_decode_num_accepted_tokens_per_pos_total{position="i"}`` - rounds whose draft token at 0-based
  position ``i`` was accepted (``n_t > i``);
* ``pacer:spec_decode_draft_length`` - histogram of ``γ_t`` over rounds (neither vLLM nor llama.cpp has it).

Requests: ``pacer:request_success_total{finished_reason}``, ``pacer:request_failure_total{reason}`` (``rejected``:
429, ``timeout``, ``cancelled``, ``error``), ``pacer:num_requests_running`` / ``pacer:num_requests_waiting``,
``pacer:prompt_tokens_total`` (finished requests), ``pacer:generation_tokens_total`` (every committed token, a
cancelled request's too), ``pacer:generation_tokens_per_second`` (the last finished request's). Each response
carries the same numbers for itself (:func:`request_metrics`).
"""

from __future__ import annotations

import threading
from collections import Counter

from ..decoding.stats import GenerationStats

DRAFT_LENGTH_BUCKETS = (0, 1, 2, 4, 8, 16, 32)


def request_metrics(stats: GenerationStats) -> dict:
    """One generation's speculative-decoding numbers (the ``pacer`` field of a response)."""
    per_pos = Counter(i for n in stats.accepted_counts for i in range(n))
    return {
        "method": stats.method,
        "num_drafts": sum(1 for g in stats.draft_lengths if g > 0),
        "num_draft_tokens": stats.draft_tokens,
        "num_accepted_tokens": stats.accepted_tokens,
        "num_accepted_tokens_per_pos": [per_pos[i] for i in range(max(per_pos, default=-1) + 1)],
        "target_calls": stats.target_calls,
        "mean_acceptance_length": round(stats.tau, 4),
        "acceptance_rate": round(stats.acceptance_rate, 4),
        "draft_lengths": list(stats.draft_lengths),
        "tokens_per_s": round(stats.tokens_per_s, 3),
        "time_to_first_token_s": round(stats.ttft, 4),  # the generation's own first round (queueing not included)
        "finish_reason": stats.finish_reason,
    }


class Metrics:
    """Counters for ``/metrics``; thread-safe (the decoding worker and the request handlers both write)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.success: Counter = Counter()
        self.failure: Counter = Counter()
        self.prompt_tokens = self.generation_tokens = 0
        self.drafts = self.draft_tokens = self.accepted_tokens = 0
        self.per_pos: Counter = Counter()
        self.lengths: Counter = Counter()
        self.rounds = 0
        self.last_tokens_per_s = 0.0
        self.running = self.waiting = 0

    def finished(self, stats: GenerationStats, finish_reason: str) -> None:
        m = request_metrics(stats)
        with self.lock:
            self.success[finish_reason] += 1
            self.prompt_tokens += stats.prompt_tokens
            self.drafts += m["num_drafts"]
            self.draft_tokens += m["num_draft_tokens"]
            self.accepted_tokens += m["num_accepted_tokens"]
            self.per_pos.update(dict(enumerate(m["num_accepted_tokens_per_pos"])))
            self.lengths.update(stats.draft_lengths)
            self.rounds += len(stats.draft_lengths)
            self.last_tokens_per_s = stats.tokens_per_s

    def generated(self, tokens: int) -> None:
        """Tokens the worker committed (cancelled generations' too)."""
        with self.lock:
            self.generation_tokens += tokens

    def failed(self, reason: str) -> None:
        with self.lock:
            self.failure[reason] += 1

    def render(self) -> str:
        lines: list[str] = []

        def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
            lines.extend([f"# HELP {name} {help_}", f"# TYPE {name} {kind}"])
            lines.extend(f"{name}{labels} {value:g}" if isinstance(value, float) else f"{name}{labels} {value}"
                         for labels, value in samples)

        with self.lock:
            metric("pacer:request_success_total", "counter", "Finished requests by finish reason.",
                   [(f'{{finished_reason="{r}"}}', n) for r, n in sorted(self.success.items())] or [("", 0)])
            metric("pacer:request_failure_total", "counter", "Requests that did not finish (rejected, timeout, "
                   "cancelled, error).",
                   [(f'{{reason="{r}"}}', n) for r, n in sorted(self.failure.items())] or [("", 0)])
            for name, kind, help_, value in (
                ("num_requests_running", "gauge", "Requests being decoded.", self.running),
                ("num_requests_waiting", "gauge", "Requests queued for the decoding worker.", self.waiting),
                ("prompt_tokens_total", "counter", "Prompt tokens of finished requests.", self.prompt_tokens),
                ("generation_tokens_total", "counter", "Generated tokens (of cancelled requests too).",
                 self.generation_tokens),
                ("generation_tokens_per_second", "gauge", "Tokens/s of the last finished request.",
                 float(self.last_tokens_per_s)),
                ("spec_decode_num_drafts_total", "counter", "Rounds that drafted at least one token.", self.drafts),
                ("spec_decode_num_draft_tokens_total", "counter", "Draft tokens proposed.", self.draft_tokens),
                ("spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.", self.accepted_tokens),
            ):
                metric("pacer:" + name, kind, help_, [("", value)])
            metric("pacer:spec_decode_num_accepted_tokens_per_pos_total", "counter",
                   "Rounds whose draft token at this 0-based position was accepted.",
                   [(f'{{position="{i}"}}', n) for i, n in sorted(self.per_pos.items())] or [("", 0)])
            cum, samples = 0, []
            for b in DRAFT_LENGTH_BUCKETS:
                cum = sum(n for g, n in self.lengths.items() if g <= b)
                samples.append((f'_bucket{{le="{b}"}}', cum))
            samples += [('_bucket{le="+Inf"}', self.rounds), ("_sum", sum(g * n for g, n in self.lengths.items())),
                        ("_count", self.rounds)]
            lines.extend(["# HELP pacer:spec_decode_draft_length Draft tokens per round.",
                          "# TYPE pacer:spec_decode_draft_length histogram"])
            lines.extend(f"pacer:spec_decode_draft_length{s} {v}" for s, v in samples)
        return "\n".join(lines) + "\n"

"""A seeded sample is reproducible on a long-lived decoder (a server's case): the same seeded call gives the same
tokens and the same rounds after other generations, greedy and sampled, have taught the decoder's cost-aware memory
(``docs/cost-aware.md``, seeded samples); for every method that samples, under both verification rules, through
the API and the server."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from conftest import FLAT
from pacer import Decoder, SamplingConfig, methods
from pacer.tiny import tiny_pair

PROMPT = "hello world, this is"
OTHERS = ["def f(x):\n    return", "The 3 quick brown foxes", "a b c d e", "hello hello hello", "zzz top"]
#: the tiny pair's pre-verification checkpoints (the decisions record's)
CHECKPOINTS = Path(__file__).resolve().parent / "data" / "decisions-checkpoints"


def _options(name: str) -> dict:
    kind = name.split("+")[0]
    return {"path": str(CHECKPOINTS / kind)} if kind in ("pacer", "specdecpp") else {}


def _sampling_methods() -> list[str]:
    return [n for n in methods.names() if not methods.get(n).greedy_only]


@pytest.fixture(scope="module")
def dec():
    return Decoder(*tiny_pair("close"), threads=1, costs=FLAT)


def _run(dec: Decoder, name: str, prompt: str, sampling: SamplingConfig | None, n: int = 40):
    return dec.generate(prompt, name, max_new_tokens=n, sampling=sampling, options=_options(name))


@pytest.mark.parametrize("verify", ["token", "block"])
@pytest.mark.parametrize("name", _sampling_methods())
def test_a_seeded_call_is_the_same_after_five_other_generations(dec, name, verify):
    cfg = SamplingConfig(0.9, seed=11, verify=verify)
    first = _run(dec, name, PROMPT, cfg)
    for i, prompt in enumerate(OTHERS):  # greedy and sampled generations in between, each teaching the memory
        _run(dec, name, prompt, SamplingConfig(0.9, seed=i, verify=verify) if i % 2 else None, 30)
    again = _run(dec, name, PROMPT, cfg)
    assert again.token_ids == first.token_ids
    assert again.stats.draft_lengths == first.stats.draft_lengths  # the same decisions, not just the same luck
    fresh = _run(Decoder(dec.pair, costs=FLAT), name, PROMPT, cfg)
    assert fresh.token_ids == first.token_ids  # and what a new decoder gives


def test_greedy_generations_keep_learning(dec):
    """The memory still serves greedy generations: it has counted their rounds (a sampled one left it as it
    was)."""
    policy = dec.make_policy("entropy", None, "token")
    before = sum(policy.shared_memory.trials)
    _run(dec, "entropy", OTHERS[0], SamplingConfig(0.9, seed=1))
    assert sum(policy.shared_memory.trials) == before
    _run(dec, "entropy", OTHERS[0], None)
    assert sum(policy.shared_memory.trials) > before


@pytest.fixture(scope="module")
def server():
    from test_serve import Server

    s = Server(Decoder(*tiny_pair("close"), threads=1, costs=FLAT))
    yield s
    s.stop()


def test_a_seeded_request_is_the_same_after_five_others(server):
    def post(prompt: str, **body) -> str:
        r = httpx.post(server.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 32, **body}, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    for verify in ("token", "block"):
        ext = {"method": "entropy", "verify": verify}
        first = post(PROMPT, temperature=0.9, seed=5, pacer=ext)
        for i, prompt in enumerate(OTHERS):
            greedy = i % 2 == 0  # a greedy request names no verification rule (block needs sampling)
            post(prompt, temperature=0 if greedy else 0.9, seed=i, pacer={"method": "entropy"} if greedy else ext)
        assert post(PROMPT, temperature=0.9, seed=5, pacer=ext) == first

"""The sampling settings' numeric boundary, checked in one place (:class:`pacer.SamplingConfig`) and reached the same
way from every entry point: the API (``Decoder.generate``), the command line (``pacer generate``) and the server.
A value taken gives the documented limit where the law degenerates (the argmax for a vanishing temperature or
top-p, whatever float32 can represent), under both verification rules; a value refused is a one-line error (exit 2,
HTTP 400); the draw never returns an arbitrary id."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import torch

from pacer import SamplingConfig
from pacer.cli import main
from pacer.errors import InvalidValue
from pacer.sampling import draw, warp
from pacer.tiny import save_tiny_pair

PROMPT = "hello world, this is"
F32 = np.finfo(np.float32)
#: positive values at and below float32's and float64's boundaries: float64's smallest subnormal, numbers float32
#: rounds to 0, float32's smallest subnormal and normal, then small ordinary values
TINY = [5e-324, 1e-300, float(F32.smallest_subnormal) / 2, float(F32.smallest_subnormal),
        float(F32.smallest_normal), 1e-30, 1e-12]
#: temperatures far above every logit's scale, float32's largest number and past it, up to float64's
HUGE = [1e6, float(F32.max), 1e39, 1e300, 1.7e308]
#: values every entry point refuses (one line): NaN, infinities, negatives, a top_p of 0 or just above 1
REFUSED = {"temperature": [float("nan"), float("inf"), -float("inf"), -1e-300, -0.5],
           "top_p": [0.0, -0.0, -1e-300, 1.0000001, 2.0, float("nan"), float("inf")],
           "top_k": [-1]}


# --------------------------------------------------------------------------------------------------- warp, draw
@pytest.mark.parametrize("value", TINY)
def test_a_vanishing_temperature_or_top_p_is_the_argmax(value):
    """``top_p = 1e-300`` rounds to 0 in float32, where every token's mass before it is ``>= 0``: every id was
    masked and the draw returned the vocabulary's last id. The limit is the top token alone (the first of equal
    maxima for top-p, as greedy decoding; shared for the temperature, its exact limit); masked ids stay at 0."""
    row = torch.tensor([[1.0, 5.0, 3.0, float("-inf"), 4.0], [7.0, 1.0, 7.0, float("-inf"), -3.0]])
    hot = [[0.0, 1.0, 0.0, 0.0, 0.0]]
    assert warp(row, SamplingConfig(1.0, top_p=value)).tolist() == hot + [[1.0, 0.0, 0.0, 0.0, 0.0]]
    assert warp(row, SamplingConfig(0.7, top_k=3, top_p=value)).tolist() == hot + [[1.0, 0.0, 0.0, 0.0, 0.0]]
    assert warp(row, SamplingConfig(value)).tolist() == hot + [[0.5, 0.0, 0.5, 0.0, 0.0]]


@pytest.mark.parametrize("value", HUGE)
def test_a_huge_temperature_is_uniform_over_the_ids_scored(value):
    """``-inf / inf`` is NaN: a temperature past float32's range kept a masked id's NaN in the row."""
    row = torch.tensor([[1.0, 5.0, float("-inf"), 30.0, -4.0]])
    p = warp(row, SamplingConfig(value)).double()
    assert torch.isfinite(p).all() and p[0, 2] == 0.0
    np.testing.assert_allclose(p[0, [0, 1, 3, 4]].numpy(), 0.25, atol=1e-4 if value == 1e6 else 1e-7)


def test_top_p_at_a_boundary_keeps_the_smallest_set_reaching_it():
    """A top_p equal to a prefix's mass keeps that prefix; one just above it keeps the next token too; just below
    1 keeps everything the float32 mass can tell; top_k of the vocabulary's size or more keeps every id."""
    row = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.125]]))  # exact in float32
    kept = lambda **kw: (warp(row, SamplingConfig(1.0, **kw))[0] > 0).tolist()  # noqa: E731
    assert kept(top_p=0.5) == [True, False, False, False]
    assert kept(top_p=float(np.nextafter(0.5, 1.0))) == [True, True, False, False]
    assert kept(top_p=0.75) == [True, True, False, False]
    assert kept(top_p=float(np.nextafter(1.0, 0.0))) == [True] * 4
    assert kept(top_k=4) == kept(top_k=10**30) == [True] * 4
    assert kept(top_k=1) == [True, False, False, False]


def test_draw_never_returns_an_arbitrary_id(monkeypatch):
    """Weights that sum to zero, NaN or infinity have nothing to draw: an error, never the last id; a uniform that
    rounds up to the total draws the last positive weight, not a zero one after it."""
    gen = torch.Generator().manual_seed(0)
    for bad in ([0.0, 0.0, 0.0], [0.2, float("nan"), 0.1], [0.2, float("inf"), 0.0], [float("nan")] * 3):
        with pytest.raises(ValueError, match="nothing to draw from"):
            draw(torch.tensor(bad), gen)
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.ones(1, dtype=torch.float64))  # u = the total
    assert draw(torch.tensor([0.5, 0.25, 0.25, 0.0, 0.0]), gen) == 2


@pytest.mark.parametrize("name", list(REFUSED))
def test_the_config_refuses_what_has_no_law(name):
    base = {"temperature": 1.0}
    for v in REFUSED[name]:
        with pytest.raises(InvalidValue, match=f"^{name} must be"):
            SamplingConfig(**{**base, name: v})


# ------------------------------------------------------------------------------------------------ entry points
def _limits() -> list[tuple[float, float, int]]:
    """``(temperature, top_p, top_k)`` whose law is the argmax: each vanishing value, and top_k 1 besides."""
    return [(t, 1.0, 0) for t in TINY] + [(0.8, p, 0) for p in TINY] + [(1.3, 1.0, 1)]


@pytest.mark.parametrize("verify", ["token", "block"])
def test_the_api_at_the_limits_is_greedy_decoding(close, verify):
    """``Decoder.generate`` at every vanishing value, plain and speculative decoding (a fixed γ and a cost-aware
    rule), under both verification rules: greedy decoding's tokens."""
    greedy = close.generate(PROMPT, "ar", max_new_tokens=10).token_ids
    for t, p, k in _limits():
        cfg = SamplingConfig(t, top_k=k, top_p=p, seed=5, verify=verify)
        for method, kw in (("ar", {}), ("sd", {"gamma": 3}), ("entropy", {})):
            got = close.generate(PROMPT, method, max_new_tokens=10, sampling=cfg, **kw).token_ids
            assert got == greedy, (method, t, p, k)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target, draft = save_tiny_pair(tmp_path_factory.mktemp("limits"))
    return ["--target", str(target), "--draft", str(draft), "--dtype", "float32", "--threads", "1"]


def _cli(capsys, pair, *args) -> tuple[int, str, str]:
    rc = main(["generate", PROMPT, "--max-new-tokens", "8", *args, *pair])
    out, err = capsys.readouterr()
    return rc, out, err


def test_the_command_line_at_the_limits_is_greedy_and_refuses_the_rest(capsys, pair):
    rc, out, err = _cli(capsys, pair, "--json", "--method", "ar")
    assert rc == 0, err
    greedy = json.loads(out)["token_ids"]
    for (t, p, k), verify in zip(_limits()[::2] + [(0.8, 5e-324, 0)], ["token", "block"] * 8, strict=False):
        rc, out, err = _cli(capsys, pair, "--json", "--temperature", repr(t), "--top-p", repr(p), "--top-k",
                            str(k), "--seed", "9", "--verify", verify, "--gamma", "3")
        assert rc == 0 and json.loads(out)["token_ids"] == greedy, (t, p, k, err)
    for name, values in REFUSED.items():
        for v in values:
            rc, out, err = _cli(capsys, pair, "--temperature", "1.0", f"--{name.replace('_', '-')}={v!r}")
            assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, (name, v, err)
            assert f"--{name.replace('_', '-')} must be" in err


@pytest.fixture(scope="module")
def server(pairs):
    from test_serve import Server

    s = Server(pairs["close"])
    yield s
    s.stop()


def _post(server, **body) -> httpx.Response:
    return httpx.post(server.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, **body}, timeout=60)


def test_the_server_at_the_limits_is_greedy_and_refuses_the_rest(server):
    greedy = _post(server, temperature=0).json()["choices"][0]["text"]
    for (t, p, k), verify in zip(_limits(), ["token", "block"] * 10, strict=False):
        r = _post(server, temperature=t, top_p=p, top_k=k, seed=4, pacer={"verify": verify, "gamma": 3})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == greedy, (t, p, k, r.text)
    for name, values in REFUSED.items():
        for v in values:
            body = {"prompt": PROMPT, "temperature": 1.0, name: v}
            r = httpx.post(server.url + "/v1/completions", content=json.dumps(body), timeout=60)  # NaN as JSON's
            words = f"{name} must be" if v == v else f"'{name}' is out of range"
            assert r.status_code == 400 and words in r.json()["error"]["message"], (name, v, r.text)
    r = _post(server, temperature=1.0, min_p=0.1)  # a filter pacer does not apply: refused, never ignored
    assert r.status_code == 400 and "'min_p' is not supported" in r.json()["error"]["message"]
    assert _post(server, temperature=0, min_p=0).status_code == 200

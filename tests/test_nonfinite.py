"""A model whose numbers are not finite (an ``rms_norm_eps`` of NaN in its config, a NaN weight) stops with one
error naming the model and the cause, through the API and the command line, for the target and the draft, greedy
and sampling: never a run of id-0 (or last-id) tokens with a successful exit."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from conftest import FLAT
from pacer import Decoder, SamplingConfig
from pacer.backends.transformers import TransformersModel
from pacer.cli import main
from pacer.decoding.backend import finite
from pacer.errors import NonFiniteLogits
from pacer.tiny import save_tiny_pair, tiny_pair

PROMPT = "hello world, this is"


def _poisoned(model: TransformersModel) -> TransformersModel:
    """A copy whose RMS norms divide by ``sqrt(mean(x²) + NaN)``: what a config's ``rms_norm_eps: NaN`` builds."""
    m = copy.deepcopy(model.model)
    m.config._name_or_path = "poisoned"  # the folder it would be loaded from: what the error names
    for mod in m.modules():
        if hasattr(mod, "variance_epsilon"):
            mod.variance_epsilon = float("nan")
    return TransformersModel(m, model.tokenizer, "poisoned", "poisoned", torch.float32)


def test_the_check_names_what_is_not_finite():
    ok = torch.tensor([[1.0, float("-inf"), 3.0]])
    assert finite(ok, "m") is ok
    for row, what in (([1.0, float("nan"), 3.0], "NaN"), ([1.0, float("inf")], r"\+inf"),
                      ([float("-inf")] * 3, "-inf everywhere in a row")):
        with pytest.raises(NonFiniteLogits, match=f"the model m gave non-finite logits \\({what}"):
            finite(torch.tensor([[0.5, 0.5, 0.5][: len(row)], row]), "m")


@pytest.mark.parametrize("role", ["target", "draft"])
@pytest.mark.parametrize("sampling", [None, SamplingConfig(0.8, seed=1, verify="block")], ids=["greedy", "sampled"])
def test_a_nan_model_stops_with_the_cause(role, sampling):
    target, draft = tiny_pair("close")
    pair = (_poisoned(target), draft) if role == "target" else (target, _poisoned(draft))
    dec = Decoder(*pair, threads=1, costs=FLAT)
    for method in ("ar", "sd") if role == "target" else ("sd",):
        with pytest.raises(NonFiniteLogits, match="'poisoned' gave non-finite logits \\(NaN\\).*rms_norm_eps"):
            dec.generate(PROMPT, method, max_new_tokens=12, gamma=3, sampling=sampling)


def test_the_command_line_refuses_a_nan_config_in_one_line(capsys, tmp_path):
    target, draft = save_tiny_pair(tmp_path)
    cfg = json.loads((target / "config.json").read_text())
    cfg["rms_norm_eps"] = float("nan")
    (target / "config.json").write_text(json.dumps(cfg))  # NaN, as Python's json writes it
    capsys.readouterr()  # the saving's progress bars
    rc = main(["generate", PROMPT, "--max-new-tokens", "12", "--json", "--target", str(target), "--draft",
               str(draft), "--dtype", "float32", "--threads", "1", "--method", "sd"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "gave non-finite logits (NaN)" in err and "rms_norm_eps" in err and str(target) in err


def test_the_server_answers_500_naming_the_cause():
    """A NaN model is the server's fault, not the request's: HTTP 500 whose message names the cause; the server
    goes on answering."""
    import httpx

    from test_serve import Server

    target, draft = tiny_pair("close")
    s = Server(Decoder(_poisoned(target), draft, threads=1, costs=FLAT))
    try:
        for _ in range(2):
            r = httpx.post(s.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, "temperature": 0},
                           timeout=60)
            assert r.status_code == 500, r.text
            err = r.json()["error"]
            assert err["type"] == "server_error" and "gave non-finite logits (NaN)" in err["message"]
    finally:
        s.stop()

"""One default method, the same at every entry point (:data:`pacer.methods.DEFAULT_METHOD`)."""

from __future__ import annotations

import argparse
import inspect

import pytest

import pacer
from pacer import methods
from pacer.api import Decoder
from pacer.args import auto_method
from pacer.cli import DEMO_PROMPTS, build_parser
from pacer.methods import DEFAULT_METHOD, resolve_default
from pacer.methods.default import WITHOUT_LAYER
from pacer.request import GenerationRequest, MethodRequest
from pacer.serve.protocol import Defaults
from pacer.tiny import tiny_pair


def parsed(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_every_entry_point_defaults_to_the_one_constant():
    assert DEFAULT_METHOD in methods.names()
    for argv in (("generate", "hi"), ("demo",), ("serve",)):
        assert parsed(*argv).method == DEFAULT_METHOD, argv
    for fn in (Decoder.generate, pacer.generate, GenerationRequest.of, MethodRequest.of):
        assert inspect.signature(fn).parameters["method"].default == DEFAULT_METHOD, fn
    assert MethodRequest().method == DEFAULT_METHOD
    assert Defaults().request.method == DEFAULT_METHOD  # the OpenAI server's request default
    assert parsed("generate", "hi", "--method", "lookup").method == "lookup"  # --method overrides it


def args_for(method: str, draft: str = "default-draft", preverifier: str | None = None) -> argparse.Namespace:
    a = parsed("generate", "hi", "--method", method, "--draft", draft,
               *(("--preverifier", preverifier) if preverifier else ()))
    a.backend = "transformers"
    return a


def test_the_default_runs_without_its_layer_where_the_pair_has_none(tmp_path):
    assert resolve_default(DEFAULT_METHOD, True) == DEFAULT_METHOD
    assert resolve_default(DEFAULT_METHOD, False) == WITHOUT_LAYER[DEFAULT_METHOD] != DEFAULT_METHOD
    assert resolve_default("sd", False) == "sd"  # asked for: as is
    assert resolve_default("pacer+ouroboros", False) == "pacer+ouroboros"
    assert auto_method(args_for(DEFAULT_METHOD)) == DEFAULT_METHOD  # the shipped layer, the default draft
    assert auto_method(args_for("auto")) == DEFAULT_METHOD
    assert auto_method(args_for(DEFAULT_METHOD, draft=str(tmp_path))) == WITHOUT_LAYER[DEFAULT_METHOD]  # no layer
    assert auto_method(args_for(DEFAULT_METHOD, str(tmp_path), str(tmp_path))) == DEFAULT_METHOD  # one given
    assert auto_method(args_for("sd", draft=str(tmp_path))) == "sd"


def test_decoder_generate_runs_the_default_losslessly_on_a_pair_without_a_layer():
    dec = Decoder(*tiny_pair("close"), threads=1)
    res = dec.generate("hello world, this is hello world, this is", max_new_tokens=16)
    assert res.stats.method == WITHOUT_LAYER[DEFAULT_METHOD]  # the tiny pair has no shipped pre-verifier
    assert res.token_ids == dec.generate("hello world, this is hello world, this is", "ar", 16).token_ids


@pytest.mark.parametrize("kind, prompt", [p for p in DEMO_PROMPTS if "```python\ndef " in p[1]])
def test_the_demo_has_a_grounded_code_edit(kind, prompt):
    """The function to edit is given in the prompt, so its answer repeats the prompt's text."""
    body = prompt.split("```python\n", 1)[1].split("```", 1)[0]
    assert body.count("\n") >= 4 and "edit" in prompt.lower()


def test_the_demo_prompts_include_one_code_edit():
    assert sum("```python\ndef " in p for _, p in DEMO_PROMPTS) == 1

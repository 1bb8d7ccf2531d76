"""The Python API's boundary: every argument of :meth:`pacer.Decoder.generate`, :class:`pacer.SamplingConfig` and
:class:`pacer.LoadSpec` is checked before a model runs or loads. A wrong type raises a ``TypeError``, a refused
value a ``ValueError``; both are :class:`pacer.PacerError` (one line on the command line, HTTP 400 in the server).
A string ``stop`` is one stop string, as in OpenAI's API; an empty one is refused, as OpenAI's server does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pacer import LoadSpec, PacerError, SamplingConfig

PROMPT = "hello world, this is"


@pytest.fixture(scope="module")
def dec(pairs):
    return pairs["close"]


def refused(kind: type, words: str, f, *args, **kwargs) -> None:
    """``f(*args, **kwargs)`` raises ``kind`` (a TypeError or ValueError that is a PacerError) saying ``words``."""
    with pytest.raises(kind, match=words) as e:
        f(*args, **kwargs)
    assert isinstance(e.value, PacerError) and "\n" not in str(e.value), e.value


def test_a_string_stop_is_one_stop_string(dec):
    """``stop="A4"`` stops at "A4", never at "A" or at "4"; a list of strings is several stop strings."""
    ids = dec.tokenizer.encode("xAy4zA4w", add_special_tokens=False)
    assert dec.decode(ids, "A4") == "xAy4z"
    assert dec.decode(ids, ["4", "A4"]) == "xAy"
    assert dec.decode(ids, ("w",)) == "xAy4zA4"
    full = dec.generate(PROMPT, "ar", 24).text
    # a stop of two characters: its first is in the text, the pair is not: the text is not cut at all
    first = next(c for c in full if c.isprintable())
    second = next(c for c in "#%&~^|" if first + c not in full and c != first)
    assert first in full and dec.generate(PROMPT, "ar", 24, stop=first + second).text == full
    assert dec.generate(PROMPT, "sd", 24, stop=[first + second]).text == full
    cut = full[2:4]
    assert dec.generate(PROMPT, "ar", 24, stop=cut).text == full[:full.index(cut)]


@pytest.mark.parametrize("stop, kind, words", [
    ("", ValueError, "must not be empty"), ([""], ValueError, "must not be empty"),
    (["a", ""], ValueError, "must not be empty"), (5, TypeError, "stop must be a string"),
    ([5], TypeError, "stop must be a string"), (b"A4", TypeError, "stop must be a string"),
    ({"A": 4}, TypeError, "stop must be a string")])
def test_a_bad_stop_is_refused_before_the_models_run(dec, stop, kind, words, monkeypatch):
    monkeypatch.setattr(dec.pair, "encode", lambda *a, **k: pytest.fail("the prompt was read"))
    refused(kind, words, dec.generate, PROMPT, "ar", 8, stop=stop)
    refused(kind, words, dec.decode, [65, 66], stop)


@pytest.mark.parametrize("prompt, kind, words", [
    ([1, 2, 10**6], ValueError, "token id 1000000 is out of range"),
    ([-1, 2], ValueError, "token id -1 is out of range"),
    ([259], ValueError, "token id 259 is out of range: this model pair's token ids are 0 to 258"),
    ([1.5, 2], TypeError, "must be integers"), ([True, 2], TypeError, "must be integers"),
    (["a", "b"], TypeError, "must be integers"), ([[1, 2]], TypeError, "must be integers"),
    (b"AB", TypeError, "a string or a sequence of token ids"), (123, TypeError, "a string or a sequence"),
    (None, TypeError, "a string or a sequence"), ({1: 2}, TypeError, "a string or a sequence")])
def test_bad_token_ids_are_refused_not_an_index_error(dec, prompt, kind, words):
    """Ids below zero or from the vocabulary's size on raised IndexError deep in the model; floats were truncated
    and bytes taken as ids."""
    for method in ("ar", "sd", "lookup"):
        refused(kind, words, dec.generate, prompt, method, 4)
    refused(kind, words, dec.encode, prompt)


def test_token_ids_in_range_pass_as_they_are(dec):
    import numpy as np

    ids = dec.encode(PROMPT)
    assert dec.encode(ids) == ids and dec.encode(tuple(ids)) == ids
    assert dec.encode(np.array(ids)) == ids and dec.encode(torch.tensor(ids)) == ids
    assert dec.encode([0, 258]) == [0, 258]
    assert dec.generate(ids, "sd", 8).token_ids == dec.generate(PROMPT, "sd", 8).token_ids


@pytest.mark.parametrize("kwargs, kind, words", [
    ({"max_new_tokens": 4.0}, TypeError, "max_new_tokens must be an integer"),
    ({"max_new_tokens": "4"}, TypeError, "max_new_tokens must be an integer"),
    ({"max_new_tokens": 0}, ValueError, "max_new_tokens must be >= 1"),
    ({"sampling": {"temperature": 0}}, TypeError, "sampling must be a pacer.SamplingConfig"),
    ({"on_tokens": 5}, TypeError, "on_tokens must be a function"),
    ({"chat": "yes"}, TypeError, "chat must be true or false"),
    ({"chat": True, "history": ["x"]}, TypeError, "history message needs a string 'role'"),
    ({"chat": True, "history": [{"role": "user"}]}, TypeError, "history message needs a string 'role'"),
    ({"chat": True, "history": "x"}, TypeError, "history must be a list"),
    ({"options": [1]}, TypeError, "options must be a mapping"),
    ({"gamma": "3"}, TypeError, "option gamma takes int"),
    ({"gamma": 0}, ValueError, "option gamma must be >= 1"),
    ({"method": 5}, TypeError, "method must be a method's name"),
    ({"method": "warp"}, ValueError, "unknown method 'warp'"),
    ({"options": {"ngram": 3}}, ValueError, "takes no option 'ngram'"),
    ({"min_draft": 3, "max_draft": 2}, ValueError, "must not exceed"),
    ({"method": "oracle", "sampling": SamplingConfig(1.0)}, ValueError, "greedy decoding only"),
    # lookup_len 0 once turned phrase rounds off silently; sizes that allocate at once are bounded, the bound named
    ({"method": "ouroboros", "options": {"lookup_len": 0}}, ValueError, "option lookup_len must be >= 1"),
    ({"method": "ouroboros", "options": {"lookup_len": 10**9}}, ValueError, r"lookup_len must be <= 64 \(the most"),
    ({"method": "lookup", "options": {"ngram": 10**7}}, ValueError, "option ngram must be <= 64"),
    ({"method": "ouroboros", "options": {"pool_size": 10**12}}, ValueError, "option pool_size must be <= 200000"),
    ({"gamma": 10**6}, ValueError, "option gamma must be <= 256"),
    ({"max_new_tokens": True}, TypeError, "max_new_tokens must be an integer"),  # True is not 1
    ({"max_new_tokens": False}, TypeError, "max_new_tokens must be an integer"),
    # what the loop runs instead of the method's own: of their types, for a method that drafts
    ({"policy": "sd"}, TypeError, "policy must be a pacer.policies.base.DraftPolicy"),
    ({"policy": 4}, TypeError, "policy must be a pacer.policies.base.DraftPolicy"),
    ({"drafter": "draft"}, TypeError, "drafter must be a pacer.decoding.drafter.Drafter"),
    ({"method": "ar", "policy": "LATER"}, ValueError, "method 'ar' drafts nothing"),
    ({"method": "oracle", "reference": "abc"}, TypeError, r"reference \(the target's greedy token ids\)"),
    ({"method": "oracle", "reference": [1, 2.5]}, TypeError, "reference .*integers"),
    ({"method": "oracle", "reference": [1, 10**6]}, ValueError, "reference .*out of range"),
    ({"method": "oracle", "reference": 7}, TypeError, "reference")])
def test_generate_arguments_raise_type_or_value_errors(dec, kwargs, kind, words):
    if kwargs.get("policy") == "LATER":
        kwargs = {**kwargs, "policy": dec.make_policy("sd")}
    kwargs = {"method": "sd", **kwargs}
    refused(kind, words, dec.generate, PROMPT, **kwargs)


@pytest.mark.parametrize("kwargs, kind, words", [
    ({"temperature": "0.5"}, TypeError, "temperature must be a number"),
    ({"temperature": -1}, ValueError, "temperature must be a finite number >= 0"),
    ({"temperature": float("nan")}, ValueError, "temperature must be a finite number"),
    ({"top_k": 1.5}, TypeError, "top_k must be an integer"), ({"top_k": -1}, ValueError, "top_k must be >= 0"),
    ({"top_p": "1"}, TypeError, "top_p must be a number"), ({"top_p": 0}, ValueError, r"top_p must be in \(0, 1\]"),
    ({"seed": 1.5}, TypeError, "seed must be an integer"), ({"seed": None}, TypeError, "seed must be an integer"),
    ({"seed": 10**30}, ValueError, "seed must be between"), ({"seed": -(2**64)}, ValueError, "seed must be between")])
def test_sampling_settings_raise_type_or_value_errors(kwargs, kind, words):
    refused(kind, words, SamplingConfig, **kwargs)


def test_sampling_settings_in_range_work(dec):
    import numpy as np

    for cfg in (SamplingConfig(0.7, np.int64(5), 0.9, np.int64(3)), SamplingConfig(1, 0, 1, 2**64 - 1),
                SamplingConfig(1.0, seed=-(2**63))):
        assert dec.generate(PROMPT, "sd", 6, sampling=cfg).stats.new_tokens > 0


@pytest.mark.parametrize("kwargs, words", [
    ({"target": 123}, "target must be a model"), ({"target": None}, "target must be a model"),
    ({"draft": 1}, "draft must be a model"), ({"backend": 1}, "backend must be a str"),
    ({"dtype": torch.float32}, "dtype must be a str"), ({"threads": "2"}, "threads must be an integer"),
    ({"threads": 2.0}, "threads must be an integer"), ({"threads": True}, "threads must be an integer"),
    ({"device": 1}, "device must be"), ({"draft_quant": None}, "draft_quant must be a str"),
    ({"quantize": 8}, "quantize must be a str"), ({"draft_vocab": {"a": 1}}, "draft_vocab must be"),
    ({"progress": "no"}, "progress must be true or false")])
def test_load_spec_types_are_checked_before_anything_loads(kwargs, words, monkeypatch):
    from pacer import backends

    monkeypatch.setattr(backends, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    refused(TypeError, words, LoadSpec, **kwargs)
    from pacer import Decoder

    refused(TypeError, words, Decoder.from_pretrained, **kwargs)


@pytest.mark.parametrize("kwargs, words", [({"draft_vocab": "x"}, "draft_vocab must be auto"),
                                           ({"draft_vocab": 1.5}, "draft_vocab must be auto"),
                                           ({"draft_vocab": -3}, "draft_vocab must be auto")])
def test_load_spec_values_are_checked_before_anything_loads(kwargs, words):
    refused(ValueError, words, LoadSpec, **kwargs)


@pytest.mark.parametrize("backend", ["transformers", "llamacpp"])
@pytest.mark.parametrize("kwargs, words", [({"threads": 0}, "threads must be >= 1"),
                                           ({"threads": -2}, "threads must be >= 1"),
                                           ({"dtype": "float8"}, "dtype must be auto or one of"),
                                           ({"dtype": "bf16"}, "dtype must be auto or one of")])
def test_load_spec_resolves_no_zero_threads_and_no_unknown_dtype(kwargs, words, backend, tmp_path, monkeypatch):
    """``threads=0`` and a dtype no backend knows are refused when the spec is made or resolves (before anything
    loads), on every backend (llama.cpp, which has no dtype choice, too)."""
    from pacer import backends

    pytest.importorskip("llama_cpp") if backend == "llamacpp" else None
    monkeypatch.setattr(backends, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    refused(ValueError, words, lambda: LoadSpec(str(tmp_path / "t.gguf"), str(tmp_path / "d.gguf"),
                                                backend=backend, **kwargs).resolve())


def test_min_draft_equal_to_max_draft_is_a_fixed_length(dec):
    """``min_draft == max_draft`` is allowed (a fixed length between equal bounds): every round after the prefill
    but one cut by the budget drafts exactly that many tokens, with and without the cost-aware rule."""
    for method, kw in (("sd", {"gamma": 3}), ("heuristic", {}), ("confidence", {"cost_aware": False})):
        res = dec.generate(PROMPT, method, 24, min_draft=3, max_draft=3, **kw)
        assert set(res.stats.draft_lengths[1:-1]) == {3}, (method, res.stats.draft_lengths)  # (0: the prefill)
        assert res.token_ids == dec.generate(PROMPT, "ar", 24).token_ids


def test_load_spec_takes_a_path(tmp_path):
    spec = LoadSpec(target=Path(tmp_path / "t.gguf"), draft=tmp_path / "d.gguf")
    assert spec.target == str(tmp_path / "t.gguf") and spec.draft == str(tmp_path / "d.gguf")


def test_a_phrase_drafter_made_in_code_refuses_lookup_len_0(dec):
    """lookup_len 0 would turn the generation's own phrase rounds off silently: the drafter refuses it too."""
    from pacer.drafters.phrase import PhraseDrafter, PhraseOptions

    with pytest.raises(PacerError, match="lookup_len >= 1"):
        PhraseDrafter(dec.pair.draft_backend(None), dec.pair.vocab, PhraseOptions(lookup_len=0))

"""A new backend is one file and one record: a toy backend registered here (and nowhere else) - a pure-Python
model (the fake of ``test_backend.py``), a character tokenizer and its :class:`pacer.backends.Backend` record -
runs ``pacer generate`` and ``pacer bench --quick`` with no other change, token for token as plain decoding."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch

from pacer import backends, models
from pacer.cli import main
from test_backend import FakeBackend, V


class CharTokenizer:
    """Characters a..q, one token each (ids 0..16): just what pacer asks of a tokenizer."""

    eos_token_id = None
    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [(ord(c) - 97) % V for c in text if c.isalpha()] or [0]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(97 + int(i) % V) for i in ids)

    def get_vocab(self) -> dict:
        return {chr(97 + i): i for i in range(V)}

    def __len__(self) -> int:
        return V


@dataclass
class ToyModel(models.LoadedModel):
    """A toy model: the fake backend's deterministic logits, salted by the model's name (the draft agrees with the
    target on 70% of contexts)."""

    backend = "toy"

    def open(self, rows=None):
        salt = self.extra["salt"]
        return FakeBackend(salt=salt, agree_with=1 if salt != 1 else None, agree=0.7)

    @property
    def vocab_size(self) -> int:
        return V

    @property
    def layers(self) -> int:
        return 2

    @property
    def hidden_size(self) -> int:
        return 4

    @property
    def weights(self) -> str:
        return "toy"

    @property
    def dtype_name(self) -> str:
        return "toy"

    def end_ids(self) -> set[int]:
        return set()

    def describe(self) -> dict:
        return {"backend": self.backend, "source": self.source, "fingerprint": self.fingerprint, "dtype": "toy"}


def _load(spec: str, dtype: str, home, progress: bool) -> ToyModel:
    return ToyModel(None, CharTokenizer(), spec, f"toy:{spec}", torch.float32,
                    extra={"salt": 1 if spec == "toy-target" else 2})


def _refuses(spec: str | None) -> str | None:
    ok = spec in (None, "toy-target", "toy-draft")
    return None if ok else f"the toy backend runs toy-target/toy-draft, not {spec}"


TOY = backends.Backend("toy", "a toy backend: the fake model of test_backend.py", _load, lambda: "toy 1.0",
                       refuses=_refuses)


@pytest.fixture
def toy(tmp_path, monkeypatch):
    monkeypatch.setenv("PACER_HOME", str(tmp_path / "home"))  # the toy's calibration is cached there
    backends.register(TOY)
    yield TOY
    backends.unregister(TOY.name)


ARGS = ["--backend", "toy", "--target", "toy-target", "--draft", "toy-draft", "--threads", "1"]


def test_a_registered_backend_runs_pacer_generate(toy, capsys):
    def run(*extra: str) -> dict:
        assert main(["generate", "abcabc", "--json", "--max-new-tokens", "24", *ARGS, *extra]) == 0
        return json.loads(capsys.readouterr().out)

    ar = run("--method", "ar")
    sd = run("--method", "sd", "--gamma", "3")
    assert sd["token_ids"] == ar["token_ids"] and len(ar["token_ids"]) == 24
    assert sd["stats"]["draft_tokens"] > 0 and sd["stats"]["accepted_tokens"] > 0
    # what the record says it cannot do is refused before anything loads, in one line
    assert main(["generate", "abc", "--quantize", "int8", *ARGS]) == 2
    assert "the toy backend runs the model file's own quantization" in capsys.readouterr().err
    assert main(["generate", "abc", "--draft-vocab", "8", *ARGS]) == 2
    assert "the toy backend scores the whole vocabulary" in capsys.readouterr().err
    assert main(["generate", "abc", "--backend", "toy", "--target", "elsewhere", "--draft", "toy-draft"]) == 2
    assert "runs toy-target/toy-draft, not elsewhere" in capsys.readouterr().err


def test_a_registered_backend_runs_pacer_bench_quick(toy, tmp_path, capsys):
    out = tmp_path / "bench"
    assert main(["bench", "--quick", "--n", "1", "--max-new-tokens", "8", "--no-progress", "--out", str(out),
                 "--methods", "ar,sd:gamma=2,entropy", *ARGS]) == 0
    recs = [json.loads(x) for x in (out / "answers.jsonl").read_text().splitlines()]
    assert {r["method"] for r in recs} == {"ar", "sd:gamma=2", "entropy"}
    assert all(r["lossless"] for r in recs if r["method"] != "ar")
    meta = json.loads((out / "run.json").read_text())
    assert meta["backend"] == "toy" and meta["target"] == "toy-target"

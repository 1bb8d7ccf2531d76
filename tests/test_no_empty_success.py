"""No empty or poisoned success: a collection that would collect nothing, a training that would write NaN weights, a
checkpoint of NaN weights and a model config transformers refuses each end in one line naming the cause (exit 2 on
the command line), before the work where the cause is known then."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from pacer import PacerError
from pacer.cli import main
from pacer.preverify.collect import collect
from pacer.preverify.features import FeatureSpec
from pacer.preverify.train import train
from test_preverify import synthetic_collection


def _small_mix(monkeypatch, per_category: int = 2):
    import pacer.data.mix as mix

    pools = {c: [mix.TrainingPrompt(f"question {c} {i}: say something", c, "test") for i in range(per_category)]
             for c in mix.CATEGORIES}
    monkeypatch.setattr(mix, "candidate_pools", lambda: pools)
    monkeypatch.setattr(mix, "benchmark_texts", lambda: ["a benchmark question"])
    return sum(len(p) for p in pools.values())


def test_a_collection_whose_answers_leave_no_room_for_a_prompt_is_refused_before_it_starts(close, tmp_path,
                                                                                            monkeypatch):
    """The tiny target's context is 512 tokens: 500 new tokens and 16 drafted leave no prompt room (once: an empty
    collection and exit 0)."""
    _small_mix(monkeypatch)
    context = close.target.context
    for max_new, max_draft in ((context, 4), (context - 20, 16), (10**6, 1)):
        out = tmp_path / f"c{max_new}-{max_draft}"
        with pytest.raises(PacerError, match="leave no room for a prompt") as e:
            collect(close, out, n_prompts=2, max_new_tokens=max_new, spec=FeatureSpec((-2, -1), 64, max_draft),
                    progress=False)
        assert f"context of {context} tokens" in str(e.value) and "\n" not in str(e.value)
        assert not out.exists()  # nothing made


def test_a_skip_past_the_mix_is_refused_before_it_collects(close, tmp_path, monkeypatch):
    total = _small_mix(monkeypatch)
    spec = FeatureSpec((-2, -1), 64, 4)
    for skip in (total, total + 5, 10**5):
        out = tmp_path / f"s{skip}"
        with pytest.raises(PacerError, match=f"--skip {skip} leaves none to collect") as e:
            collect(close, out, n_prompts=2, max_new_tokens=8, spec=spec, skip=skip, progress=False)
        assert "\n" not in str(e.value) and not out.exists()
    m = collect(close, tmp_path / "ok", n_prompts=2, max_new_tokens=8, spec=spec, skip=total - 1, progress=False)
    assert m["prompts_done"] == 1 and m["tokens"] > 0  # the last prompt of the mix is still collected


def test_the_command_refuses_a_collection_that_recorded_no_token(close, tmp_path, monkeypatch, capsys):
    """A collection whose every prompt ended before a round (here: a decoder whose target ends at once) is not a
    success: exit 2 naming it."""
    import pacer.args
    import pacer.preverify.collect as collect_mod

    _small_mix(monkeypatch)
    monkeypatch.setattr(pacer.args, "load_decoder", lambda args, request=None: close)
    real = collect_mod.collect

    def nothing(*a, **kw):
        m = real(*a, **kw)
        return {**m, "tokens": 0}

    monkeypatch.setattr(collect_mod, "collect", nothing)
    rc = main(["collect", "--out", str(tmp_path / "c"), "--n", "1", "--max-new-tokens", "4", "--layers", "-2,-1"])
    last = capsys.readouterr().err.strip().splitlines()[-1]  # (after the progress bar)
    assert rc == 2 and last.startswith("pacer: error: pacer collect recorded no draft token from 1 prompt"), last


@pytest.mark.parametrize("weight", ["nan", "inf", "-inf", "-1"])
def test_a_token_weight_that_is_not_a_finite_number_is_refused_before_training(weight, tmp_path, capsys):
    data = synthetic_collection(tmp_path / "data", rounds=20)
    rc = main(["train", "--data", str(data), "--out", str(tmp_path / "ckpt"), f"--token-weight={weight}"])
    err = capsys.readouterr().err
    assert rc == 2 and "--token-weight must be a finite number >= 0" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "ckpt").exists()
    with pytest.raises(PacerError, match="--token-weight must be a finite number"):
        train(data, None, "pacer", token_weight=float(weight), log=None)


@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
def test_a_training_whose_loss_is_not_finite_stops_with_no_checkpoint(poison, tmp_path):
    """Non-finite features (a float16 hidden state that overflowed) make the loss NaN: training stops naming it."""
    data = synthetic_collection(tmp_path / "data", rounds=60)
    shard = data / "shard-00000.safetensors"
    tensors = load_file(str(shard))
    tensors["hidden"][::7, 3] = poison
    save_file(tensors, str(shard))
    for kind in ("pacer", "specdecpp"):
        with pytest.raises(PacerError, match="training diverged: the loss is (nan|inf) at epoch 1") as e:
            train(data, tmp_path / f"ckpt-{kind}", kind, block=2, epochs=2, log=None, check_seconds=1e-4)
        assert "\n" not in str(e.value)
        assert not (tmp_path / f"ckpt-{kind}" / "weights.safetensors").exists()


def test_weights_that_become_non_finite_stop_training(tmp_path, monkeypatch):
    """A finite loss is not enough: weights that overflow during a step are caught at the epoch's end."""
    import pacer.preverify.train as tr

    data = synthetic_collection(tmp_path / "data", rounds=40)
    real_step = torch.optim.AdamW.step

    def poisoned(self, *a, **kw):
        out = real_step(self, *a, **kw)
        with torch.no_grad():
            next(iter(self.param_groups[0]["params"])).fill_(float("inf"))
        return out

    monkeypatch.setattr(torch.optim.AdamW, "step", poisoned)
    with pytest.raises(PacerError, match=r"weight \S+ is not finite after epoch 1"):
        tr.train(data, tmp_path / "ckpt", "pacer", block=2, epochs=1, log=None, check_seconds=1e-4)


def test_a_checkpoint_of_non_finite_weights_is_refused_when_loaded(close, tmp_path, capsys):
    from pacer.policies.learned import load_checkpoint, make_learned_policy, read_config, write_config

    data = synthetic_collection(tmp_path / "data", rounds=40)
    ckpt = tmp_path / "ckpt"
    train(data, ckpt, "pacer", block=2, epochs=1, log=None, check_seconds=1e-4)
    load_checkpoint(ckpt)  # sound
    w = ckpt / "weights.safetensors"
    tensors = load_file(str(w))
    name = next(k for k in tensors if k.startswith("model.") and tensors[k].is_floating_point())
    tensors[name] = torch.full_like(tensors[name], float("nan"))
    save_file(tensors, str(w))
    cfg, _ = read_config(ckpt)  # a checkpoint written whole by a trainer that made NaN weights: checksums agree
    write_config(ckpt, {**cfg, "weights_sha256": hashlib.sha256(w.read_bytes()).hexdigest()})
    with pytest.raises(PacerError, match=f"holds non-finite weights \\({name}") as e:
        load_checkpoint(ckpt)
    assert "\n" not in str(e.value)
    with pytest.raises(PacerError, match="non-finite weights"):
        make_learned_policy("pacer", ckpt, None, {}, {}, None)


@pytest.mark.parametrize("edit,words", [
    ({"num_hidden_layers": 1}, "its config.json is refused by transformers: `num_hidden_layers` (1) must be equal"),
    ({"layer_types": ["full_attention"]}, "its config.json is refused by transformers"),
    ({"num_hidden_layers": 0}, "its config.json's num_hidden_layers is 0, not a whole number >= 1"),
    ({"hidden_size": 0}, "its config.json's hidden_size is 0"),  # once a ZeroDivisionError from inside the model
    ({"vocab_size": 0}, "its config.json's vocab_size is 0"),  # once an AssertionError
    ({"num_attention_heads": 0}, "its config.json's num_attention_heads is 0"),
    ({"intermediate_size": True}, "its config.json's intermediate_size is True"),
])
def test_a_model_config_transformers_refuses_is_one_line(edit, words, tmp_path, capsys, monkeypatch):
    from pacer.tiny import save_tiny_pair

    monkeypatch.setenv("PACER_HOME", str(tmp_path / "home"))
    target, draft = save_tiny_pair(tmp_path / "pair")
    capsys.readouterr()  # (transformers' own progress while saving)
    cfg = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**cfg, **edit}))
    rc = main(["generate", "hello", "--target", str(target), "--draft", str(draft), "--max-new-tokens", "2",
               "--dtype", "float32", "--threads", "1"])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert words in lines[0], err


@pytest.mark.parametrize("rounds,words", [(0, "holds no draft token"), (5, "holds 1 prompt\\(s\\): too few")])
def test_a_collection_too_small_to_train_and_validate_on_is_refused(rounds, words, tmp_path):
    """Once: 0 rounds was a RuntimeError from inside torch; one prompt (all of it held out) wrote an untrained layer
    with a threshold chosen on nothing."""
    data = synthetic_collection(tmp_path / "data", rounds=rounds)  # 5 rounds a prompt
    with pytest.raises(PacerError, match=words) as e:
        train(data, tmp_path / "ckpt", "pacer", block=2, epochs=1, log=None, check_seconds=1e-4)
    assert "\n" not in str(e.value) and not (tmp_path / "ckpt" / "weights.safetensors").exists()

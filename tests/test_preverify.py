"""PACER pipeline on tiny models: collect -> train -> load, the policies' exactness, and every refusal."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from pacer import PacerError, SamplingConfig
from pacer.policies import DraftState, FixedPolicy, RoundResult
from pacer.policies.learned import PacerPolicy, SpecDecPPPolicy, load_checkpoint, make_learned_policy
from pacer.preverify.collect import Recorder, collect, load_dataset
from pacer.preverify.features import SCALAR_NAMES, TARGET_SCALARS, FeatureSpec
from pacer.preverify.layer import PrefixState, PreVerifier, TokenHead, param_count
from pacer.preverify.train import Costs, roc_auc, simulate, stop_lengths, train

COSTS = Costs(draft=0.1, target={1: 0.3, 8: 0.32, 16: 0.4, 24: 0.5})
#: the synthetic collections' scalars are noise: the first nine (the draft-side ones) keep the tests' noise draws fixed
SPEC = FeatureSpec(hidden_layers=(-2, -1), hidden_size=64, max_draft=8, scalar_names=SCALAR_NAMES[:9])


def synthetic_collection(folder: Path, rounds: int = 300, seed: int = 0, fingerprint: str = "tiny-draft") -> Path:
    """Rounds whose acceptance is decided by one hidden direction: a separable problem with known answer."""
    g = torch.Generator().manual_seed(seed)
    M, D = SPEC.max_draft, SPEC.hidden_dim
    hidden = torch.randn(rounds, M, D, generator=g)
    good = hidden[..., 0] > -0.3  # the direction that decides acceptance
    hidden[..., 0] *= 4  # a clear signal among 127 noise dimensions
    acc = torch.cumprod(good.long(), 1)  # accepted = this and every earlier token good
    n_star = acc.sum(1)
    idx = torch.arange(1, M + 1).expand(rounds, M)
    data = {
        "hidden": hidden.reshape(-1, D).half(),
        "scalars": torch.rand(rounds * M, len(SPEC.scalar_names), generator=g),
        "accepted": acc.reshape(-1).to(torch.uint8),
        "cond_valid": (idx <= n_star[:, None] + 1).reshape(-1).to(torch.uint8),
        "soft": acc.reshape(-1).float(),
        "position": idx.reshape(-1).to(torch.int16),
        "round": torch.arange(rounds).repeat_interleave(M).to(torch.int32),
        "prompt": (torch.arange(rounds) // 5).repeat_interleave(M).to(torch.int32),
    }
    folder.mkdir(parents=True, exist_ok=True)
    save_file(data, str(folder / "shard-00000.safetensors"))
    manifest = {"target": "tiny-target", "draft": fingerprint, "feature_spec": SPEC.to_dict(), "seed": seed,
                "shards": ["shard-00000.safetensors"], "prompts_done": rounds // 5, "costs": COSTS.to_dict()}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_training_on_separable_features_reaches_high_auc(tmp_path):
    """Stated bound: block-pass ROC-AUC >= 0.9 on held-out prompts (a constant or random scorer gets ~0.5)."""
    data = synthetic_collection(tmp_path / "data", rounds=600)
    cfg = train(data, tmp_path / "ckpt", "pacer", block=2, epochs=15, seed=0, d=32, log=None)
    assert cfg["validation"]["auc"] >= 0.9, cfg["validation"]
    assert cfg["params"] == param_count(load_checkpoint(tmp_path / "ckpt")[0])
    # under the cost model the chosen threshold gains over plain decoding, and no length policy beats the oracle
    v = cfg["validation"]
    assert 1.0 < v["predicted_speedup"] <= v["oracle_predicted_speedup"] + 1e-9
    assert v["predicted_speedup"] >= 0.97 * v["best_fixed_predicted_speedup"]
    head = train(data, tmp_path / "spp", "specdecpp", epochs=15, seed=0, d=32, log=None)
    assert head["validation"]["auc"] >= 0.9, head["validation"]


def test_layer_must_beat_its_own_scalar_inputs_where_only_hidden_states_know(tmp_path):
    """Validation test of training: where acceptance is written in the hidden states and the scalar
    features (the rules' inputs) are noise, the layer's survival AUC and predicted speedup must beat the
    features-only model and the rules by a clear margin - a layer that ignored its hidden inputs fails this."""
    data = synthetic_collection(tmp_path / "data", rounds=600)
    v = train(data, None, "pacer", block=1, epochs=15, seed=0, d=32, log=None, check_seconds=1e-4)["validation"]
    auc = v["survival_auc"]
    # (the position alone ranks survival through later tokens lower: the noise features still get ~0.8)
    assert auc["layer-per-token"] >= 0.95, auc
    assert all(auc["layer-per-token"] - auc[k] >= 0.1 for k in ("features-only", "entropy", "confidence")), auc
    # a bad token shows only once drafted (each is good with probability ~0.6, independently), so even a perfect
    # scorer gains ~6% over the rules here; a layer blind to its hidden inputs gains nothing
    for profile in ("flat", "gpu"):
        c = v["compare"][profile]
        assert min(c["vs_features-only"], c["vs_entropy"], c["vs_confidence"]) > 1.03, c
        assert c["layer"]["predicted_speedup"] <= c["oracle"]["predicted_speedup"] + 1e-9
    assert set(v["compare"]) == {"measured", "flat", "linear", "gpu"} and 0 <= v["ece"] <= 1


def test_sampled_rounds_train_on_soft_survival():
    """A sampled round's survival target is the running product of min(1, p/q); a greedy round's is its hard label,
    and its per-token target is defined only where the prefix was accepted."""
    from pacer.preverify.train import to_rounds

    data = {"hidden": torch.zeros(6, 2), "scalars": torch.zeros(6, 1), "position": torch.tensor([1, 2, 3] * 2),
            "round": torch.tensor([0, 0, 0, 1, 1, 1]), "prompt": torch.tensor([0, 0, 0, 1, 1, 1]),
            "accepted": torch.tensor([1, 0, 0, 1, 1, 0]), "cond_valid": torch.tensor([1, 1, 0, 1, 1, 1]),
            "soft": torch.tensor([0.9, 0.5, 0.4, 1.0, 0.8, 0.5]), "temperature": torch.tensor([0.0] * 3 + [0.7] * 3),
            "category": torch.tensor([0] * 6)}
    r = to_rounds(data, 3)
    assert r.survival().tolist() == [[1.0, 0.0, 0.0], pytest.approx([1.0, 0.8, 0.4])]
    y, mask = r.token_targets()
    assert y[1].tolist() == pytest.approx([1.0, 0.8, 0.5]) and mask.tolist() == [[True, True, False], [True] * 3]


def test_training_is_reproducible(tmp_path):
    data = synthetic_collection(tmp_path / "data", rounds=100)
    # the policy check's cost is a timing (it moves the cost-optimal threshold run to run): pin it
    a = train(data, tmp_path / "a", "pacer", block=4, epochs=3, seed=1, log=None, check_seconds=1e-4)
    b = train(data, tmp_path / "b", "pacer", block=4, epochs=3, seed=1, log=None, check_seconds=1e-4)
    assert a["validation"] == b["validation"] and a["sweep"] == b["sweep"]
    wa, wb = load_file(tmp_path / "a" / "weights.safetensors"), load_file(tmp_path / "b" / "weights.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    c = train(data, None, "pacer", block=4, epochs=3, seed=2, log=None, check_seconds=1e-4)
    assert c["sweep"] != a["sweep"]  # another seed trains another layer: the comparison above can fail


def test_auc_and_cost_model_arithmetic():
    assert roc_auc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1])) == pytest.approx(0.75)
    c = Costs(0.1, {1: 0.3, 8: 0.3})
    # one round, 4 drafted, 2 accepted: 3 tokens for 0.4 + 0.3 seconds; plain decoding 0.3 s a token
    assert simulate(np.array([4]), np.array([2]), c) == pytest.approx(3 / 0.7 * 0.3)
    # block scores [0.9, 0.2, 0.9]: stop after the failing second block of 2 tokens
    assert stop_lengths(np.array([[0.9, 0.2, 0.9]]), np.array([6]), 2, 0.5, 1).tolist() == [4]
    assert stop_lengths(np.array([[0.9, 0.9, 0.9]]), np.array([6]), 2, 0.5, 1).tolist() == [6]


def test_collect_then_train_then_load_on_tiny_models(tmp_path, close, monkeypatch):
    import pacer.data.mix as mix

    # a prompt longer than the tiny model's 512-token context is refused and counted, not fatal (the mix's own
    # choices and its benchmark guard are tested in test_mix.py)
    pools = {c: [mix.TrainingPrompt(f"far too long {c} " * 100, c, "test")] +
             [mix.TrainingPrompt(f"question {c} {i}: say something", c, "test") for i in range(3)]
             for c in mix.CATEGORIES}
    monkeypatch.setattr(mix, "candidate_pools", lambda: pools)
    monkeypatch.setattr(mix, "benchmark_texts", lambda: ["a benchmark question"])
    spec = FeatureSpec((-2, -1), 64, 6)
    m = collect(close, tmp_path / "data", n_prompts=4, max_new_tokens=12, spec=spec, shard_size=2, progress=False,
                temperatures=(0.0, 1.0))
    assert m["prompts_done"] == 4 and len(m["shards"]) == 2 and m["tokens"] > 0 and m["temperatures"] == [0.0, 1.0]
    assert m["mix"]["taken"] == dict.fromkeys(mix.CATEGORIES, 1) and m["mix"]["benchmark_overlap_dropped"] == 0
    # resumable: asking for more prompts continues where it stopped, same settings
    m2 = collect(close, tmp_path / "data", n_prompts=6, max_new_tokens=12, spec=spec, shard_size=2, progress=False,
                 temperatures=(0.0, 1.0))
    assert m2["prompts_done"] == 6 and len(m2["shards"]) == 3
    with pytest.raises(PacerError, match="other settings"):
        collect(close, tmp_path / "data", n_prompts=6, max_new_tokens=12, spec=spec, progress=False)
    with pytest.raises(PacerError, match="other settings"):
        collect(close, tmp_path / "data", n_prompts=6, max_new_tokens=20, spec=spec, progress=False,
                temperatures=(0.0, 1.0))
    made = json.loads((tmp_path / "data" / "manifest.json").read_text())
    assert made["dtype"] == "float32"  # the tiny pair's weights; another dtype (--dtype auto elsewhere) is refused
    (tmp_path / "data" / "manifest.json").write_text(json.dumps({**made, "dtype": "bfloat16"}))
    with pytest.raises(PacerError, match="other settings"):
        collect(close, tmp_path / "data", n_prompts=6, max_new_tokens=12, spec=spec, progress=False,
                temperatures=(0.0, 1.0))
    (tmp_path / "data" / "manifest.json").write_text(json.dumps(made))
    data, manifest = load_dataset(tmp_path / "data")
    assert data["hidden"].shape[1] == 128 and set(data["accepted"].unique().tolist()) <= {0, 1}
    assert len(data["round"].unique()) == m2["rounds"]
    # prompt i was decoded at temperatures[i % 2]; categories follow the round-robin mix
    for pid in data["prompt"].unique().tolist():
        rows = data["prompt"] == pid
        assert data["temperature"][rows].unique().tolist() == [(0.0, 1.0)[pid % 2]]
    assert set(data["category"].unique().tolist()) == {0, 1, 2, 3}
    # two collections (e.g. made in parallel with different skips) load as one, ids kept unique
    m3 = collect(close, tmp_path / "data_b", n_prompts=2, max_new_tokens=12, spec=spec, shard_size=2, skip=6,
                 progress=False, temperatures=(0.0, 1.0))
    both, mb = load_dataset(f"{tmp_path / 'data'},{tmp_path / 'data_b'}")
    assert len(both["round"].unique()) == m2["rounds"] + m3["rounds"] and mb["prompts_done"] == 8
    assert len(both["prompt"].unique()) == 8
    manifest["costs"] = COSTS.to_dict()
    (tmp_path / "data" / "manifest.json").write_text(json.dumps(manifest))
    cfg = train(tmp_path / "data", tmp_path / "ckpt", "pacer", block=2, epochs=2, log=None)
    pol = make_learned_policy("pacer", tmp_path / "ckpt", close.draft_info.fingerprint, {}, {},
                              close.draft_info)
    ids = close.encode("hello world")
    ar = close.generate(ids, "ar", max_new_tokens=30)
    res = close.generate(ids, "pacer", max_new_tokens=30, policy=pol)
    assert res.token_ids == ar.token_ids and cfg["block"] == 2
    assert pol.needs_target_state  # the default features read the target's previous verification
    # a checkpoint without some scalars reads only the rest, live too; the ablation retrains without each group
    cfg = train(tmp_path / "data", tmp_path / "ckpt2", "pacer", block=2, epochs=2, log=None,
                drop_scalars=TARGET_SCALARS, ablate=("round-history", "target-state"))
    assert not set(TARGET_SCALARS) & set(cfg["feature_spec"]["scalar_names"])
    assert set(cfg["ablation"]) == {"round-history"}  # the target-state scalars are not read: nothing to drop
    assert cfg["ablation"]["round-history"]["dropped"] == ["prev_ratio", "ema_ratio"]
    assert set(cfg["rules"]) == {"confidence", "entropy", "cumprob"}  # the rules still read the draft's scalars
    pol = make_learned_policy("pacer", tmp_path / "ckpt2", close.draft_info.fingerprint, {}, {}, close.draft_info)
    assert not pol.needs_target_state
    assert close.generate(ids, "pacer", max_new_tokens=30, policy=pol).token_ids == ar.token_ids
    with pytest.raises(PacerError, match="not recorded"):
        train(tmp_path / "data", None, "pacer", epochs=1, log=None, drop_scalars=("no_such",))
    with pytest.raises(PacerError, match="unknown ablation group"):
        train(tmp_path / "data", None, "pacer", epochs=1, log=None, ablate=("nothing",))


def test_collect_train_and_load_with_the_target_hidden_state(tmp_path, close, monkeypatch):
    """A collection with ``target_hidden`` records, once per round, the target's hidden state the round's features
    saw (the previous round's ``RoundResult.target_hidden``; zeros at a generation's first round); training appends
    it to every token's hidden states, its ablation drops it, and the checkpoint reads it live, losslessly."""
    import pacer.data.mix as mix

    pools = {c: [mix.TrainingPrompt(f"question {c} {i}: say something", c, "test") for i in range(2)]
             for c in mix.CATEGORIES}
    monkeypatch.setattr(mix, "candidate_pools", lambda: pools)
    monkeypatch.setattr(mix, "benchmark_texts", lambda: ["a benchmark question"])
    H = close.target_info.hidden_size
    spec = FeatureSpec((-2, -1), 64, 6, target_hidden=H)
    seen: list[RoundResult] = []
    real = Recorder.update

    def spy(self, state, result):  # the Recorder's results, in order
        seen.append(result)
        return real(self, state, result)

    monkeypatch.setattr(Recorder, "update", spy)
    m = collect(close, tmp_path / "data", n_prompts=2, max_new_tokens=12, spec=spec, shard_size=2, progress=False,
                temperatures=(0.0, 1.0))
    monkeypatch.undo()
    assert m["feature_spec"]["target_hidden"] == H
    data, _ = load_dataset(tmp_path / "data")
    t, rid = data["round_target_hidden"].float(), data["round_target_id"]
    assert t.shape == (m["rounds"], H) == (len(seen), H) and rid.tolist() == sorted(data["round"].unique().tolist())
    prompt_of = {int(r): int(p) for r, p in zip(data["round"], data["prompt"], strict=True)}
    for i in range(len(seen)):
        first = i == 0 or prompt_of[i] != prompt_of[i - 1]
        want = torch.zeros(H) if first else seen[i - 1].target_hidden
        torch.testing.assert_close(t[i], want, atol=2e-3, rtol=2e-3)  # stored as float16
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    (tmp_path / "data" / "manifest.json").write_text(json.dumps({**manifest, "costs": COSTS.to_dict()}))
    cfg = train(tmp_path / "data", tmp_path / "ckpt", "pacer", block=2, epochs=2, log=None, ablate=("target-hidden",))
    assert cfg["feature_spec"]["target_hidden"] == H
    assert cfg["ablation"]["target-hidden"]["dropped"] == [f"target hidden state ({H} values)"]
    model, _, _, _ = load_checkpoint(tmp_path / "ckpt")
    assert model.norm_h.normalized_shape == (128 + H,)
    pol = make_learned_policy("pacer", tmp_path / "ckpt", close.draft_info.fingerprint, {}, {}, close.draft_info,
                              close.target_info)
    assert pol.needs_target_hidden
    other = type("Other", (), {"fingerprint": "another-target", "hidden_size": H})()
    with pytest.raises(PacerError, match="hidden state of target model"):
        make_learned_policy("pacer", tmp_path / "ckpt", close.draft_info.fingerprint, {}, {}, close.draft_info, other)
    fed = []
    extend = pol.model.extend
    monkeypatch.setattr(pol.model, "extend", lambda memo, h, s: fed.append(h) or extend(memo, h, s))
    ids = close.encode("hello world")
    ar = close.generate(ids, "ar", max_new_tokens=30)
    assert close.generate(ids, "pacer", max_new_tokens=30, policy=pol).token_ids == ar.token_ids
    assert fed and all(h.shape[1] == 128 + H for h in fed)
    assert abs(fed[0][:, 128:]).sum() == 0 and any(abs(h[:, 128:]).sum() > 0 for h in fed[1:])
    plain = train(tmp_path / "data", None, "pacer", block=2, epochs=1, log=None, target_hidden=False)
    assert "target_hidden" not in plain["feature_spec"]


class TargetStateProbe(FixedPolicy):
    """A fixed-γ policy that keeps every round's result."""

    def __init__(self, needs: bool, hidden: bool = False) -> None:
        super().__init__(gamma=4)
        self.needs_target_state = needs
        self.needs_target_hidden = hidden
        self.results: list[RoundResult] = []

    def update(self, state, result) -> None:
        self.results.append(result)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_target_state_is_the_target_distribution_at_the_accepted_and_bonus_positions(close, temperature):
    """``RoundResult.target_entropy / target_margin`` hold, per round, the entropy and top-2 margin of the target's
    temperature-1 distribution at the positions of d_1..d_n and at the bonus position (checked against one plain
    target forward over the output), and nothing for a policy that does not ask for them."""
    ids = close.encode("def f(x):\n    return")
    probe = TargetStateProbe(needs=True)
    res = close.generate(ids, "sd", max_new_tokens=24, policy=probe,
                         sampling=SamplingConfig(temperature=temperature, seed=3))
    target = close.target
    target.reset()
    logits, _ = target.forward(ids + res.token_ids, keep=0)
    logp = torch.log_softmax(logits.float(), -1)
    entropy = -(logp.exp() * logp).sum(-1)
    top2 = logp.exp().topk(2, -1).values
    margin = top2[:, 0] - top2[:, 1]
    # the first token of a round is predicted at row start - 1; the prefill gave the first token before any round
    start = len(ids) + 1
    for r in probe.results:
        n = r.accepted
        assert len(r.target_entropy) == len(r.target_margin) == n + 1
        rows = slice(start - 1, start + n)
        assert r.target_entropy == pytest.approx(entropy[rows].tolist(), abs=1e-3)
        assert r.target_margin == pytest.approx(margin[rows].tolist(), abs=1e-3)
        start += r.committed
    plain = TargetStateProbe(needs=False)
    close.generate(ids, "sd", max_new_tokens=24, policy=plain)
    assert all(r.target_entropy == [] and r.target_margin == [] for r in plain.results)
    assert all(r.target_hidden is None for r in plain.results)


@pytest.mark.parametrize(("method", "temperature"), [("sd", 0.0), ("sd", 1.0), ("ouroboros", 0.0)])
def test_target_hidden_is_the_final_state_where_the_bonus_token_was_predicted(close, method, temperature):
    """``RoundResult.target_hidden`` is the target's final hidden state at the row whose distribution gave the
    round's last committed token (checked against one plain forward over the output), for rounds that accepted
    everything, some or nothing, and for rounds that a candidate branch (Ouroboros' siblings) extended."""
    from pacer.drafters.pool import clear_shared_pools

    clear_shared_pools()
    extended = 0
    for text in ("def f(x):\n    return", "The quick brown fox jumps over the lazy dog. The quick brown"):
        ids = close.encode(text)
        probe = TargetStateProbe(needs=False, hidden=True)
        res = close.generate(ids, method, max_new_tokens=32, policy=probe, options={"siblings": 4, "candidates": 2}
                             if method == "ouroboros" else None, sampling=SamplingConfig(temperature=temperature,
                                                                                         seed=3))
        target = close.target
        target.reset()
        _, hs = target.forward(ids + res.token_ids, keep=1, hidden=True)
        final = hs[-1].float()
        start = len(ids) + 1  # the prefill gave the first token before any round
        assert len({r.accepted for r in probe.results}) > 1  # rounds that ended at different positions
        for i, r in enumerate(probe.results):
            assert r.target_hidden.shape == (final.shape[1],) and r.target_hidden.device.type == "cpu"
            if r.committed < r.accepted + 1 + r.extended:  # the output ended inside the round (EOS): no next round
                assert i == len(probe.results) - 1
                break
            row = start - 1 + r.accepted + r.extended  # the last committed token came from this row
            torch.testing.assert_close(r.target_hidden, final[row], atol=1e-4, rtol=1e-4)
            start += r.committed
            extended += r.extended
    assert method != "ouroboros" or extended > 0


def random_policy(kind: str, block: int = 2, threshold: float = 0.5, seed: int = 0, hidden: int = 64):
    torch.manual_seed(seed)
    spec = FeatureSpec((-2, -1), hidden, 8)
    S = len(spec.scalar_names)
    model = PreVerifier(spec.hidden_dim, S, block, 16, max_draft=8) if kind == "pacer" else \
        TokenHead(spec.hidden_dim, S, 16)
    cfg = {"feature_spec": spec.to_dict(), "threshold": threshold, "min_draft": 1, "block": block}
    cls = PacerPolicy if kind == "pacer" else SpecDecPPPolicy
    return cls(model.eval(), torch.zeros(S), torch.ones(S), cfg)


def test_a_checkpoints_check_cost_is_measured_once_per_process(monkeypatch):
    """A policy is built for every generation; the cost of its check (the cost rule's c_p) is measured the first
    time only, so requests do not each pay the measurement nor decide with a re-measured c_p; another checkpoint
    (its weights) or block size is measured anew."""
    import pacer.policies.learned as learned

    calls = []
    monkeypatch.setattr(learned, "_CHECK_SECONDS", {})
    monkeypatch.setattr(learned, "check_cost", lambda kind, model, spec, reps=30: calls.append(kind) or 1e-3 * len(
        calls))
    spec = FeatureSpec((-2, -1), 8, 8)
    S = len(spec.scalar_names)
    cfg = {"feature_spec": spec.to_dict(), "threshold": 0.5, "min_draft": 1, "weights_sha256": "a"}

    def policy(block=1, sha="a"):
        return PacerPolicy(PreVerifier(spec.hidden_dim, S, block, 16, max_draft=8).eval(), torch.zeros(S),
                           torch.ones(S), {**cfg, "weights_sha256": sha})

    assert [policy().check_seconds for _ in range(3)] == [1e-3] * 3 and len(calls) == 1
    assert policy(block=2).check_seconds == 2e-3 and policy(sha="b").check_seconds == 3e-3 and len(calls) == 3


@pytest.mark.parametrize("kind", ["pacer", "specdecpp"])
@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.5, 1.0])
def test_learned_policies_are_lossless_greedy(pairs, kind, threshold):
    for name in ("close", "random"):
        dec = pairs[name]
        for prompt in ("hello world, this is", "def f(x):"):
            ids = dec.encode(prompt)
            ar = dec.generate(ids, "ar", max_new_tokens=33)
            for block in (1, 2, 4):
                pol = random_policy(kind, block, threshold, hidden=dec.draft_info.model.config.hidden_size)
                res = dec.generate(ids, kind, max_new_tokens=33, policy=pol)
                assert res.token_ids == ar.token_ids
                assert max(res.stats.draft_lengths) <= 8


def test_pacer_drafts_in_whole_blocks(pairs):
    dec = pairs["same"]
    pol = random_policy("pacer", block=4, threshold=0.0)  # every block passes: draft to max_draft
    res = dec.generate("hello world", "pacer", max_new_tokens=40, policy=pol)
    assert all(g % 4 == 0 or g == 8 for g in res.stats.draft_lengths[1:-1])  # [0]: the prefill's token
    pol = random_policy("pacer", block=4, threshold=1.0)  # every block fails: one block a round
    res = dec.generate("hello world", "pacer", max_new_tokens=40, policy=pol)
    assert set(res.stats.draft_lengths[1:-1]) == {4}


@pytest.mark.parametrize("path", ["native", "numpy", "torch"])
@pytest.mark.parametrize("context", [True, False])
@pytest.mark.parametrize("block", [1, 2, 4])
def test_the_layer_fed_a_few_tokens_at_a_time_scores_as_its_forward_over_the_whole_draft(block, context, path,
                                                                                        monkeypatch):
    """``PreVerifier.extend`` (what a check runs: on a CPU the folded copy, one native call a token where
    pacer.native is built, else numpy's operations; torch elsewhere) equals ``forward`` over the draft so far, at
    every length and however the tokens are grouped: the layer is causal, so earlier tokens' states are reused,
    never recomputed."""
    from pacer import native

    if path == "native" and native.kernels() is None:
        assert native._compiler() is None  # built wherever a compiler is
        pytest.skip("no C compiler here: numpy's path only")
    if path == "numpy":
        monkeypatch.setitem(native._state, "kernels", None)
    torch.manual_seed(block)
    rank = 4 if context else 0  # the low-rank hidden projection and the full one
    layer = PreVerifier(40, 5, block_size=block, d=16, heads=2, max_draft=16, rank=rank, context=context).eval()
    if block == 2:
        layer.mlp[1].approximate = "tanh"  # both GELUs
    torch.nn.init.normal_(layer.block_head.weight)  # a non-zero block head: the pooled block states count too
    for norm in (layer.norm_h, layer.norm_a, layer.norm_m):  # LayerNorms that scale and shift (folded on a CPU)
        torch.nn.init.normal_(norm.weight, 1.0, 0.3)
        torch.nn.init.normal_(norm.bias, 0.0, 0.3)
    h, s = torch.randn(1, 11, 40), torch.randn(1, 11, 5)
    extend = layer.extend_torch if path == "torch" else layer.extend
    with torch.no_grad():
        for n in range(1, 12):
            _, blk = layer(h[:, :n], s[:, :n])
            memo, i, got = PrefixState(), 0, None
            while i < n:
                r = min(1 + i % 3, n - i)  # groups of 1, 2, 3 tokens
                got = extend(memo, h[0, i : i + r], s[0, i : i + r])
                i += r
            assert memo.n == n
            if n < block:
                assert got is None
            else:
                assert got == pytest.approx(float(blk[0, -1]), abs=1e-4)


def test_the_cpu_check_follows_the_weights():
    """The numpy copy a CPU check runs on is made again once a weight changes (an optimizer step, a loaded
    state): never a stale layer."""
    torch.manual_seed(0)
    layer = PreVerifier(12, 3, block_size=1, d=8, heads=2, max_draft=8).eval()
    h, s = torch.randn(1, 3, 12), torch.randn(1, 3, 3)

    def score() -> float:
        memo = PrefixState()
        return layer.extend(memo, h[0], s[0])

    with torch.no_grad():
        before = score()
        layer.token_head.bias += 1.5  # in place
        assert score() == pytest.approx(float(layer(h, s)[1][0, -1]), abs=1e-4) != pytest.approx(before, abs=1e-3)
        layer.load_state_dict(PreVerifier(12, 3, block_size=1, d=8, heads=2, max_draft=8).state_dict())
        assert score() == pytest.approx(float(layer(h, s)[1][0, -1]), abs=1e-4)


def rows_fed(pol) -> list[int]:
    """The rows a pacer policy's layer is fed, appended per call (numpy's or torch's extend: the rows of the call;
    the native check: 1)."""
    fed, extend = [], pol.model.extend
    cpu = pol.model.cpu()
    check = cpu.check

    def counting(memo, h, s):
        fed.append(h.shape[0])
        return extend(memo, h, s)

    def counting_check(k, memo, *args):
        fed.append(1)
        return check(k, memo, *args)

    pol.model.extend, cpu.check = counting, counting_check
    return fed


@pytest.mark.parametrize("path", ["native", "numpy"])
def test_a_pacer_check_feeds_the_layer_only_the_tokens_drafted_since_the_last(path, monkeypatch):
    """One row per drafted token in a round (not the whole draft at every check), the score still the whole
    draft's forward; a new round (other features: the history changed) and another draft start over. Native: each
    token goes from the draft's state into the layer in one call (pacer.native's check) where it is built."""
    from pacer import native

    if path == "numpy":
        monkeypatch.setitem(native._state, "kernels", None)
    elif native.kernels() is None:
        pytest.skip("pacer.native is not built on this machine")
    pol = random_policy("pacer", block=1, hidden=8)
    fed = rows_fed(pol)
    for rnd in range(2):
        st = DraftState()
        for i in range(6):
            st.tokens.append(i)
            for name, v in (("prob", 0.9 - 0.1 * i), ("top_prob", 0.9), ("entropy", 0.3 * i), ("second_prob", 0.05)):
                getattr(st, name).append(v)
            st.hidden.append(torch.randn(16))
            score = pol.block_score(st)
            assert pol.block_score(st) == score  # asked again: no more rows
            h, s = pol.inputs(st)
            with torch.no_grad():
                _, blk = pol.model(h[None], s[None])
            assert score == pytest.approx(float(torch.sigmoid(blk[0, -1])), abs=1e-5)
        assert fed == [1] * 6
        pol.update(st, RoundResult(6, 2 + rnd))
        h, s = pol.inputs(st)  # the same tokens under the new history: other features, another score
        with torch.no_grad():
            _, blk = pol.model(h[None], s[None])
        assert pol.block_score(st) == pytest.approx(float(torch.sigmoid(blk[0, -1])), abs=1e-5)
        fed.clear()
    other = DraftState(tokens=[9, 9], prob=[0.5, 0.5], top_prob=[0.5, 0.5], entropy=[1.0, 1.0],
                       second_prob=[0.1, 0.1], hidden=[torch.randn(16), torch.randn(16)])
    pol.block_score(st)
    fed.clear()
    pol.block_score(other)
    assert fed == ([1, 1] if path == "native" else [2])  # a draft the layer has not read: from its first token
    h, s = pol.inputs(other)
    with torch.no_grad():
        assert pol.block_score(other) == pytest.approx(float(torch.sigmoid(pol.model(h[None], s[None])[1][0, -1])),
                                                       abs=1e-5)


def test_specdecpp_survival_restarts_every_round(pairs):
    """Each round's stop rule uses only that round's tokens: with σ = 0.8 per token and threshold 0.5 every round
    drafts 4 tokens (1 - 0.8^4 > 0.5), not 4 in the first round and 1 ever after."""
    pol = random_policy("specdecpp", threshold=0.5)
    pol.model = lambda h, s: torch.full(h.shape[:1], float(torch.logit(torch.tensor(0.8))))
    res = pairs["same"].generate("hello world", "specdecpp", max_new_tokens=40, policy=pol)
    assert res.stats.draft_lengths[1:-1] and set(res.stats.draft_lengths[1:-1]) == {4}  # [0]: the prefill's


def test_learned_policy_sampling_is_seeded(close):
    s = SamplingConfig(temperature=0.9, seed=3)
    a = close.generate("abc", "pacer", max_new_tokens=20, sampling=s, policy=random_policy("pacer"))
    b = close.generate("abc", "pacer", max_new_tokens=20, sampling=s, policy=random_policy("pacer"))
    assert a.token_ids == b.token_ids


def test_checkpoint_refusals(tmp_path):
    data = synthetic_collection(tmp_path / "data", rounds=60)
    ckpt = tmp_path / "ckpt"
    train(data, ckpt, "pacer", block=2, epochs=1, log=None)
    load_checkpoint(ckpt, "tiny-draft")
    with pytest.raises(PacerError, match="trained for draft model"):
        load_checkpoint(ckpt, "another-draft")
    with pytest.raises(PacerError, match="not a pre-verifier checkpoint"):
        load_checkpoint(tmp_path / "nowhere")
    with pytest.raises(PacerError, match="'pacer' checkpoint, not 'specdecpp'"):
        make_learned_policy("specdecpp", ckpt, "tiny-draft", {}, {})
    w = ckpt / "weights.safetensors"
    raw = w.read_bytes()
    w.write_bytes(raw[:-10] + b"0123456789")
    with pytest.raises(PacerError, match="corrupt"):
        load_checkpoint(ckpt)
    w.write_bytes(raw)
    (ckpt / "config.json").write_text("{not json")
    with pytest.raises(PacerError, match="corrupt"):
        load_checkpoint(ckpt)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ckpt")
    ckpt = root / "ckpt"
    train(synthetic_collection(root / "data", rounds=60), ckpt, "pacer", block=2, epochs=1, log=None)
    return ckpt


BAD_INTS = [0, -1, "four", "4", 2.5, True, None, [2], {"n": 2}]


def _bad_configs() -> list[tuple[str, object]]:
    """(field path, value; ``None`` at the top: the field removed) for every field a checkpoint's config is read for."""
    cases: list[tuple[str, object]] = [(f, v) for f in ("block", "d") for v in BAD_INTS]
    cases += [("block", 9), ("d", 63), ("d", 0)]  # more than max_draft 8; not a multiple of the 2 heads
    cases += [("rank", v) for v in (-1, "8", 1.5, True)] + [("min_draft", v) for v in (-1, "1", 9, 1.5)]
    cases += [("kind", v) for v in (None, "x", 3, ["pacer"])] + [("context", v) for v in ("yes", 1, [True])]
    cases += [("threshold", v) for v in (None, -0.1, 1.5, "0.5", float("nan"), float("inf"), True)]
    cases += [("weights_sha256", v) for v in (None, 3, "abc")]
    cases += [("feature_spec", v) for v in (None, "x", [1])]
    cases += [(f"feature_spec/{f}", v) for f in ("hidden_size", "max_draft") for v in BAD_INTS]
    cases += [("feature_spec/hidden_layers", v) for v in (None, "x", [1.5], ["-1"], [True])]
    cases += [("feature_spec/scalar_names", v) for v in (None, [], ["nope"], "prob", [1])]
    cases += [("feature_spec/target_hidden", v) for v in (-1, "8", 1.5)]
    cases += [("backend", 3), ("draft_fingerprint", 3), ("target_fingerprint", ["x"])]
    cases += [("check_seconds", v) for v in (-1, float("nan"), "0.1")]
    cases += [("costs", v) for v in ("x", {"target": {}}, {"target": {"1": -1}}, {"target": {"1": 1}, "x": 1})]
    cases += [("threshold_by_mode", v) for v in ("x", {"greedy": 0.5}, {"greedy": {"threshold": 2}})]
    cases += [("rules", v) for v in ("x", {"entropy": 1.0}, {"entropy": {"threshold": "a"}},
                                     {"entropy": {"threshold": 1.0, "by_mode": {"greedy": {"threshold": None}}}})]
    cases += [("train", "x"), ("validation", [1])]
    return cases


@pytest.mark.parametrize("where,value", _bad_configs(), ids=lambda x: repr(x)[:30])
def test_every_field_of_a_checkpoint_config_is_checked_in_one_reader(tiny_checkpoint, tmp_path, where, value):
    """A checkpoint's config.json is read by one checked reader: each field it is read for of the right type and
    range (``block: 0``, ``block: "four"``, a missing ``d``: once three tracebacks, one from ctypes), even with its
    checksum recomputed; one line naming the file and the field."""
    import shutil

    from pacer.policies.learned import write_config

    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, ckpt)
    cfg = json.loads((ckpt / "config.json").read_text())
    *parents, last = where.split("/")
    node = cfg
    for key in parents:
        node = node[key]
    if value is None:
        node.pop(last, None)
    else:
        node[last] = value
    write_config(ckpt, cfg)  # a consistent checksum: the field itself is what is refused
    with pytest.raises(PacerError) as e:
        pol = make_learned_policy("pacer", ckpt, "tiny-draft", {}, {})
        pol.check_seconds  # noqa: B018 - loaded, and the layer measured
        pytest.fail(f"{where} = {value!r} accepted")
    msg = str(e.value)
    assert "\n" not in msg and str(ckpt / "config.json") in msg and where.split("/")[-1] in msg, msg


def test_a_checkpoint_config_is_covered_by_its_checksum(tiny_checkpoint, tmp_path):
    """config.json records the sha256 of the rest of it: a hand edit (here a valid threshold) is refused; the
    shipped checkpoints carry it and load."""
    import shutil

    from pacer.policies.learned import DEFAULT_CHECKPOINTS, config_sha256, default_checkpoint, read_config

    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, ckpt)
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["config_sha256"] == config_sha256(cfg)
    load_checkpoint(ckpt, "tiny-draft")
    (ckpt / "config.json").write_text(json.dumps({**cfg, "threshold": 0.01}))
    with pytest.raises(PacerError, match="changed by hand"):
        load_checkpoint(ckpt)
    for kind in DEFAULT_CHECKPOINTS:
        for backend in ("transformers", "llamacpp"):
            shipped = json.loads((default_checkpoint(kind, backend) / "config.json").read_text())
            assert shipped["config_sha256"] == config_sha256(shipped)
            assert read_config(default_checkpoint(kind, backend))[0]["kind"] == kind
    # a config written before the checksum existed is read (and checked) as it is
    del cfg["config_sha256"]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    load_checkpoint(ckpt, "tiny-draft")


def test_layer_is_light():
    spec = FeatureSpec()
    m = PreVerifier(spec.hidden_dim, len(spec.scalar_names), 4, 64, max_draft=16)
    assert param_count(m) < 200_000


@pytest.mark.parametrize("argv,needle", [
    (["train", "--data", "d", "--out", "o", "--costs", "{tmp}/missing.json"], "cannot read costs file"),
    (["train", "--data", "d", "--out", "o", "--costs", "{tmp}/bad.json"], "is not a costs JSON"),
    (["tune", "--checkpoint", "c", "--data", "d", "--costs", "{tmp}/bad.json"], "is not a costs JSON"),
    (["tune", "--checkpoint", "c", "--measure-costs", "{tmp}/m.json", "--target", "{tmp}/none"], "needs --data"),
    (["tune", "--checkpoint", "c", "--data", "d"], "needs --costs FILE or --measure-costs FILE"),
])
def test_train_and_tune_bad_input_is_one_line(tmp_path, capsys, argv, needle):
    from pacer.cli import main

    (tmp_path / "bad.json").write_text('{"draft": 1}')
    rc = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("pacer: error: ") and needle in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "m.json").exists()


def test_resumed_collect_recollects_a_damaged_shard_and_train_refuses_one(tmp_path, close, monkeypatch, capsys):
    """Every shard is recorded (size, sha256, prompts) when written: a resumed collect finds one cut short, zeroed
    in place or missing, says so in one note and collects its prompts again (the same rows); train refuses a
    damaged or missing shard in one line naming it."""
    import pacer.data.mix as mix

    pools = {c: [mix.TrainingPrompt(f"question {c} {i}: say something", c, "test") for i in range(3)]
             for c in mix.CATEGORIES}
    monkeypatch.setattr(mix, "candidate_pools", lambda: pools)
    monkeypatch.setattr(mix, "benchmark_texts", lambda: ["a benchmark question"])
    spec = FeatureSpec((-2, -1), 64, 6)
    out = tmp_path / "data"

    def run():
        return collect(close, out, n_prompts=4, max_new_tokens=10, spec=spec, shard_size=2, progress=False,
                       temperatures=(0.0, 1.0))

    m = run()
    assert sorted(m["shard_records"]) == m["shards"] and m["shard_records"][m["shards"][1]]["prompts"] == [2, 4]
    shard = out / m["shards"][1]
    good = {k: v.clone() for k, v in load_file(str(shard)).items()}  # not a view of the file (damaged below)
    size = shard.stat().st_size

    def zero():
        with open(shard, "r+b") as f:
            f.seek(size // 2)
            f.write(bytes(64))

    for damage, word in ((lambda: shard.write_bytes(shard.read_bytes()[:5000]), "damaged"), (zero, "damaged"),
                         (shard.unlink, "missing")):
        damage()
        with pytest.raises(PacerError, match=f"shard {shard} is {word}.*collect it again") as e:
            load_dataset(out)
        assert "\n" not in str(e.value)
        capsys.readouterr()
        m2 = run()
        err = capsys.readouterr().err
        assert f"note: shard {shard} is {word}" in err and "collecting its prompts 2..3 again" in err
        assert len(err.strip().splitlines()) == 1
        again = {k: v.clone() for k, v in load_file(str(shard)).items()}
        assert {k: v for k, v in again.items() if k != "round"}.keys() == {k for k in good if k != "round"}
        for k in good:
            if k != "round":
                assert torch.equal(again[k], good[k]), k
        assert m2["tokens"] == m["tokens"] and m2["prompts_done"] == 4 and m2["shards"] == m["shards"]
        assert load_dataset(out)[1]["prompts_done"] == 4
    capsys.readouterr()
    run()
    assert "note" not in capsys.readouterr().err  # sound shards: nothing collected again


def test_train_refuses_an_older_collections_unreadable_shard(tmp_path):
    data = synthetic_collection(tmp_path / "data", rounds=20)  # no shard records: as an older pacer wrote it
    shard = data / "shard-00000.safetensors"
    shard.write_bytes(shard.read_bytes()[:5000])
    with pytest.raises(PacerError, match=f"shard {shard} is damaged \\(it is not a readable safetensors file"):
        train(data, None, "pacer", log=None)


@pytest.mark.parametrize("argv,needle", [
    (["collect", "--out", "{tmp}/file", "--target", "{tmp}/none"], "--out {tmp}/file is an existing file"),
    (["collect", "--out", "/proc/nope/x", "--target", "{tmp}/none"], "--out /proc/nope/x cannot be written"),
    (["collect", "--out", "{tmp}/file/x", "--target", "{tmp}/none"], "{tmp}/file is a file, not a folder"),
    (["train", "--data", "{tmp}/data", "--out", "/proc/nope/x"], "--out /proc/nope/x cannot be written"),
    (["train", "--data", "{tmp}/data", "--out", "{tmp}/file"], "--out {tmp}/file is an existing file"),
    (["tune", "--measure-costs", "/proc/nope/c.json", "--target", "{tmp}/none"],
     "--measure-costs /proc/nope/c.json cannot be written"),
    (["tune", "--measure-costs", "{tmp}", "--target", "{tmp}/none"], "--measure-costs {tmp} is an existing folder"),
])
def test_output_paths_are_checked_before_any_model_loads(tmp_path, capsys, argv, needle):
    """(``--target`` names no model: had a model been loaded first, the error would say so instead.)"""
    from pacer.cli import main

    (tmp_path / "file").write_text("x")
    synthetic_collection(tmp_path / "data", rounds=20)
    rc = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("pacer: error: ") and needle.replace("{tmp}", str(tmp_path)) in err, err


def test_train_refuses_layers_that_were_not_recorded(tmp_path):
    data = synthetic_collection(tmp_path / "data", rounds=20)
    with pytest.raises(PacerError, match="--layers 5: not recorded"):
        train(data, None, "pacer", hidden_layers=(-1, 5), log=None)
    with pytest.raises(PacerError, match="--val-frac must be in"):
        train(data, None, "pacer", val_frac=1.0, log=None)


def test_retune_rechooses_the_threshold_for_new_costs(tmp_path):
    """A cheaper draft makes longer drafts pay: retuning moves the threshold down (drafts go on more often);
    ``held_out`` tunes on every round of the data, the default on its validation split only."""
    from pacer.preverify.train import retune

    data = synthetic_collection(tmp_path / "data", rounds=200)
    train(data, tmp_path / "ckpt", "pacer", block=1, epochs=3, seed=0, log=None, check_seconds=1e-4)
    before = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    cheap = Costs(COSTS.draft / 10, COSTS.target)
    split_cfg = retune(tmp_path / "ckpt", data, cheap)
    held = retune(tmp_path / "ckpt", data, cheap, held_out=True)
    assert held["tuned"]["rounds"] == 200 > split_cfg["tuned"]["rounds"] == before["train"]["rounds_val"]
    assert held["tuned"]["held_out"] and not split_cfg["tuned"]["held_out"]
    assert held["threshold"] <= before["threshold"] and held["costs"]["draft"] == pytest.approx(cheap.draft)
    on_disk = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert on_disk["threshold"] == held["threshold"] and on_disk["tuned"] == held["tuned"]


def test_damaged_manifests_and_features_that_do_not_fit_are_one_line_errors(tmp_path, close):
    import copy

    from pacer.policies.learned import load_checkpoint

    data = synthetic_collection(tmp_path / "data", rounds=60)
    (data / "manifest.json").write_text('{"shards": [')
    with pytest.raises(PacerError, match="manifest.json is damaged"):
        load_dataset(data)
    with pytest.raises(PacerError, match="manifest.json is damaged"):
        collect(close, data, n_prompts=1, progress=False)
    info = close.draft_info
    with pytest.raises(PacerError, match=r"hidden layer\(s\) \[-13\] do not exist"):
        FeatureSpec((-13, -1), 64, 6).check_fits(info.layers, info.hidden_size)
    data = synthetic_collection(tmp_path / "data2", rounds=60)
    train(data, tmp_path / "ckpt", "pacer", block=2, epochs=1, seed=0, d=16, log=None)
    small = copy.deepcopy(info)
    small.model.config.hidden_size = 32
    with pytest.raises(PacerError, match="do not fit this draft"):
        load_checkpoint(tmp_path / "ckpt", None, small)
    # a collection's feature spec or costs of the wrong type or range: one line naming the field (the manifest's
    # spec and costs go through the same checked readers as a checkpoint's)
    for key, value, needle in [("feature_spec", {**SPEC.to_dict(), "hidden_size": "64"}, "hidden_size"),
                               ("feature_spec", {**SPEC.to_dict(), "scalar_names": ["nope"]}, "scalar_names"),
                               ("costs", {"draft": 0.1, "target": {"1": float("nan")}}, "'target'['1'] is NaN"),
                               ("costs", {"draft": 0.1, "target": {}}, "'target' is empty")]:
        data = synthetic_collection(tmp_path / f"data-{key}-{needle[:4]}", rounds=60)
        manifest = json.loads((data / "manifest.json").read_text())
        (data / "manifest.json").write_text(json.dumps({**manifest, key: value}))
        with pytest.raises(PacerError) as e:
            train(data, tmp_path / "ckpt-bad", "pacer", block=2, epochs=1, log=None)
        assert needle in str(e.value) and str(data) in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert not (tmp_path / "ckpt-bad").exists()


def test_train_records_the_rules_thresholds_chosen_on_validation_prompts(tmp_path):
    """The fair protocol: every training-free rule (confidence, entropy, cumprob) gets the threshold of highest
    predicted speedup on the validation split under the checkpoint's costs - as the layer does - recorded with how it
    was chosen; no rule beats the oracle there, and the layer is compared with each."""
    data = synthetic_collection(tmp_path / "data", rounds=300)
    cfg = train(data, tmp_path / "ckpt", "pacer", block=1, epochs=3, seed=0, d=16, log=None, check_seconds=1e-4)
    rules = cfg["rules"]
    assert set(rules) == {"confidence", "entropy", "cumprob"}
    measured = cfg["validation"]["compare"]["measured"]
    for rule, r in rules.items():
        assert r["threshold"] == measured[rule]["threshold"] and "validation split" in r["chosen"]
        assert r["predicted_speedup"] <= measured["oracle"]["predicted_speedup"] + 1e-9
        assert f"vs_{rule}" in measured
    saved = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert saved["rules"] == rules
    # the layer's own threshold, over all validation rounds and per decoding mode, chosen by the same sweep
    assert measured["layer"]["threshold"] == cfg["threshold"]
    groups = cfg["validation"]["groups"]
    assert set(saved["threshold_by_mode"]) == {"greedy", "sampled"} & set(groups) != set()
    for mode, chosen in saved["threshold_by_mode"].items():
        assert chosen["threshold"] == round(groups[mode]["measured"]["layer"]["threshold"], 5)
        assert chosen["predicted_speedup"] == groups[mode]["measured"]["layer"]["predicted_speedup"]
        assert f"{groups[mode]['rounds']} {mode} rounds" in chosen["chosen"]


def test_train_cli_sets_the_bottleneck_rank_the_class_weighting_and_the_context(tmp_path, capsys):
    """`pacer train --rank R --no-class-weights --no-context` trains (and records) a layer with a rank-R
    hidden-state bottleneck, plain-likelihood losses and no attention over the draft; by default rank 8,
    class-balanced losses and attention."""
    from pacer.cli import main

    data = synthetic_collection(tmp_path / "data", rounds=100)
    common = ["train", "--data", str(data), "--block", "1", "--epochs", "1", "--d", "8"]
    assert main([*common, "--out", str(tmp_path / "a"), "--rank", "4", "--no-class-weights", "--no-context",
                 "--token-weight", "10"]) == 0
    assert main([*common, "--out", str(tmp_path / "b")]) == 0
    a, b = (json.loads((tmp_path / x / "config.json").read_text()) for x in "ab")
    assert (a["rank"], a["train"]["class_weighted"], a["context"]) == (4, False, False)
    assert (a["train"]["token_loss_weight"], b["train"]["token_loss_weight"]) == (10.0, 0.5)
    assert (b["rank"], b["train"]["class_weighted"], b.get("context", True)) == (8, True, True)
    model, *_ = load_checkpoint(tmp_path / "a")
    assert not model.context  # loaded as trained: no attention
    assert load_file(str(tmp_path / "a" / "weights.safetensors"))["model.proj_h.1.weight"].shape == (4, SPEC.hidden_dim)
    capsys.readouterr()


def test_train_takes_a_cost_profile_for_its_thresholds(tmp_path):
    from pacer.preverify_cli import read_costs
    from pacer.profiles import Profile

    shipped = Path(__file__).resolve().parents[1] / "docs" / "profiles" / "zen4-avx512bf16-transformers-bf16.json"
    costs = read_costs(str(shipped))
    assert costs.target_cost(1) == pytest.approx(Profile.load(shipped).costs().target_cost(1))
    plain = tmp_path / "costs.json"
    plain.write_text(json.dumps(COSTS.to_dict()))
    assert read_costs(str(plain)).to_dict() == COSTS.to_dict()


def test_offline_rule_lengths_are_the_live_policies_lengths():
    """The thresholds `pacer train` records are chosen offline (``rule_lengths`` over the recorded scalars); they
    mean what the live policies do with them only if the offline stop is theirs: for every rule (``cumprob`` on the
    running product of ``q(d_i)``) and threshold, the same length per round as the policy drafting token by token."""
    from pacer.policies import ConfidencePolicy, CumProbPolicy, DraftState, EntropyPolicy
    from pacer.preverify.validation import RULES, rule_lengths, rule_values

    rng = np.random.default_rng(0)
    R, M = 40, 6
    names = ["prob", "top_prob", "entropy"]
    scalars = np.stack([rng.uniform(0.2, 1, (R, M)), rng.uniform(0.3, 1, (R, M)), rng.uniform(0, 3, (R, M))], -1)
    m = rng.integers(1, M + 1, R)
    for rule in RULES:
        v = rule_values(rule, scalars, names)
        for thr in np.quantile(v, [0.2, 0.5, 0.8]):
            offline = rule_lengths(v, m, float(thr), RULES[rule][1])
            live = {"confidence": ConfidencePolicy, "entropy": EntropyPolicy, "cumprob": CumProbPolicy}[rule]
            pol = live(threshold=float(thr), min_draft=1, max_draft=M)
            for r in range(R):
                st, n = DraftState(), 0
                while n < m[r] and pol.should_continue(st):
                    st.tokens.append(1)
                    st.prob.append(float(scalars[r, n, 0]))
                    st.top_prob.append(float(scalars[r, n, 1]))
                    st.entropy.append(float(scalars[r, n, 2]))
                    n += 1
                assert n == offline[r], (rule, thr, r)


def test_a_layer_loaded_in_inference_mode_checks_on_the_cpu():
    """Parameters made under ``torch.inference_mode`` have no version counter: the CPU check still runs."""
    with torch.inference_mode():
        torch.manual_seed(1)
        layer = PreVerifier(12, 3, block_size=2, d=8, heads=2, max_draft=8).eval()
        h, s = torch.randn(1, 4, 12), torch.randn(1, 4, 3)
        got = layer.extend(PrefixState(), h[0], s[0])
        assert got == pytest.approx(float(layer(h, s)[1][0, -1]), abs=1e-4)

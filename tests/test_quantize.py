"""An int8 weight-only draft only changes the proposals, never the output: greedy output equals plain decoding
for every method, and sampling keeps the target's distribution (chi-square). An int8 target is another model."""

import pytest
import torch

from pacer import Decoder, timing
from pacer.backends import transformers as hf
from pacer.quantize import Int8Linear, quantize_int8
from pacer.sampling import SamplingConfig
from pacer.tiny import tiny_pair
from test_costs import FLAT

PROMPTS = ["hello world, this is", "def f(x):\n    return", "The 3 quick brown foxes"]


def test_int8_linear_is_close_to_the_float_layer():
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 48)
    q = Int8Linear(lin)
    x = torch.randn(2, 7, 64)
    err = (q(x) - lin(x)).abs().max() / lin(x).abs().max()
    assert q.q.dtype == torch.int8 and q.q.shape == (48, 64)
    assert 0 < err < 0.02  # quantized (not a copy), and close


def test_a_long_input_takes_one_dense_product_with_the_same_values(monkeypatch):
    """From ``DENSE_ROWS`` rows (a prompt the draft reads) the layer converts its int8 weights and makes one dense
    product instead of the int8 kernel (which costs about one single-row product per row); a few rows (drafting)
    keep the kernel; the values agree with the kernel's to the dtype's rounding, in bf16 and float32."""
    from pacer import quantize

    monkeypatch.setattr(quantize, "_dense_pays", lambda dtype: True)  # what an AVX-512 or AMX CPU says of bf16
    kernel, calls = quantize._int8_mm, []
    monkeypatch.setattr(quantize, "_int8_mm", lambda *a: calls.append(a[0].shape[0]) or kernel(*a))
    torch.manual_seed(0)
    for dtype, tol in ((torch.bfloat16, 2e-2), (torch.float32, 1e-5)):
        lin = torch.nn.Linear(64, 48).to(dtype)
        q = Int8Linear(lin)
        x = torch.randn(quantize.DENSE_ROWS + 3, 64).to(dtype)
        want = kernel(x, q.q, q.scale) + q.bias
        calls.clear()
        small = q(x[:4])
        got = q(x.reshape(1, -1, 64))
        assert calls == [4]  # the kernel for the 4 rows only
        assert got.shape == (1, x.shape[0], 48) and got.dtype == dtype
        assert torch.allclose(got[0].float(), want.float(), rtol=tol, atol=tol)
        assert torch.allclose(small.float(), want[:4].float(), rtol=tol, atol=tol)
    # where the dtype's dense product is not native (bf16 on an AVX2-only CPU) a long input keeps the kernel
    monkeypatch.setattr(quantize, "_dense_pays", lambda dtype: False)
    calls.clear()
    q(x)
    assert calls == [x.shape[0]]


def test_int8_weights_are_rounded_to_the_nearest_step():
    """Each weight is the nearest multiple of its row's step ``s = max |w_row| / 127``: off by at most ``s / 2``
    (truncating towards zero would be off by up to ``s``), so a layer's output is off by at most
    ``|x| · s / 2`` summed over its inputs."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 48)
    q = Int8Linear(lin)
    w = lin.weight.detach()
    step = q.scale.float()[:, None]
    err = (w - q.q.float() * step).abs()
    assert (err <= step / 2 * (1 + 1e-5)).all(), (err / step).max()
    assert (err / step).max() > 0.45  # a real rounding (64 weights a row reach near the half step)
    x = torch.randn(5, 64)
    bound = x.abs() @ (step / 2).expand(48, 64).T
    assert ((q(x) - lin(x)).abs() <= bound * (1 + 1e-4) + 1e-5).all()


@pytest.fixture(scope="module")
def int8_draft():
    t, d = tiny_pair("close")
    dec = Decoder(t, d, threads=1, costs=FLAT, draft_quant="int8")
    assert isinstance(dec.draft_info.model.get_decoder().layers[0].self_attn.q_proj, Int8Linear)
    assert not isinstance(dec.target.model.get_decoder().layers[0].self_attn.q_proj, Int8Linear)
    return dec


@pytest.mark.parametrize("method", ["sd", "heuristic", "confidence", "entropy", "oracle", "ouroboros"])
def test_int8_draft_is_exact_greedy(int8_draft, method):
    dec = int8_draft
    for prompt in PROMPTS:
        ar = dec.generate(prompt, "ar", max_new_tokens=30)
        for kw in ({}, {"gamma": 3}):
            res = dec.generate(prompt, method, max_new_tokens=30, **kw)
            assert res.token_ids == ar.token_ids, (method, prompt, kw)
    assert res.stats.draft_tokens > 0


def test_int8_draft_sampling_keeps_the_target_distribution(int8_draft):
    from scipy.stats import chisquare

    dec = int8_draft
    ids = dec.encode("hello")
    with torch.inference_mode():
        p = torch.softmax(dec.target.model(input_ids=torch.tensor([ids])).logits[0, -1].float(), -1)
    N = 600
    counts = torch.zeros_like(p)
    accepted = 0
    for seed in range(N):
        res = dec.generate(ids, "sd", max_new_tokens=3, gamma=2, sampling=SamplingConfig(1.0, seed=seed))
        counts[res.token_ids[0]] += 1
        accepted += res.stats.accepted_tokens
    assert accepted > 0
    top = torch.argsort(p, descending=True)[:8]
    obs = [*(float(counts[i]) for i in top), N - float(counts[top].sum())]
    exp = [*(float(p[i]) * N for i in top), N * (1 - float(p[top].sum()))]
    exp = [e * sum(obs) / sum(exp) for e in exp]  # float32 p: scipy refuses sums that differ by 1 ulp
    assert chisquare(obs, exp).pvalue > 0.001


def test_int8_target_is_another_model_but_speculation_on_it_is_exact():
    t, d = tiny_pair("close")
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.inference_mode():
        before = t.model(input_ids=ids).logits
    dec = Decoder(t, d, threads=1, costs=FLAT, quantize="int8")
    with torch.inference_mode():
        after = t.model(input_ids=ids).logits
    assert not torch.equal(before, after)  # another target: its plain decoding is the baseline
    ar = dec.generate(PROMPTS[0], "ar", max_new_tokens=40)
    assert dec.target_info.model.config.pacer_quantization == "int8"
    assert dec.target_info.weights == "int8+float32"
    for method in ("sd", "entropy"):
        assert dec.generate(PROMPTS[0], method, max_new_tokens=40).token_ids == ar.token_ids


def test_auto_draft_quant_is_measured_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("PACER_HOME", str(tmp_path))
    calls = []
    real = timing.timed

    def timed(cm, tokens, base, keep=1, tree=None):
        calls.append(1)
        int8 = isinstance(cm.model.get_decoder().layers[0].mlp.up_proj, Int8Linear)
        real(cm, tokens, base, keep, tree)
        return 0.5 if int8 else 1.0  # int8 twice as fast

    monkeypatch.setattr(timing, "timed", timed)
    t, d = tiny_pair("close")
    assert hf.choose_draft_quant(d) == "int8"
    n = len(calls)
    assert hf.choose_draft_quant(d) == "int8" and len(calls) == n  # cached
    monkeypatch.setattr(timing, "timed", lambda *a, **k: 1.0)  # equal speed: keep the draft as is
    monkeypatch.setattr(torch, "get_num_threads", lambda: 7)  # another key
    assert hf.choose_draft_quant(d) == "none"
    assert not isinstance(d.model.get_decoder().layers[0].mlp.up_proj, Int8Linear)  # measured on a copy


def test_bad_quantization_is_refused():
    from pacer import PacerError

    with pytest.raises(PacerError, match="int8"):
        Decoder(*tiny_pair("close"), draft_quant="int4")
    quantize_int8(tiny_pair("close")[1].model)  # twice is harmless: no nn.Linear left the second time


def _fake_linear(monkeypatch, times: dict[str, tuple[float, float]]) -> list[str]:
    calls: list[str] = []

    def fake(dtype, reps=9):
        calls.append(dtype)
        return times[dtype]

    monkeypatch.setattr(hf, "linear_times", fake)
    return calls


def test_dtype_auto_picks_the_dtype_that_prices_faster_and_caches_it(tmp_path, monkeypatch):
    """``--dtype auto`` on a CPU: float32 where bf16 has no native kernels and float32 prices >= 10% cheaper
    (an AVX2-only CPU), bfloat16 otherwise; measured once per machine key; a corrupt cache is measured again."""
    monkeypatch.setenv("PACER_HOME", str(tmp_path))
    avx2 = {"bfloat16": (0.008, 0.105), "float32": (0.0045, 0.060)}  # as timed on the EPYC (Zen 3)
    calls = _fake_linear(monkeypatch, avx2)
    assert hf.choose_dtype("cpu")[0] == "float32"
    assert hf.choose_dtype("cpu")[0] == "float32" and len(calls) == 2  # cached: not timed again
    monkeypatch.setattr(torch, "get_num_threads", lambda: 7)  # another key: timed again
    calls = _fake_linear(monkeypatch, {"bfloat16": (0.004, 0.030), "float32": (0.0045, 0.060)})  # AVX-512 BF16
    choice, why = hf.choose_dtype("cpu")
    assert choice == "bfloat16" and len(calls) == 2 and "float32" in why
    monkeypatch.setattr(torch, "get_num_threads", lambda: 5)
    calls = _fake_linear(monkeypatch, {"bfloat16": (0.010, 0.100), "float32": (0.0095, 0.095)})  # 5%: not enough
    assert hf.choose_dtype("cpu")[0] == "bfloat16"
    for f in (tmp_path / "calibration").glob("*.json"):
        f.write_text("{not json")
    calls = _fake_linear(monkeypatch, avx2)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 7)
    assert hf.choose_dtype("cpu")[0] == "float32" and len(calls) == 2  # corrupt cache: measured again


def test_dtype_auto_on_cuda_is_bf16_where_native(monkeypatch):
    asked = []

    def capability(dev):
        asked.append(dev)
        return {0: (9, 0), 1: (7, 5)}[dev.index]  # an H100-class GPU and a T4 (bf16 only emulated)

    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
    assert hf.choose_dtype(torch.device("cuda:0"))[0] == "bfloat16"
    assert hf.choose_dtype("cuda:1")[0] == "float16"
    assert [d.index for d in asked] == [0, 1]  # the GPU the models run on, not the current one


def test_dtype_auto_times_real_layers():
    """The real timing runs (a few ms) and prices the generation from its two points."""
    t1, tc = hf.linear_times("float32", reps=1)  # 8 copies of a 55 MB layer: well under a second
    assert 0 < t1 and 0 < tc
    assert hf.dtype_cost(t1, tc) == pytest.approx(hf.DTYPE_PROMPT / hf.DTYPE_CHUNK * tc
                                                       + hf.DTYPE_NEW * t1)


def test_a_calibration_of_an_int8_model_is_keyed_by_how_it_reads_a_prompt(int8_draft, monkeypatch):
    """The draft's prefill rate, which the cost rule prices a catch-up with, depends on where an int8 model
    switches to the dense product: a calibration measured with another switch is measured again."""
    from pacer import quantize
    from pacer.calibration import calibration_key

    key = calibration_key(int8_draft.pair, None)
    assert key["int8_dense_rows"] == quantize.DENSE_ROWS
    monkeypatch.setattr(quantize, "DENSE_ROWS", quantize.DENSE_ROWS + 1)
    assert calibration_key(int8_draft.pair, None) != key
    plain = Decoder(*tiny_pair("close"), threads=1, costs=FLAT)
    assert "int8_dense_rows" not in calibration_key(plain.pair, None)  # other pairs' caches stay valid

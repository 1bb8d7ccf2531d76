"""Devices: ``--device`` / ``Decoder(device=)``: how ``auto`` resolves and what is refused before any model
loads; every method makes what its models read on their device (checked on any machine with a fake default device);
every method greedy-exact and the sampling rule exact on CUDA where there is one (the ``cuda`` cases skip elsewhere);
and the GPU check's Python side (``python scripts/gpu_check.py --device cpu --quick``)."""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys

import pytest
import torch

from pacer import Decoder, PacerError, backends, devices, methods
from pacer.backends.transformers import TransformersBackend
from pacer.calibration import calibration_key, measure
from pacer.costs import Costs
from pacer.policies.learned import PacerPolicy, SpecDecPPPolicy
from pacer.preverify.features import FeatureSpec
from pacer.preverify.layer import PreVerifier, TokenHead
from pacer.sampling import SamplingConfig
from pacer.tiny import save_tiny_pair, tiny_pair

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]
FLAT = Costs(draft=0.01, target={1: 1.0, 64: 1.0})
PROMPTS = ["hello world, this is hello world", "def f(x):\n    return"]
#: methods whose policy is a pre-verification layer: their shipped checkpoints are for the default pair, so the tiny
#: pairs get a random layer of that kind
LEARNED = {"pacer": "pacer", "specdecpp": "specdecpp", "pacer+ouroboros": "pacer"}
#: a reduced draft vocabulary for the tiny pairs (every other id): the restricted LM head
REDUCED = list(range(0, 259, 2))


@pytest.fixture(scope="module")
def decoders():
    """``decoders(device, reduced=False)``: a tiny close pair on ``device`` (with the reduced draft vocabulary)."""
    made: dict = {}

    def get(device: str, reduced: bool = False) -> Decoder:
        if (device, reduced) not in made:
            made[device, reduced] = Decoder(*tiny_pair("close"), threads=1, costs=FLAT, device=device,
                                            draft_vocab=REDUCED if reduced else None)
        return made[device, reduced]

    return get


def learned(method: str, dec: Decoder, threshold: float = 0.3):
    """A random pre-verification policy for ``method`` on ``dec``'s draft (``None`` for the other methods)."""
    kind = LEARNED.get(method)
    if kind is None:
        return None
    torch.manual_seed(0)
    spec = FeatureSpec((-2, -1), dec.draft_info.model.config.hidden_size, 8)
    s = len(spec.scalar_names)
    if kind == "pacer":
        layer: torch.nn.Module = PreVerifier(spec.hidden_dim, s, 2, 16, max_draft=8)
    else:
        layer = TokenHead(spec.hidden_dim, s, 16)
    cfg = {"feature_spec": spec.to_dict(), "threshold": threshold, "min_draft": 1, "block": 2}
    return (PacerPolicy if kind == "pacer" else SpecDecPPPolicy)(layer.eval(), torch.zeros(s), torch.ones(s), cfg)


# ------------------------------------------------------------------------------------------ resolution, refusals
def test_auto_is_cuda_only_where_the_settings_run_there(monkeypatch):
    monkeypatch.setattr(devices, "cuda_available", lambda: True)
    assert devices.check_device("auto") == torch.device("cuda") == devices.check_device(None)
    assert devices.check_device("auto", "llamacpp") == torch.device("cpu")  # llama.cpp runs on the CPU here
    assert devices.check_device("auto", draft_quant="int8") == torch.device("cpu")  # a CPU kernel
    assert devices.check_device("auto", draft_quant="auto") == torch.device("cuda")
    assert devices.device_type("auto") == "cuda" == devices.device_type("cuda:0")
    assert backends.resolve("auto", [], devices.device_type("auto")) == "transformers"  # llama.cpp: CPU only
    assert backends.resolve("llamacpp", [], "cuda") == "llamacpp"  # as asked (check_device refuses it)
    assert devices.device_type("cpu") == "cpu"
    monkeypatch.setattr(devices, "cuda_available", lambda: False)
    assert devices.check_device("auto") == torch.device("cpu") == devices.check_device("CPU")
    assert devices.device_type("auto") == "cpu"


def test_what_cannot_run_is_refused(monkeypatch):
    monkeypatch.setattr(devices, "cuda_available", lambda: False)
    with pytest.raises(PacerError, match=r"^device must be cpu or auto on this machine: it has no CUDA GPU"):
        devices.check_device("cuda")
    for available in (False, True):
        monkeypatch.setattr(devices, "cuda_available", lambda a=available: a)
        with pytest.raises(PacerError, match="llamacpp backend: it runs on the CPU in this build"):
            devices.check_device("cuda", "llamacpp")
    with pytest.raises(PacerError, match="int8"):
        devices.check_device("cuda", quantize="int8")
    with pytest.raises(PacerError, match="must be auto, cpu or cuda"):
        devices.check_device("tpu")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert devices.check_device("cuda:0") == torch.device("cuda:0")
    with pytest.raises(PacerError, match=r"cuda:0\.\.cuda:0\), got 'cuda:1'"):
        devices.check_device("cuda:1")


def test_the_api_refuses_cuda_without_cuda_before_loading(tmp_path, monkeypatch):
    monkeypatch.setattr(devices, "cuda_available", lambda: False)
    t, d = save_tiny_pair(tmp_path)
    monkeypatch.setattr(backends, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(PacerError, match="no CUDA GPU"):
        Decoder.from_pretrained(str(t), str(d), device="cuda", backend="transformers")
    with pytest.raises(PacerError, match="no CUDA GPU"):
        Decoder(*tiny_pair("close"), device="cuda")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    t, d = save_tiny_pair(tmp_path_factory.mktemp("device"))
    return str(t), str(d)


def _pacer(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pacer", *argv], capture_output=True, text=True, timeout=180)


@pytest.mark.skipif(CUDA, reason="the refusal of a machine without CUDA")
def test_generate_on_cuda_without_cuda_exits_2_with_one_line(folders):
    t, d = folders
    p = _pacer("generate", "hello", "--target", t, "--draft", d, "--device", "cuda")
    assert p.returncode == 2 and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("pacer: error: --device must be cpu or auto on this machine: it has no CUDA GPU "
                               "(torch.cuda.is_available() is false")


def test_generate_on_cuda_with_llamacpp_exits_2_with_one_line(folders):
    t, d = folders
    p = _pacer("generate", "hello", "--target", t, "--draft", d, "--device", "cuda", "--backend", "llamacpp")
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().splitlines() == [
        "pacer: error: --device must be cpu or auto with the llamacpp backend: it runs on the CPU in this build "
        "(use --backend transformers to run on CUDA)"]


def test_generate_takes_device_cpu(folders, capsys, tmp_path, monkeypatch):
    from pacer.cli import main

    monkeypatch.setenv("PACER_HOME", str(tmp_path / "home"))
    t, d = folders
    assert main(["generate", "hello", "--target", t, "--draft", d, "--device", "cpu", "--max-new-tokens", "5",
                 "--gamma", "2", "--threads", "1", "--draft-quant", "none", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["token_ids"]) == 5


# ---------------------------------------------------------------------------- tensors on the backend's device
@contextlib.contextmanager
def guarded(dec: Decoder, policy=None):
    """While the block runs, a tensor made without naming its device lands on ``meta`` (which has no data), and every
    tensor handed to the models' decoder stacks (and to a pre-verification layer) must be on that module's device.

    So code that makes what a model reads without ``device=`` (a CPU tensor where a GPU one is needed), or reads back
    a tensor it made without naming the host, fails here on a CPU-only machine as it would on a GPU."""
    hooks = []

    def watch(module: torch.nn.Module) -> None:
        dev = next(module.parameters()).device

        def check(mod, args, kwargs):
            for name, v in [*enumerate(args), *kwargs.items()]:
                if isinstance(v, torch.Tensor):
                    assert v.device == dev, f"{type(mod).__name__} got {name} on {v.device}; its weights are on {dev}"

        hooks.append(module.register_forward_pre_hook(check, with_kwargs=True))

    watch(dec.target_info.model.get_decoder())
    watch(dec.draft_info.model.get_decoder())
    if policy is not None:
        watch(policy.model)
    before = torch.get_default_device()
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device(before)
        for h in hooks:
            h.remove()


CASES = [(m, greedy) for m in methods.names() for greedy in (True, False) if greedy or not methods.get(m).greedy_only]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method,greedy", CASES, ids=[f"{m}-{'greedy' if g else 'sampled'}" for m, g in CASES])
def test_every_method_makes_what_its_models_read_on_their_device(decoders, device, method, greedy, monkeypatch):
    """Every method, greedy and sampled, with the reduced draft head too for ``sd``: the same output under the guard
    as without it, and the sampling generator made on the target's device."""
    asked: list = []
    real = SamplingConfig.generator
    monkeypatch.setattr(SamplingConfig, "generator",
                        lambda self, device=None: asked.append(device) or real(self, device))
    sampling = SamplingConfig() if greedy else SamplingConfig(temperature=0.9, top_k=40, seed=5)
    for reduced in (False, True) if method == "sd" else (False,):
        dec = decoders(device, reduced)

        def run(guard: bool, dec=dec) -> list[int]:
            pol = learned(method, dec)
            with guarded(dec, pol) if guard else contextlib.nullcontext():
                return dec.generate(PROMPTS[0], method, max_new_tokens=16, sampling=sampling, policy=pol,
                                    cost_aware=False).token_ids

        assert run(True) == run(False)
        assert asked and all(a is not None and torch.device(a) == dec.target.device for a in asked)


def test_the_guard_sees_a_tensor_made_without_its_device(decoders, monkeypatch):
    """Negative control: input ids made without ``device=`` (on a GPU: CPU ids for a CUDA model) fail the guard."""
    dec = decoders("cpu")
    monkeypatch.setattr(TransformersBackend, "_ids", lambda self, ids: torch.tensor([list(ids)], dtype=torch.long))
    with pytest.raises(AssertionError, match="on meta; its weights are on cpu"), guarded(dec):
        dec.generate(PROMPTS[0], "sd", max_new_tokens=8, gamma=2)


# ---------------------------------------------------------------------------------- every method on the device
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", [m for m in methods.names() if methods.get(m).drafts])
def test_every_method_is_greedy_exact_on_the_device(decoders, device, method):
    """Every drafting method equals plain decoding on the device, with the literal rule and the cost-aware one, with
    the full and the reduced draft head (the tree verification of Ouroboros's candidate branches included)."""
    for reduced in (False, True):
        dec = decoders(device, reduced)
        assert dec.device == torch.device(device) and dec.target.device.type == device
        for prompt in PROMPTS:
            ids = dec.encode(prompt)
            ar = dec.generate(ids, "ar", max_new_tokens=24).token_ids
            for cost_aware in (False, None):
                res = dec.generate(ids, method, max_new_tokens=24, policy=learned(method, dec), cost_aware=cost_aware)
                assert res.token_ids == ar, (device, method, reduced, prompt, cost_aware)


@pytest.mark.parametrize("device", DEVICES)
def test_sampling_is_seeded_on_the_device(decoders, device):
    dec = decoders(device)
    for verify in ("token", "block"):
        s = SamplingConfig(temperature=0.8, top_k=50, top_p=0.9, seed=7, verify=verify)
        for method in ("sd", "lookup", "ouroboros"):
            a = dec.generate(PROMPTS[0], method, max_new_tokens=16, sampling=s, cost_aware=False).token_ids
            assert dec.generate(PROMPTS[0], method, max_new_tokens=16, sampling=s, cost_aware=False).token_ids == a


@pytest.mark.parametrize("device", DEVICES)
def test_block_verification_makes_what_it_reads_on_the_device(decoders, device):
    """Block verification's weights, uniforms and residuals are made where the probabilities are: the same output
    under the guard as without it."""
    dec = decoders(device)
    s = SamplingConfig(temperature=0.9, top_k=40, seed=5, verify="block")

    def run(guard: bool) -> list[int]:
        with guarded(dec) if guard else contextlib.nullcontext():
            return dec.generate(PROMPTS[0], "sd", max_new_tokens=16, sampling=s, cost_aware=False).token_ids

    assert run(True) == run(False)


@needs_cuda
@pytest.mark.parametrize("draft,cfg", [("sharp", SamplingConfig(temperature=1.0, top_k=4)),
                                       ("negated", SamplingConfig(temperature=0.8, top_p=0.7)),
                                       ("negated", SamplingConfig(temperature=1.0, verify="block"))],
                         ids=["sharp-k4", "negated-p0.7", "negated-block"])
def test_sampling_matches_the_target_distribution_on_cuda(draft, cfg):
    """The end-to-end chi-square test of ``tests/test_sampling.py`` (two of its cases) with the pair and the
    generator on CUDA."""
    from test_sampling import check_generate_sampling

    check_generate_sampling(draft, cfg, device="cuda")


@pytest.mark.parametrize("device", DEVICES)
def test_calibration_times_forwards_on_the_device(decoders, device):
    dec = decoders(device)
    cal = measure(dec.pair, None, max_draft=3, reps=1)
    assert cal.costs.draft > 0 and all(v > 0 for v in cal.costs.target.values())
    key = calibration_key(dec, None)
    assert ("device" in key) == (device != "cpu")  # CPU keys are as they were: their caches stay valid


# ----------------------------------------------------------------------------------------------- the GPU check
def gpu_check():
    """``scripts/gpu_check.py`` as a module (it lives beside ``scripts/gpu_check.sh``, outside the package)."""
    import importlib.util
    from pathlib import Path

    if "gpu_check" not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"
        spec = importlib.util.spec_from_file_location("gpu_check", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["gpu_check"] = module  # before running it: its dataclasses look their module up
        spec.loader.exec_module(module)
    return sys.modules["gpu_check"]


def test_gpu_check_runs_quick_on_the_cpu(tmp_path):
    """``python scripts/gpu_check.py --device cpu --quick``: every section of the report, finite numbers."""
    gc = gpu_check()

    assert gc.main(["--device", "cpu", "--quick", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert set(doc["models"]) == {"tiny-s", "tiny-m", "tiny-l"}
    assert all(v > 0 for m in doc["models"].values() for v in m["c_t"].values())
    assert doc["draft"]["full"] > 0 and doc["draft"]["reduced"] > 0
    assert set(doc["overhead"]) == {"tiny-m/tiny-s", "tiny-l/tiny-s"}
    assert any(name.startswith("bench oracle") for name in doc["traces"])  # the committed traces are read
    for sets in doc["simulation"].values():
        assert set(sets) == set(doc["traces"])
        for res in sets.values():
            assert {"γ=1", "γ=8", "cost-aware", "oracle", "oracle, cost-aware"} <= set(res)
            assert all(math.isfinite(r["speedup"]) and r["speedup"] > 0 for r in res.values())
    md = (tmp_path / "gpu_check_costs.md").read_text()
    for section in ("## Costs on cpu", "## Loop overhead per round", "## Speedup over plain decoding"):
        assert section in md
    from pacer.profiles import Profile  # one cost profile per target shape, loadable, with the measured curve

    profiles = sorted((tmp_path / "profiles").glob("*.json"))
    assert len(profiles) == 2
    for path in profiles:
        p = Profile.load(path)
        shape = "tiny-m" if "tiny-m" in p.name else "tiny-l"
        c_t = {int(k): v for k, v in doc["models"][shape]["c_t"].items()}
        assert p.target_cost[doc["context"]] == pytest.approx(c_t)


def test_gpu_check_replays_traces_through_the_real_loop(tmp_path, monkeypatch):
    """The speedups come from the decoding loop itself on trace-scripted models: its budget handshake, its
    forwards (priced), its rounds; no model of the loop."""
    from pacer.decoding import loop
    from pacer.policies import FixedPolicy, OraclePolicy

    gc = gpu_check()
    flat = Costs(0.0, {1: 1.0, 64: 1.0})
    free = (lambda g: 0.0), 0.0

    def run(traces, make, costs=flat, over=free):
        return gc.speedup(gc.replay(traces, make), costs, *over)

    def oracle():
        return OraclePolicy(None, min_draft=0, max_draft=32)

    ten = [[True] * 10]
    # the first token comes out of the target's prefill (a round that drafts nothing), then 4 + 1, then 3 + 1
    assert run(ten, lambda: FixedPolicy(4)).speedup == pytest.approx(10 / 3)
    assert run(ten, oracle).speedup == pytest.approx(5.0)  # after the prefill's token, all 8 it may in one round
    assert run([[False] * 10], lambda: FixedPolicy(4)).speedup == pytest.approx(1.0)
    # the loop's budget: a round drafts at most the tokens left but one (7 tokens: the prefill's 1, 4 + 1, then 0 + 1)
    r = run([[True] * 7], lambda: FixedPolicy(4))
    assert (r.tau, r.mean_gamma) == pytest.approx((7 / 3, 4 / 3))
    # each forward the loop made is priced: a draft forward c_d (its catch-up of two tokens too), a target
    # forward c_t(k); each round adds o(γ), a plain step o_ar
    costs = Costs(0.1, {1: 1.0, 2: 1.5, 5: 3.0})
    r = run(ten, lambda: FixedPolicy(4), costs, ((lambda g: 0.5 if g else 0.2), 0.2))
    # the prefill's round c_t(1) + o(0); 4 draft forwards + c_t(5) + o(4); 3 draft forwards + c_t(4) (2.5 on the
    # curve) + o(3)
    rounds = (1.0 + 0.2) + (4 * 0.1 + 3.0 + 0.5) + (3 * 0.1 + 2.5 + 0.5)
    assert r.speedup == pytest.approx((10 * 1.0 + 10 * 0.2) / rounds)
    # the measured overhead: fitted linear in γ over the greedy rounds; a round that drafted nothing is a plain step
    over = {"ar": {"seconds": 0.2, "gamma": 0}, "g1": {"seconds": 0.5, "gamma": 1}, "g4": {"seconds": 0.8, "gamma": 4}}
    o, o_ar = gc.overheads(over)
    assert (o(0), o(1), o(4), o_ar) == pytest.approx((0.2, 0.5, 0.8, 0.2))
    # where no draft pays, the cost-aware rule decodes plainly through the loop: exactly plain decoding's time
    from pacer.policies.cost_aware import CostAwarePolicy
    from pacer.pricing import CostMemory

    steep = Costs(0.3, {1: 1.0, 2: 2.0, 4: 4.0})
    memory = CostMemory()
    r = run(ten * 3, lambda: CostAwarePolicy(FixedPolicy(16, min_draft=0), steep, refine=0.0, memory=memory), steep,
            (o, o_ar))
    assert (r.speedup, r.mean_gamma) == (pytest.approx(1.0), 0.0)
    # the oracle is told where the draft agrees by the drafter itself (the scripted draft: the trace)
    trace = [True, False, True, True, False, True]
    d = gc.TokenDrafter(gc.TraceBackend(trace), 2)
    assert d.agreement(gc.PROMPT, [0] * len(trace)) == trace
    # and every generation goes through the loop's own function
    calls = []
    real = loop.speculative_generate
    monkeypatch.setattr(gc, "speculative_generate", lambda *a: calls.append(a) or real(*a))
    run([trace, trace], oracle)
    assert len(calls) == 2
    f = tmp_path / "answers.jsonl"
    f.write_text(json.dumps({"method": "oracle", "choices": [{"accept_lengths": [[3, 1, 2]]}]}) + "\n"
                 + json.dumps({"method": "sd", "choices": [{"accept_lengths": [[5]]}]}) + "\n")
    assert gc.bench_traces(f) == [[True, True, False, False, True, False]]

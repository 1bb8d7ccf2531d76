"""Live costs by context: without a profile, this machine's calibration measures the forwards at a short and a long
context, and every round is priced at the context it runs at (through the factory's pricer, what every entry point
uses). The target here is a tiny model whose forwards take longer the more tokens they attend to (a sleep of
``A + B · k · context``), which the calibration's own timer sees: flat in ``k`` after a short context, steep after a
long one, as a real CPU's attention makes it."""

from __future__ import annotations

import time

import pytest
import torch

from pacer import Decoder
from pacer import calibration as cal_mod
from pacer.tiny import tiny_pair

#: seconds of a target forward beyond its compute: a fixed part, and one that grows with new tokens times context
A, B = 2e-2, 1e-4


class Attending:
    """A target backend whose forward of ``k`` new tokens after ``length`` cached ones sleeps ``A + B · k · length``
    seconds more (everything else is the wrapped backend's)."""

    def __init__(self, inner) -> None:
        self.__dict__["inner"] = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __setattr__(self, name, value) -> None:
        setattr(self.inner, name, value)

    def forward(self, tokens, *args, **kwargs):
        time.sleep(A + B * len(tokens) * self.inner.length)
        return self.inner.forward(tokens, *args, **kwargs)


@pytest.fixture(scope="module")
def attending(tmp_path_factory):
    """A decoder on the tiny pair with the attending target, its calibration measured once for this module."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PACER_HOME", str(tmp_path_factory.mktemp("home")))
        mp.setattr(cal_mod, "NOISY", 1e9)  # the sleeps are the point: never call them noisy
        torch.set_num_threads(1)
        dec = Decoder(*tiny_pair("close"), threads=1, draft_vocab=None, progress=False)
        dec.pair.target = Attending(dec.pair.target)
        dec.calibration(None)
        yield dec


def test_the_live_calibration_measures_two_contexts_and_caches_them(attending):
    cal = attending.calibration(None)
    short, long = sorted(cal.contexts)
    assert short == 32 and long >= 400  # near 1,024 tokens, within the tiny target's 512 positions
    c_s, c_l = cal.contexts[short], cal.contexts[long]
    assert c_l.target_cost(1) > 1.5 * c_s.target_cost(1)  # the timer saw the context
    assert c_l.verification_growth(8) > c_s.verification_growth(8)
    assert c_s.tree and c_l.tree and c_l.draft > 0 and c_l.draft_prefill > 0  # tree, draft and catch-up measured
    again, why = cal_mod.load(cal.key)
    assert again is not None and sorted(again.contexts) == [short, long], why


def test_a_cached_calibration_of_one_context_is_not_trusted(attending):
    cal = attending.calibration(None)
    one = {**cal.payload(), "contexts": {str(min(cal.contexts)): cal.costs.to_dict()}}
    cal_mod.STORE.put(cal.key, one)
    again, why = cal_mod.load(cal.key)
    cal_mod.save(cal)
    assert again is None and "contexts" in why
    old = {k: v for k, v in cal.key.items() if k != "contexts"}  # a cache made before costs by context
    assert cal_mod.cache_path(old) != cal_mod.cache_path(cal.key)


def test_without_a_profile_each_round_is_priced_at_its_context(attending):
    """The cost rule drafts a fairly likely token after a short context (verification nearly free there) and not
    after a long one (each extra scored token costs about a forward there): the choice changes with the context."""
    pricer = attending.make_pricer("sd")
    assert pricer.source == "measured"
    pricer.begin(greedy=True)
    choices = {}
    for context in (32, 480):
        pricer.set_context(context)
        pricer.start_round()
        choices[context] = pricer.next_pays(0.6)
    assert choices == {32: True, 480: False}, choices

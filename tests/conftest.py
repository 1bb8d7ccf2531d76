import pytest
import torch

from pacer import Decoder
from pacer.costs import Costs
from pacer.tiny import tiny_pair

torch.set_num_threads(1)

#: costs under which drafting nearly always pays (a flat target curve, a draft token 1% of a target forward):
#: the tiny pairs' tests exercise long drafts, whatever this machine measures for tiny models
FLAT = Costs(draft=0.01, target={1: 1.0, 64: 1.0})


@pytest.fixture(scope="session")
def pairs():
    """Decoders over tiny float32 pairs: draft close to, equal to, and unrelated to the target."""
    return {kind: Decoder(*tiny_pair(kind), threads=1, costs=FLAT) for kind in ("close", "same", "random")}



@pytest.fixture(scope="session")
def close(pairs):
    return pairs["close"]

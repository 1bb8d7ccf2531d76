import pytest
import torch

from pacer import Decoder
from pacer.tiny import tiny_pair

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def pairs():
    """Decoders over tiny float32 pairs: draft close to, equal to, and unrelated to the target."""
    return {kind: Decoder(*tiny_pair(kind), threads=1) for kind in ("close", "same", "random")}


@pytest.fixture(scope="session")
def close(pairs):
    return pairs["close"]

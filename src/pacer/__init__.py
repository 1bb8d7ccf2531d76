"""pacer: lossless speculative decoding with adaptive draft length."""

from .api import METHODS, Decoder, generate
from .decoding import GenerationResult
from .errors import PacerError
from .sampling import SamplingConfig
from .stats import GenerationStats

__version__ = "0.1.0"
__all__ = ["METHODS", "Decoder", "GenerationResult", "GenerationStats", "PacerError", "SamplingConfig", "generate"]

"""pacer: lossless speculative decoding with adaptive draft length."""

from . import methods
from .api import Decoder, generate
from .backends import llamacpp as _llamacpp  # noqa: F401  the built-in backends register themselves, in this order
from .backends import transformers as _transformers  # noqa: F401
from .decoding import GenerationResult
from .decoding.stats import GenerationStats
from .errors import PacerError
from .pair import LoadSpec
from .request import MethodRequest
from .sampling import SamplingConfig

__version__ = "0.1.0"
__all__ = ["methods", "Decoder", "GenerationResult", "GenerationStats", "LoadSpec", "MethodRequest", "PacerError",
           "SamplingConfig", "generate"]

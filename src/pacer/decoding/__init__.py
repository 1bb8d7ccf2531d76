"""The decoding core (see ``docs/architecture.md``):

* :mod:`.backend`     - :class:`ModelBackend`, the only way the loop, drafters and diagnostics touch a model (its
  implementations are the backends', :mod:`pacer.backends`);
* :mod:`.tree`        - :class:`Draft`, one round's proposal, and its verification as a token tree;
* :mod:`.drafter`     - the interface :class:`Drafter` and the policy handshake :class:`Proposal` (the drafters
  themselves are in :mod:`pacer.drafters`, which the core never imports);
* :mod:`.output`      - :class:`Output` (stops exactly at EOS / stop strings / the budget), :class:`GenerationResult`;
* :mod:`.stats`       - :class:`GenerationStats`, a generation's statistics with their definitions;
* :mod:`.loop`        - :func:`speculative_generate` (five numbered steps) and :func:`autoregressive_generate`;
* :mod:`.diagnostics` - :func:`first_divergence` and the near-tie criterion.
"""

from .backend import ModelBackend, Tree
from .diagnostics import Divergence, dtype_resolution, first_divergence
from .drafter import Drafter, Proposal, token_features
from .loop import autoregressive_generate, speculative_generate
from .output import GenerationResult, Output
from .tree import Draft

__all__ = ["Divergence", "Draft", "Drafter", "GenerationResult", "ModelBackend", "Output", "Proposal",
           "Tree", "autoregressive_generate", "dtype_resolution", "first_divergence",
           "speculative_generate", "token_features"]

"""Draft-length policies, one home each (see :mod:`.base` for the interface the decoding loop needs):

* :mod:`.base`       - :class:`DraftState`, :class:`RoundResult` and :class:`DraftPolicy`, the interface;
* :mod:`.rules`      - the training-free rules: fixed ``γ`` (and prompt lookup's), heuristic, confidence, entropy,
  cumulative probability;
* :mod:`.oracle`     - the oracle length (measurement only);
* :mod:`.learned`    - the trained ``pacer`` and ``specdecpp`` policies and their checkpoints (torch layers);
* :mod:`.cost_aware` - the cost-aware rule that wraps a policy, its memory, calibrator and report.

Re-exported here: the interface, the rules and the oracle (light, and importing nothing but the interface);
:mod:`.learned` and :mod:`.cost_aware` are imported by their full path.
"""

from ..rounds import DRAFT_FEATURES, DraftState, RoundResult
from .base import DraftPolicy
from .oracle import OraclePolicy
from .rules import ConfidencePolicy, CumProbPolicy, EntropyPolicy, FixedPolicy, HeuristicPolicy, LookupPolicy

__all__ = ["DRAFT_FEATURES", "ConfidencePolicy", "CumProbPolicy", "DraftPolicy", "DraftState", "EntropyPolicy",
           "FixedPolicy", "HeuristicPolicy", "LookupPolicy", "OraclePolicy", "RoundResult"]

"""``oracle``: drafts exactly up to the draft's first disagreement with the target (measurement only): the limit
of any draft-length policy on a pair."""

from ..policies.oracle import OraclePolicy
from .registry import Method, register

register(Method("oracle", "measurement only: drafts exactly to the first mismatch with the target (greedy)",
                lambda b: OraclePolicy(**b.bounds), greedy_only=True))

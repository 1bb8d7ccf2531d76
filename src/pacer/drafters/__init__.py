"""Drafters, one home each; they implement the interface of :mod:`pacer.decoding.drafter` (the decoding core never
imports them):

* :mod:`.token`  - :class:`TokenDrafter`: one token per draft forward (classic speculative decoding);
* :mod:`.phrase` - :class:`PhraseDrafter` and its :class:`PhrasePool`: Ouroboros-style phrase drafting;
* :mod:`.lookup` - :class:`LookupDrafter`: prompt lookup, no draft model.
"""

from .lookup import LookupDrafter
from .phrase import PhraseDrafter, PhrasePool
from .token import TokenDrafter

__all__ = ["LookupDrafter", "PhraseDrafter", "PhrasePool", "TokenDrafter"]

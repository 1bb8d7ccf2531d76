"""Drafters, one home each; they implement the interface of :mod:`pacer.decoding.drafter` (the decoding core never
imports them) and ask the generation's pricer (:mod:`pacer.pricing`) what extra work a round may do:

* :mod:`.token`    - :class:`TokenDrafter`: one token per draft forward (classic speculative decoding);
* :mod:`.phrase`   - :class:`PhraseDrafter` (:class:`PhraseOptions`): Ouroboros-style phrase drafting, built from
  :mod:`.pool` (:class:`PhrasePool`: the n-gram pool), :mod:`.sources` (which source drafts a round, and each
  source's evidence) and :mod:`.branches` (candidate branches and siblings);
* :mod:`.lookup`   - :class:`LookupDrafter`: prompt lookup, no draft model.
"""

from .lookup import LookupDrafter
from .phrase import PhraseDrafter, PhraseOptions
from .pool import PhrasePool
from .token import TokenDrafter

__all__ = ["LookupDrafter", "PhraseDrafter", "PhraseOptions", "PhrasePool", "TokenDrafter"]

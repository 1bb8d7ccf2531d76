"""Decoding methods, one registry (see :mod:`.registry`). Each import below registers built-in methods, in the
order tables and help list them; a new method is one new file and one line here."""
# isort: skip_file

from .registry import (
    COMMON,
    DRAFT_VOCAB,
    Build,
    Method,
    Option,
    all_options,
    get,
    names,
    path_options,
    register,
    table,
    unregister,
)

from . import plain  # noqa: F401  ar
from . import rules  # noqa: F401  sd, heuristic, confidence, entropy
from . import oracle  # noqa: F401  oracle
from . import learned  # noqa: F401  specdecpp, pacer
from . import phrase  # noqa: F401  ouroboros, pacer+ouroboros
from . import lookup  # noqa: F401  lookup (no draft model)
from .default import DEFAULT_METHOD, resolve_default

__all__ = ["COMMON", "DEFAULT_METHOD", "DRAFT_VOCAB", "Build", "Method", "Option", "all_options", "get", "names",
           "path_options", "register", "resolve_default", "table", "unregister"]

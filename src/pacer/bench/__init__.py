"""``pacer bench``: a fair, resumable speed benchmark of speculative decoding methods on held-out questions.

All methods run greedy on one loaded :class:`pacer.api.Decoder` (same weights, dtype and threads); see
``docs/bench/README.md`` for the definitions and the output files. Submodules: :mod:`.cli` (the subcommand),
:mod:`.run` (one run in its folder: run.json, the run, the report), :mod:`.methods` (``--methods`` parsing, read
from the method registry), :mod:`.data` (questions), :mod:`.hf` (transformers' assisted generation),
:mod:`.runner` (the loop), :mod:`.records` (the answers file), :mod:`.metrics` and :mod:`.report`.
"""

"""What the pre-verification layer reads about each draft token, gathered from computations the loop does anyway.

Per draft token ``d_i`` (``i`` = 1-based position in the round's draft) the draft forward that produced it gives:

* ``hidden`` - the draft's hidden states at the position that predicted ``d_i``, for the layers in
  ``FeatureSpec.hidden_layers`` (indices into transformers' ``hidden_states`` tuple; ``-1`` is the final, normed
  state), concatenated: ``[len(layers) * H]``.
* ``scalars`` (``FeatureSpec.scalar_names``, each defined in ``SCALARS``): ``q(d_i)``, ``max q``, entropy of ``q``
  (nats), ``log q(d_i)``, ``i / max_draft``, from this generation's earlier rounds the previous round's acceptance
  ratio ``n/γ`` and an exponential moving average of it (1.0 before the first round), the top-2 margin of ``q``
  (``max q`` minus the second-largest probability) and the sampling temperature (0: greedy). A checkpoint names the
  scalars it was trained on, so older checkpoints (the first seven, the first nine) keep working.
* target-state scalars (``TARGET_SCALARS``), constant within a round: what the target's previous verification
  showed, at no extra forward - its entropy (nats, temperature 1) and top-2 margin at the bonus position (the
  distribution the round's last committed token came from: ``t_entropy``, ``t_margin``), the mean entropy and the
  smallest top-2 margin over the positions it accepted plus the bonus (``t_entropy_mean``, ``t_margin_min``), and
  how many draft tokens it accepted (``prev_accepted``, ``/ max_draft``). Before the first verification of a
  generation: entropy 0, margin 1, accepted ``max_draft`` (as ``prev_ratio`` starts at 1). A rule cannot see these:
  they are the target's, not the draft's. The loop computes them only for a policy that ``needs_target_state``.
* ``target_hidden`` (``FeatureSpec.target_hidden`` > 0 values, constant within a round, appended to every token's
  ``hidden``): the target's final hidden state at the position whose distribution gave the round's last committed
  token (the previous verification's bonus), which that forward computed anyway; zeros before the first
  verification. The loop gathers it only for a policy that ``needs_target_hidden``.

Labels, from the target's verification of the same round:

* ``accepted`` - 1 if ``d_i`` *and every earlier draft token* were accepted (greedy match), i.e. ``i <= n``. A block
  passes pre-verification when its last token's label is 1.
* ``cond_valid`` - 1 if every earlier token was accepted (``i <= n + 1``): where the per-token conditional label
  (``d_i`` accepted given its prefix was) is defined - what a SpecDec++-style head is trained on.
* ``soft`` - ``min(1, p(d_i) / q(d_i))`` at temperature 1, the acceptance probability under rejection sampling.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from ..rounds import DraftState

#: name -> (state, token index, spec, history) -> value
SCALARS: dict[str, Callable[[DraftState, int, FeatureSpec, RoundHistory], float]] = {
    "prob": lambda s, i, spec, h: s.prob[i],
    "top_prob": lambda s, i, spec, h: s.top_prob[i],
    "entropy": lambda s, i, spec, h: s.entropy[i],
    "log_prob": lambda s, i, spec, h: math.log(max(s.prob[i], 1e-13)),
    "position": lambda s, i, spec, h: (i + 1) / spec.max_draft,
    "prev_ratio": lambda s, i, spec, h: h.prev,
    "ema_ratio": lambda s, i, spec, h: h.ema,
    "top2_margin": lambda s, i, spec, h: s.top_prob[i] - (s.second_prob[i] if i < len(s.second_prob) else 0.0),
    "temperature": lambda s, i, spec, h: s.temperature,
    "t_entropy": lambda s, i, spec, h: h.t_entropy,
    "t_margin": lambda s, i, spec, h: h.t_margin,
    "t_entropy_mean": lambda s, i, spec, h: h.t_entropy_mean,
    "t_margin_min": lambda s, i, spec, h: h.t_margin_min,
    "prev_accepted": lambda s, i, spec, h: min(h.accepted, spec.max_draft) / spec.max_draft
    if h.accepted is not None else 1.0,
}
SCALAR_NAMES = tuple(SCALARS)
#: the scalars read from the target's previous verification (see the module docstring)
TARGET_SCALARS = ("t_entropy", "t_margin", "t_entropy_mean", "t_margin_min", "prev_accepted")
#: named groups of scalars that ``pacer train --ablate`` drops one at a time
SCALAR_GROUPS: dict[str, tuple[str, ...]] = {
    "target-bonus": ("t_entropy", "t_margin"),
    "target-accepted": ("t_entropy_mean", "t_margin_min"),
    "accepted-count": ("prev_accepted",),
    "target-state": TARGET_SCALARS,
    "round-history": ("prev_ratio", "ema_ratio"),
    "draft-q": ("prob", "top_prob", "entropy", "log_prob", "top2_margin"),
}


@dataclass(frozen=True)
class FeatureSpec:
    hidden_layers: tuple[int, ...] = (-13, -1)
    hidden_size: int = 896
    max_draft: int = 16
    scalar_names: tuple[str, ...] = SCALAR_NAMES
    #: size of the target's hidden state appended to each token's hidden states (0: not read)
    target_hidden: int = 0

    @property
    def hidden_dim(self) -> int:
        """The draft's hidden states per token."""
        return len(self.hidden_layers) * self.hidden_size

    @property
    def input_dim(self) -> int:
        """What the layer reads per token besides the scalars: the draft's hidden states, then the target's."""
        return self.hidden_dim + self.target_hidden

    def to_dict(self) -> dict:
        d = asdict(self)
        d["hidden_layers"] = list(self.hidden_layers)
        d["scalar_names"] = list(self.scalar_names)
        if not self.target_hidden:  # specs from before it existed compare equal
            del d["target_hidden"]
        return d

    def check_fits(self, layers: int, hidden_size: int, what: str = "the draft") -> None:
        """A one-line error unless a draft with ``layers`` transformer layers (``layers + 1`` hidden states) and
        ``hidden_size`` has what this spec reads."""
        from ..errors import PacerError

        bad = [i for i in self.hidden_layers if not -(layers + 1) <= i <= layers]
        if bad:
            raise PacerError(f"hidden layer(s) {bad} do not exist in {what} ({layers} layers: hidden states "
                             f"{-(layers + 1)}..{layers}); choose layers in that range")
        if hidden_size != self.hidden_size:
            raise PacerError(f"features of hidden size {self.hidden_size} do not fit {what} (hidden size "
                             f"{hidden_size})")

    @classmethod
    def from_dict(cls, d: dict) -> FeatureSpec:
        """The checked reader of a spec (a checkpoint's or a collection's): layer indices integers, sizes and
        ``max_draft`` integers >= 1, every scalar one of :data:`SCALARS`; :class:`pacer.costs.BadField` names the
        field otherwise."""
        from ..costs import BadField, read_count, show_value

        if not isinstance(d, dict):
            raise BadField(f"'feature_spec' is {show_value(d)} (want an object)")
        layers, names = d.get("hidden_layers"), d.get("scalar_names")
        if not isinstance(layers, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in layers):
            raise BadField(f"'feature_spec' hidden_layers is {show_value(layers)} (want a list of layer indices)")
        if not isinstance(names, list) or not names or not all(n in SCALARS for n in names if isinstance(n, str)) \
                or not all(isinstance(n, str) for n in names):
            raise BadField(f"'feature_spec' scalar_names is {show_value(names)} (want a list of "
                           f"{', '.join(SCALARS)})")
        return cls(tuple(layers), read_count(d.get("hidden_size"), "'feature_spec' hidden_size", 1),
                   read_count(d.get("max_draft"), "'feature_spec' max_draft", 1), tuple(names),
                   read_count(d.get("target_hidden", 0), "'feature_spec' target_hidden", 0))


def needs_target_state(spec: FeatureSpec) -> bool:
    """Whether features of ``spec`` read the target's previous verification (the loop then computes it)."""
    return any(name in TARGET_SCALARS for name in spec.scalar_names)


def needs_target_hidden(spec: FeatureSpec) -> bool:
    """Whether features of ``spec`` read the target's hidden state from its last verification."""
    return spec.target_hidden > 0


class RoundHistory:
    """This generation's earlier rounds: their acceptance (``prev_ratio`` / ``ema_ratio``) and what the target's
    last verification showed (the target-state scalars; from ``RoundResult.target_entropy`` / ``target_margin``)."""

    def __init__(self, decay: float = 0.7) -> None:
        self.decay = decay
        self.reset()

    def reset(self) -> None:
        self.prev = 1.0
        self.ema = 1.0
        self.t_entropy = self.t_entropy_mean = 0.0
        self.t_margin = self.t_margin_min = 1.0
        self.accepted: int | None = None
        #: the target's final hidden state at the last verification's bonus position (``None``: none yet)
        self.t_hidden: torch.Tensor | None = None

    def update(self, drafted: int, accepted: int, target_entropy: list[float] | None = None,
               target_margin: list[float] | None = None, target_hidden: torch.Tensor | None = None) -> None:
        if drafted:
            r = accepted / drafted
            self.prev = r
            self.ema = self.decay * self.ema + (1 - self.decay) * r
            self.accepted = accepted
        if target_entropy:  # positions d_1..d_n and the bonus: the last one is the bonus
            self.t_entropy = target_entropy[-1]
            self.t_entropy_mean = sum(target_entropy) / len(target_entropy)
        if target_margin:
            self.t_margin = target_margin[-1]
            self.t_margin_min = min(target_margin)
        if target_hidden is not None:
            self.t_hidden = target_hidden

    def target_row(self, size: int) -> torch.Tensor:
        """``[size]`` float32 on the CPU: the target's hidden state the next round's features read (zeros before
        the first verification)."""
        if self.t_hidden is None:
            return torch.zeros(size)
        if self.t_hidden.numel() != size:
            from ..errors import PacerError

            raise PacerError(f"the target's hidden state has {self.t_hidden.numel()} values, the layer reads "
                             f"{size}: use a checkpoint trained for this target")
        return self.t_hidden


def scalar_features(state: DraftState, spec: FeatureSpec, hist: RoundHistory, start: int = 0) -> torch.Tensor:
    """``[n - start, len(SCALAR_NAMES)]`` scalar features of tokens ``start..n-1`` of ``state``."""
    fns = [SCALARS[name] for name in spec.scalar_names]
    rows = [[f(state, i, spec, hist) for f in fns] for i in range(start, state.n)]
    return torch.tensor(rows, dtype=torch.float32, device="cpu").reshape(-1, len(fns))

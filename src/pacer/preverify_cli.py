"""``pacer collect``, ``pacer train`` and ``pacer tune`` (the PACER pipeline: collect -> train -> tune)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import backends
from .args import add_model_args
from .bounds import MAX_EPOCHS, MAX_NEW_TOKENS, MAX_PROMPTS, MAX_SEED, MAX_SHARD, MAX_WIDTH, MIN_SEED, Count
from .costs import Costs
from .errors import PacerError
from .io import check_out_dir, check_out_file
from .methods.registry import MAX_DRAFT


def measure_costs(dec) -> Costs:
    """This machine's costs for the loaded pair with its draft vocabulary, measured afresh
    (:mod:`pacer.calibration`)."""
    return dec.calibration(dec.draft_rows(dec.draft_vocab), refresh=True).costs


def _layers(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"layers must be comma-separated integers, got '{text}'") from e


def read_costs(path: str):
    """The costs JSON written by ``pacer tune --measure-costs``, or a cost profile (``pacer calibrate --export``,
    ``docs/profiles/``: its costs at a short context), so that thresholds are chosen under the profile a benchmark
    prices with; a bad file is a one-line error."""
    from .io import BadJson, read_json

    make = "make one with pacer tune --measure-costs or pacer calibrate --export"
    try:
        doc = read_json(path, "costs file", make)
    except BadJson as e:
        if e.reason == "missing" or e.reason.startswith(("a folder", "unreadable")):
            raise PacerError(f"cannot read costs file {path}: {e.reason}") from None
        raise PacerError(f"costs file {path} is not a costs JSON ({make}): {e.reason}") from None
    try:
        if isinstance(doc, dict) and str(doc.get("format", "")).startswith("pacer-profile/"):
            from .profiles import Profile

            return Profile.from_dict(doc, f"cost profile {path}").costs()
        return Costs.from_dict(doc)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise PacerError(f"costs file {path} is not a costs JSON (make one with pacer tune --measure-costs): "
                         f"{type(e).__name__}: {e}") from e


def _names(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def _temperatures(text: str) -> tuple[float, ...]:
    try:
        temps = tuple(float(x) for x in text.split(","))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"temperatures must be comma-separated numbers, got '{text}'") from e
    if not temps or any(not 0.0 <= t <= 2.0 for t in temps):
        raise argparse.ArgumentTypeError(f"temperatures must lie in 0..2 (0 = greedy), got '{text}'")
    return temps


def cmd_collect(args) -> int:
    from .args import load_decoder
    from .preverify.collect import collect
    from .preverify.features import FeatureSpec

    if args.n <= 0 or args.max_new_tokens <= 0 or args.max_draft <= 0:
        raise PacerError("--n, --max-new-tokens and --max-draft must be >= 1")
    check_out_dir(args.out)  # before any model loads
    dec = load_decoder(args)
    info = dec.draft_info
    layers = args.layers if args.layers is not None else backends.of(info).default_layers
    spec = FeatureSpec(layers, info.hidden_size, args.max_draft,
                       target_hidden=dec.target_info.hidden_size if args.target_hidden else 0)
    spec.check_fits(info.layers, info.hidden_size, f"the draft {args.draft}")
    offered = info.open().hidden_layers
    if offered is not None and not set(layers) <= set(offered):
        raise PacerError(f"the {info.backend} backend gives the draft's hidden layer(s) {list(offered)} only; "
                         f"pass --layers {','.join(map(str, offered))}")
    manifest = collect(dec, Path(args.out), args.n, args.max_new_tokens, spec, args.seed, args.shard_size,
                       args.skip, temperatures=args.temperatures)
    if not manifest["tokens"]:  # every prompt ended before its first round: nothing to train on is no success
        raise PacerError(f"pacer collect recorded no draft token from {manifest['prompts_done']} prompt(s) into "
                         f"{args.out}; nothing to train on (raise --max-new-tokens or choose other prompts)")
    if "costs" not in manifest:
        from .io import atomic_write_text

        manifest["costs"] = measure_costs(dec).to_dict()
        atomic_write_text(Path(args.out) / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    print(f"collected {manifest['tokens']} draft tokens in {manifest['rounds']} rounds from "
          f"{manifest['prompts_done']} prompts into {args.out}")
    return 0


def cmd_train(args) -> int:
    from .preverify.train import train

    check_out_dir(args.out)
    costs = read_costs(args.costs) if args.costs else None
    cfg = train(Path(args.data), Path(args.out), args.kind, args.block_size, args.epochs, args.seed, args.val_frac,
                costs, args.min_draft, args.d, args.layers, drop_scalars=args.drop_scalars, ablate=args.ablate,
                rank=args.rank, weighted=args.class_weights, context=args.context, token_weight=args.token_weight)
    v = cfg["validation"]
    print(json.dumps({"checkpoint": args.out, "kind": args.kind, "block": cfg["block"], "params": cfg["params"],
                      "threshold": cfg["threshold"], **{k: v[k] for k in v if k != "calibration"}}, indent=2))
    return 0


def cmd_tune(args) -> int:
    from .preverify.train import retune

    # every bad combination fails before the (slow) model loading and cost measurement
    if not args.checkpoint and not args.measure_costs:
        raise PacerError("pacer tune: pass --measure-costs FILE and/or --checkpoint CKPT --data DIR")
    if args.checkpoint and not args.data:
        raise PacerError("pacer tune --checkpoint needs --data (the collected rounds to tune on)")
    if args.checkpoint and not args.measure_costs and not args.costs:
        raise PacerError("pacer tune --checkpoint needs --costs FILE or --measure-costs FILE")
    costs = read_costs(args.costs) if args.checkpoint and not args.measure_costs else None
    if args.measure_costs:
        check_out_file(args.measure_costs, "--measure-costs")  # before any model loads
        from .args import load_decoder
        from .io import atomic_write_text

        dec = load_decoder(args)
        costs = measure_costs(dec)
        atomic_write_text(Path(args.measure_costs), json.dumps(costs.to_dict(), indent=2) + "\n")
        print(json.dumps(costs.to_dict(), indent=2))
    if args.checkpoint:
        cfg = retune(Path(args.checkpoint), Path(args.data), costs, args.min_draft, args.held_out)
        print(f"threshold {cfg['threshold']} (predicted speedup {cfg['validation']['predicted_speedup']}x)")
    return 0


def register(sub) -> None:
    c = sub.add_parser("collect", help="record draft features + target verdicts on a held-out code/math/chat mix")
    c.add_argument("--out", required=True, help="output folder (resumable)")
    c.add_argument("--n", type=Count("--n", 1, MAX_PROMPTS), default=300, help="number of prompts")
    c.add_argument("--max-new-tokens", type=Count("--max-new-tokens", 1, MAX_NEW_TOKENS), default=48)
    c.add_argument("--max-draft", type=Count("--max-draft", 1, MAX_DRAFT), default=16,
                   help="draft tokens per round while collecting")
    c.add_argument("--layers", type=_layers, default=None,
                   help="draft hidden-state layers, e.g. -13,-1 (default: -13,-1; -1 on the llamacpp backend)")
    c.add_argument("--target-hidden", action="store_true",
                   help="also record the target's final hidden state at each round's start (the previous "
                        "verification's bonus position), once per round")
    c.add_argument("--seed", type=Count("--seed", MIN_SEED, MAX_SEED), default=0)
    c.add_argument("--shard-size", type=Count("--shard-size", 1, MAX_SHARD), default=4, help="prompts per shard")
    c.add_argument("--skip", type=Count("--skip", 0, MAX_PROMPTS), default=0,
                   help="skip this many prompts of the mix first (parallel collections into other --out)")
    c.add_argument("--temperatures", type=_temperatures, default=(0.0, 0.7, 1.0),
                   help="comma-separated, cycled over the prompts; 0 = greedy (default: 0,0.7,1.0)")
    add_model_args(c)
    c.set_defaults(func=cmd_collect)

    t = sub.add_parser("train", help="train the pre-verification layer (or the SpecDec++ head)")
    t.add_argument("--data", required=True, help="folder(s) made by pacer collect, comma-separated")
    t.add_argument("--out", required=True, help="checkpoint folder")
    t.add_argument("--kind", choices=["pacer", "specdecpp"], default="pacer")
    t.add_argument("--block", dest="block_size", type=Count("--block", 1, MAX_DRAFT), default=4,
                   help="block size b")
    t.add_argument("--epochs", type=Count("--epochs", 1, MAX_EPOCHS), default=20)
    t.add_argument("--seed", type=Count("--seed", MIN_SEED, MAX_SEED), default=0)
    t.add_argument("--val-frac", type=float, default=0.2)
    t.add_argument("--d", type=Count("--d", 1, MAX_WIDTH), default=64, help="width of the layer")
    t.add_argument("--rank", type=Count("--rank", 0, MAX_WIDTH), default=8,
                   help="rank of the hidden-state bottleneck (0: a full projection)")
    t.add_argument("--no-class-weights", dest="class_weights", action="store_false",
                   help="plain likelihood: no re-weighting of accepted / rejected labels to balance them")
    t.add_argument("--token-weight", type=float, default=0.5,
                   help="pacer: weight of the per-token conditional loss beside the block-survival loss")
    t.add_argument("--no-context", dest="context", action="store_false",
                   help="pacer: no attention over the draft's earlier tokens (an ablation: each token scored from its "
                        "own features)")
    t.add_argument("--layers", type=_layers, default=None, help="use only these recorded layers (ablation)")
    t.add_argument("--min-draft", type=Count("--min-draft", 0, MAX_DRAFT), default=1)
    t.add_argument("--drop-scalars", type=_names, default=(), metavar="NAMES",
                   help="scalar features the model does not read, comma-separated (pacer.preverify.features)")
    t.add_argument("--ablate", type=_names, default=(), metavar="GROUPS",
                   help="retrain without each of these scalar groups (comma-separated, or all: target-bonus, "
                        "target-accepted, accepted-count, target-state, round-history, draft-q) and record "
                        "the ablation in the checkpoint")
    t.add_argument("--costs", default=None, help="costs JSON (pacer tune --measure-costs) or a cost profile "
                   "(pacer calibrate --export, docs/profiles/): the layer's and the rules' thresholds are chosen "
                   "under these costs; default: the collection's measured ones")
    t.set_defaults(func=cmd_train)

    u = sub.add_parser("tune", help="measure this machine's forward costs; re-choose a checkpoint's threshold")
    u.add_argument("--measure-costs", default=None, metavar="FILE", help="measure and write costs JSON here")
    u.add_argument("--checkpoint", default=None)
    u.add_argument("--data", default=None)
    u.add_argument("--costs", default=None, help="costs JSON or a cost profile (as pacer train --costs)")
    u.add_argument("--min-draft", type=Count("--min-draft", 0, MAX_DRAFT), default=None)
    u.add_argument("--held-out", action="store_true",
                   help="--data holds no prompt the checkpoint was trained on: tune on all of it (default: its "
                        "validation split)")
    add_model_args(u)
    u.set_defaults(func=cmd_tune)

"""``pacer collect``: record draft features and target verdicts for training the pre-verification layer.

The pair decodes held-out prompts (ShareGPT first turns, never the evaluation sets) with the ordinary loop and a
fixed, long draft (``max_draft`` tokens a round), so that rejections are seen; a recording policy stores, for every
draft token, the features of :mod:`pacer.preverify.features` and its labels. Nothing is re-run for features.

Output folder: ``shard-00000.safetensors, ...`` (one per ``shard_size`` prompts) and ``manifest.json`` naming the
model fingerprints, the feature spec, the seed, the prompts done and the shards. Each shard and the manifest are
written atomically after a shard completes, so an interrupted run resumes at the next unfinished shard.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save

from ..data.sharegpt import sharegpt_prompts
from ..errors import PacerError
from ..io import atomic_write_bytes, atomic_write_text
from ..policies import DraftState, FixedPolicy, RoundResult
from .features import FeatureSpec, RoundHistory, scalar_features


@dataclass
class Recorder(FixedPolicy):
    """A fixed-γ policy that records every round's features and labels (see :mod:`features`)."""

    spec: FeatureSpec = field(default_factory=FeatureSpec)
    rows: dict[str, list] = field(default_factory=dict)
    prompt_id: int = 0
    round_id: int = 0

    def __post_init__(self) -> None:
        super().__init__(gamma=self.spec.max_draft, min_draft=self.spec.max_draft, max_draft=self.spec.max_draft)
        self.hidden_layers = self.spec.hidden_layers
        self.needs_soft = True
        self.hist = RoundHistory()
        self.rows = {k: [] for k in ("hidden", "scalars", "accepted", "cond_valid", "soft", "position", "round",
                                     "prompt")}

    def reset(self) -> None:
        self.hist.reset()

    def update(self, state: DraftState, result: RoundResult) -> None:
        n = state.n
        if n == 0:
            return
        self.rows["hidden"].append(torch.stack(state.hidden).to("cpu", torch.float16))  # the draft may be on a GPU
        self.rows["scalars"].append(scalar_features(state, self.spec, self.hist))
        idx = torch.arange(1, n + 1)
        self.rows["accepted"].append((idx <= result.accepted).to(torch.uint8))
        self.rows["cond_valid"].append((idx <= result.accepted + 1).to(torch.uint8))
        self.rows["soft"].append(torch.tensor(result.soft, dtype=torch.float32))
        self.rows["position"].append(idx.to(torch.int16))
        self.rows["round"].append(torch.full((n,), self.round_id, dtype=torch.int32))
        self.rows["prompt"].append(torch.full((n,), self.prompt_id, dtype=torch.int32))
        self.round_id += 1
        self.hist.update(result.drafted, result.accepted)

    def take(self) -> dict[str, torch.Tensor]:
        out = {k: torch.cat(v) for k, v in self.rows.items() if v}
        self.rows = {k: [] for k in self.rows}
        return out


def collect(decoder, out_dir: Path, n_prompts: int, max_new_tokens: int = 48, spec: FeatureSpec | None = None,
            seed: int = 0, shard_size: int = 4, skip: int = 0, progress: bool = True) -> dict:
    """Run the recording loop over ``n_prompts`` held-out prompts; resumable (see the module docstring)."""
    from tqdm import tqdm

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    spec = spec or FeatureSpec(hidden_size=decoder.draft_info.hidden_size)
    manifest_path = out_dir / "manifest.json"
    ident = {"target": decoder.target_info.fingerprint, "draft": decoder.draft_info.fingerprint,
             "feature_spec": spec.to_dict(), "seed": seed, "max_new_tokens": max_new_tokens,
             "source": "sharegpt first turns, chat template", "skip": skip,
             "backend": decoder.backend}
    if manifest_path.exists():
        manifest = read_manifest(manifest_path)
        if any({"backend": "transformers", **manifest}.get(k) != v for k, v in ident.items()):
            raise PacerError(f"{out_dir} holds data collected with other settings or models; use a new --out folder")
    else:
        manifest = {**ident, "shards": [], "prompts_done": 0, "tokens": 0, "rounds": 0, "seconds": 0.0}
    rows = decoder.draft_rows(decoder.draft_vocab)  # the draft's vocabulary changes its features: say which
    manifest.setdefault("draft_vocab", 0 if rows is None else len(rows))
    room = decoder.target.context - max_new_tokens - spec.max_draft - 2  # the prompt plus a full answer must fit
    prompts, skipped = load_prompts(decoder, n_prompts, seed, skip, min(384, room))
    manifest["prompts_skipped"] = skipped
    rec = Recorder(spec=spec)
    rec.round_id = manifest["rounds"]  # round ids stay unique across resumed runs
    done = manifest["prompts_done"]
    bar = tqdm(total=len(prompts), initial=done, desc="collect", unit="prompt", disable=not progress)
    while done < len(prompts):
        t0 = time.perf_counter()
        batch = range(done, min(done + shard_size, len(prompts)))
        for pid in batch:
            rec.prompt_id = pid
            decoder.generate(prompts[pid], "sd", max_new_tokens, chat=True, policy=rec)
            bar.update(1)
        data = rec.take()
        name = f"shard-{len(manifest['shards']):05d}.safetensors"
        atomic_write_bytes(out_dir / name, save({k: v.contiguous() for k, v in data.items()}))
        done = batch.stop
        manifest["shards"].append(name)
        manifest["prompts_done"] = done
        manifest["tokens"] += int(data["accepted"].numel()) if data else 0
        manifest["rounds"] = rec.round_id
        manifest["seconds"] += time.perf_counter() - t0
        atomic_write_text(manifest_path, json.dumps(manifest, indent=2) + "\n")
    bar.close()
    return manifest


def read_manifest(path: Path) -> dict:
    """A collection's ``manifest.json``, or a one-line error saying what to do."""
    try:
        manifest = json.loads(path.read_text())
        if not isinstance(manifest, dict) or not isinstance(manifest.get("shards"), list):
            raise ValueError("not a collection manifest")
    except (OSError, ValueError) as e:
        raise PacerError(f"{path} is damaged ({e}); delete the collection folder and collect again, or restore "
                         f"the file") from None
    return manifest


def load_prompts(decoder, n: int, seed: int, skip: int = 0,
                 max_prompt_tokens: int = 384) -> tuple[list[list[int]], int]:
    """A seeded choice of ShareGPT first turns that fit (``8..max_prompt_tokens`` tokens), as chat-templated
    token ids, and how many were skipped for not fitting."""
    texts = sharegpt_prompts()
    random.Random(seed).shuffle(texts)
    out, skipped = [], 0
    for t in texts[skip:]:
        try:
            ids = decoder.encode(t, chat=True)
        except PacerError:  # longer than the model's context (or empty): not a prompt this pair can take
            ids = []
        if 8 <= len(ids) <= max_prompt_tokens:
            out.append(ids)
        else:
            skipped += 1
        if len(out) >= n:
            break
    return out, skipped


def load_dataset(folder: Path | str) -> tuple[dict[str, torch.Tensor], dict]:
    """Concatenate a collection's shards; returns the tensors and the manifest.

    ``folder`` may name several collections separated by commas (e.g. made in parallel with different ``skip``);
    they must share models and feature spec; round and prompt ids are offset so that they stay unique.
    """
    folders = [Path(f) for f in str(folder).split(",") if f]
    datas, manifests = [], []
    for f in folders:
        mpath = f / "manifest.json"
        if not mpath.exists():
            raise PacerError(f"{f} has no manifest.json; run `pacer collect --out {f}` first")
        manifest = read_manifest(mpath)
        parts = [load_file(str(f / s)) for s in manifest["shards"]]
        if not parts:
            raise PacerError(f"{f} holds no data shards yet")
        datas.append({k: torch.cat([p[k] for p in parts]) for k in parts[0]})
        manifests.append(manifest)
    first = manifests[0]
    for f, m in zip(folders[1:], manifests[1:], strict=True):
        if any(m.get(k) != first.get(k) for k in ("target", "draft", "feature_spec")):
            raise PacerError(f"{f} was collected with other models or features than {folders[0]}")
    round_off = prompt_off = 0
    for d in datas:
        d["round"] = d["round"] + round_off
        d["prompt"] = d["prompt"] + prompt_off
        round_off = int(d["round"].max()) + 1
        prompt_off = int(d["prompt"].max()) + 1
    data = {k: torch.cat([d[k] for d in datas]) for k in datas[0]}
    manifest = dict(first)
    manifest["prompts_done"] = sum(m["prompts_done"] for m in manifests)
    manifest["collections"] = [str(f) for f in folders]
    return data, manifest

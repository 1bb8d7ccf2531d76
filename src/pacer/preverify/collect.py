"""``pacer collect``: record draft features and target verdicts for training the pre-verification layer.

The pair decodes held-out prompts (a code / math / chat mix checked against every benchmark question,
:mod:`pacer.data.mix`) with the ordinary loop and a fixed, long draft (``max_draft`` tokens a round), so that
rejections are seen; a recording policy stores, for every draft token, the features of
:mod:`pacer.preverify.features` and its labels. Nothing is re-run for features. Prompt ``i`` is decoded at
temperature ``temperatures[i % len(temperatures)]`` (0: greedy) with sampling seed ``seed * 1_000_003 + i``, so the
labels cover greedy and sampling mode; every token row records its temperature and prompt category.

Output folder: ``shard-00000.safetensors, ...`` (one per ``shard_size`` prompts) and ``manifest.json`` naming the
model fingerprints, the feature spec, the seed, the temperatures, the prompt mix's report (candidates, benchmark
overlaps dropped), the prompts done and the shards, each with its size, sha256 and the prompts it holds
(``shard_records``). Each shard and the manifest are written atomically after a shard completes, so an interrupted run
resumes at the next unfinished shard; a resumed run first checks every shard it has, and collects a damaged or
missing one again (with a note); ``pacer train`` refuses one.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save

from .. import backends
from ..data.mix import CATEGORIES, TrainingPrompt, training_mix
from ..errors import PacerError
from ..io import atomic_write_bytes, atomic_write_text
from ..policies import FixedPolicy
from ..rounds import DRAFT_FEATURES, DraftState, RoundResult
from ..sampling import SamplingConfig
from .features import FeatureSpec, RoundHistory, needs_target_hidden, needs_target_state, scalar_features


@dataclass
class Recorder(FixedPolicy):
    """A fixed-γ policy that records every round's features and labels (see :mod:`features`)."""

    spec: FeatureSpec = field(default_factory=FeatureSpec)
    rows: dict[str, list] = field(default_factory=dict)
    prompt_id: int = 0
    round_id: int = 0
    category: int = 0

    def __post_init__(self) -> None:
        super().__init__(gamma=self.spec.max_draft, min_draft=self.spec.max_draft, max_draft=self.spec.max_draft)
        self.hidden_layers = self.spec.hidden_layers
        self.draft_features = DRAFT_FEATURES  # it records every feature (a fixed γ reads none)
        self.needs_soft = True
        self.needs_target_state = needs_target_state(self.spec)
        self.needs_target_hidden = needs_target_hidden(self.spec)
        self.hist = RoundHistory()
        # per token; with the target's hidden state also per round: ``round_target_hidden`` [rounds, H] (float16)
        # and the round id of each row, ``round_target_id``
        self.rows = {k: [] for k in ("hidden", "scalars", "accepted", "cond_valid", "soft", "position", "round",
                                     "prompt", "temperature", "category", "round_target_hidden", "round_target_id")}

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
        self.rows["temperature"].append(torch.full((n,), state.temperature, dtype=torch.float32))
        self.rows["category"].append(torch.full((n,), self.category, dtype=torch.int8))
        if self.needs_target_hidden:  # what this round's features saw: the previous verification's state
            self.rows["round_target_hidden"].append(self.hist.target_row(self.spec.target_hidden)[None].half())
            self.rows["round_target_id"].append(torch.tensor([self.round_id], dtype=torch.int32))
        self.round_id += 1
        self.hist.update(result.drafted, result.accepted, result.target_entropy, result.target_margin,
                         result.target_hidden)

    def take(self) -> dict[str, torch.Tensor]:
        out = {k: torch.cat(v) for k, v in self.rows.items() if v}
        self.rows = {k: [] for k in self.rows}
        return out


def collect(decoder, out_dir: Path, n_prompts: int, max_new_tokens: int = 48, spec: FeatureSpec | None = None,
            seed: int = 0, shard_size: int = 4, skip: int = 0, progress: bool = True,
            temperatures: tuple[float, ...] = (0.0,)) -> dict:
    """Run the recording loop over ``n_prompts`` held-out prompts; resumable (see the module docstring)."""
    from tqdm import tqdm

    out_dir = Path(out_dir)
    spec = spec or FeatureSpec(hidden_size=decoder.draft_info.hidden_size)
    context = decoder.target.context
    room = context - max_new_tokens - spec.max_draft - 2  # the prompt plus a full answer must fit
    if room < MIN_PROMPT_TOKENS:
        raise PacerError(f"--max-new-tokens {max_new_tokens} and --max-draft {spec.max_draft} leave no room for a "
                         f"prompt ({MIN_PROMPT_TOKENS}+ tokens) in the target's context of {context} tokens: nothing "
                         f"would be collected; lower them")
    manifest_path = out_dir / "manifest.json"
    ident = {"target": decoder.target_info.fingerprint, "draft": decoder.draft_info.fingerprint,
             "feature_spec": spec.to_dict(), "seed": seed, "max_new_tokens": max_new_tokens,
             "source": "mix/1 (pacer.data.mix)", "skip": skip, "temperatures": list(temperatures),
             "backend": decoder.backend}
    if backends.get(decoder.backend).dtypes:  # the weights' dtype changes the features (--dtype auto may differ)
        ident["dtype"] = decoder.target_info.dtype_name
    if manifest_path.exists():
        manifest = read_manifest(manifest_path)
        # collections from before a setting was recorded: the transformers backend, bfloat16
        old = {"backend": "transformers", **({"dtype": "bfloat16"} if "dtype" in ident else {}), **manifest}
        if any(old.get(k) != v for k, v in ident.items()):
            raise PacerError(f"{out_dir} holds data collected with other settings or models; use a new --out folder")
    else:
        manifest = {**ident, "shards": [], "prompts_done": 0, "tokens": 0, "rounds": 0, "seconds": 0.0}
    rows = decoder.draft_rows(decoder.draft_vocab)  # the draft's vocabulary changes its features: say which
    manifest.setdefault("draft_vocab", 0 if rows is None else len(rows))
    records = manifest.setdefault("shard_records", {})
    damaged = [(name, problem) for name in manifest["shards"]
               if (problem := shard_problem(out_dir, name, records.get(name))) is not None]
    for name, problem in damaged:
        if not isinstance(records.get(name), dict) or "prompts" not in records[name]:
            raise PacerError(f"{out_dir / name} is damaged ({problem}) and this collection (made by an older pacer) "
                             f"does not record which prompts it holds; collect again into a new --out folder")
    prompts, report = load_prompts(decoder, max(n_prompts, manifest["prompts_done"]) + skip, seed, min(384, room))
    if len(prompts) <= skip:
        raise PacerError(f"the prompt mix holds {len(prompts)} prompt(s) that fit this pair within "
                         f"{min(384, room)} tokens; --skip {skip} leaves none to collect: lower --skip")
    prompts = prompts[skip:]
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest["mix"] = report
    rec = Recorder(spec=spec)
    rec.round_id = manifest["rounds"]  # round ids stay unique across resumed runs
    done = manifest["prompts_done"]
    bar = tqdm(total=max(len(prompts), done), initial=done, desc="collect", unit="prompt", disable=not progress)

    def run(batch: range, name: str) -> None:
        """Decode the prompts of ``batch`` and write them as shard ``name`` (and the manifest)."""
        t0 = time.perf_counter()
        for pid in batch:
            ids, category = prompts[pid]
            rec.prompt_id = pid
            rec.category = CATEGORIES.index(category)
            sampling = SamplingConfig(temperature=temperatures[pid % len(temperatures)], seed=seed * 1_000_003 + pid)
            decoder.generate(ids, "sd", max_new_tokens, sampling=sampling, policy=rec)
            bar.update(1)
        data = rec.take()
        blob = save({k: v.contiguous() for k, v in data.items()})
        atomic_write_bytes(out_dir / name, blob)
        tokens = int(data["accepted"].numel()) if data else 0
        old = records.get(name)
        manifest["tokens"] += tokens - (old["tokens"] if isinstance(old, dict) and "tokens" in old else 0)
        records[name] = {"size": len(blob), "sha256": hashlib.sha256(blob).hexdigest(),
                         "prompts": [batch.start, batch.stop], "tokens": tokens}
        manifest["rounds"] = rec.round_id
        manifest["seconds"] += time.perf_counter() - t0
        atomic_write_text(manifest_path, json.dumps(manifest, indent=2) + "\n")

    for name, problem in damaged:
        lo, hi = records[name]["prompts"]
        state = "missing" if problem == "it is missing" else f"damaged ({problem})"
        tqdm.write(f"pacer: note: shard {out_dir / name} is {state}; collecting its prompts {lo}..{hi - 1} again",
                   file=sys.stderr)
        bar.total += hi - lo  # the re-collected prompts count on the bar too
        run(range(lo, hi), name)
    while done < len(prompts):
        batch = range(done, min(done + shard_size, len(prompts)))
        name = f"shard-{len(manifest['shards']):05d}.safetensors"
        manifest["shards"].append(name)
        manifest["prompts_done"] = batch.stop
        run(batch, name)
        done = batch.stop
    bar.close()
    return manifest


def shard_problem(folder: Path, name: str, record: dict | None) -> str | None:
    """``None`` when shard ``name`` of the collection in ``folder`` is there and matches its ``record`` (size and
    sha256, written with it); else what is wrong, in a few words. A shard of an older pacer (no record) must at
    least read as a safetensors file."""
    path = folder / name
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return "it is missing"
    except OSError as e:
        return f"it cannot be read: {e.strerror or e}"
    if not isinstance(record, dict):
        try:
            load_file(str(path))
        except Exception as e:  # safetensors raises its own error types for a cut or garbled file
            return f"it is not a readable safetensors file: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        return None
    if size != record.get("size"):
        return f"it has {size} bytes, not {record.get('size')}"
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
    except OSError as e:
        return f"it cannot be read: {e.strerror or e}"
    if h.hexdigest() != record.get("sha256"):
        return "it does not match the sha256 recorded when it was written"
    return None


def read_manifest(path: Path) -> dict:
    """A collection's ``manifest.json``, or a one-line error saying what to do."""
    from ..io import BadJson, read_json

    try:
        manifest = read_json(path, "the collection manifest", "")
        why = "" if isinstance(manifest, dict) and isinstance(manifest.get("shards"), list) else \
            "not a collection manifest"
    except BadJson as e:
        why = e.reason
    if why:
        raise PacerError(f"{path} is damaged ({why}); delete the collection folder and collect again, or restore "
                         f"the file")
    return manifest


#: the shortest prompt a collection takes
MIN_PROMPT_TOKENS = 8


def load_prompts(decoder, n: int, seed: int, max_prompt_tokens: int = 384) -> tuple[list[tuple[list[int], str]], dict]:
    """``n`` prompts of the training mix (:func:`pacer.data.mix.training_mix`) that fit (``8..max_prompt_tokens``
    tokens), as token ids (chat-templated unless raw code) with their category, and the mix's report."""
    encoded: dict[str, list[int]] = {}

    def fits(p: TrainingPrompt) -> bool:
        try:
            ids = decoder.encode(p.text, chat=p.chat)
        except PacerError:  # longer than the model's context (or empty): not a prompt this pair can take
            return False
        encoded[p.text] = ids
        return MIN_PROMPT_TOKENS <= len(ids) <= max_prompt_tokens

    prompts, report = training_mix(n, seed, accept=fits)
    return [(encoded[p.text], p.category) for p in prompts], report


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
        records = manifest.get("shard_records") if isinstance(manifest.get("shard_records"), dict) else {}
        parts = []
        for s in manifest["shards"]:
            problem = shard_problem(f, str(s), records.get(s))
            if problem is not None:
                state = "missing" if problem == "it is missing" else f"damaged ({problem})"
                raise PacerError(f"shard {f / str(s)} is {state}; run pacer collect with the same settings and "
                                 f"--out {f} to collect it again")
            parts.append(load_file(str(f / s)))
        if not parts:
            raise PacerError(f"{f} holds no data shards yet")
        try:
            datas.append({k: torch.cat([p[k] for p in parts]) for k in parts[0]})
        except (KeyError, RuntimeError) as e:
            raise PacerError(f"the shards of {f} do not fit together ({e}); collect again into a new --out "
                             f"folder") from None
        if "accepted" not in datas[-1] or not datas[-1]["accepted"].numel():  # nothing to learn from
            raise PacerError(f"the collection {f} holds no draft token; collect some (pacer collect --n)")
        manifests.append(manifest)
    first = manifests[0]
    for f, m in zip(folders[1:], manifests[1:], strict=True):
        if any(m.get(k) != first.get(k) for k in ("target", "draft", "feature_spec")):
            raise PacerError(f"{f} was collected with other models or features than {folders[0]}")
    round_off = prompt_off = 0
    for d in datas:
        if "round_target_id" in d:
            d["round_target_id"] = d["round_target_id"] + round_off
        d["round"] = d["round"] + round_off
        d["prompt"] = d["prompt"] + prompt_off
        round_off = int(d["round"].max()) + 1
        prompt_off = int(d["prompt"].max()) + 1
    data = {k: torch.cat([d[k] for d in datas]) for k in datas[0]}
    manifest = dict(first)
    manifest["prompts_done"] = sum(m["prompts_done"] for m in manifests)
    manifest["collections"] = [str(f) for f in folders]
    return data, manifest

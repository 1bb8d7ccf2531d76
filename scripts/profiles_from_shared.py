"""Build the shipped cost profiles (docs/profiles/*.json, ``pacer-profile/1``) from the raw measurements of the
Zen 4 machine in ``../shared/profiles/``: its two ``pacer calibrate`` caches (the pair's fingerprints and dtypes,
the draft's prefill per token) and its context sweep (``c_t(k)`` for k = 1, 2, 4, 8, 16 and the draft token after
32, 512 and 2048 cached tokens, the target's prefill per token, one run a few minutes later).

The curves come from the context sweep only (one run: the k=1 point of the two runs differed by 240 vs 345 ms on
that shared machine, and mixing them would make a longer context look cheaper); the identity, dtypes and the draft's
prefill per token from the calibration cache. Tree forwards were not measured there: a tree is priced as a chain.
A prefill point its own curve contradicts (:func:`pacer.profiles.doubtful_prefills`: the sweep's 32-token prompts,
at about 1.5x the per-token cost of a 16-token forward, likely timed on cold first forwards) is left out, with a note.

Usage: python scripts/profiles_from_shared.py [SHARED_PROFILES_DIR] [OUT_DIR]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pacer.machine import describe_cpu  # noqa: E402
from pacer.profiles import Profile, doubtful_prefills  # noqa: E402

SRC = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "shared" / "profiles"
OUT = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(__file__).resolve().parents[1] / "docs" / "profiles"
FILES = {"transformers": ("zen4-avx512bf16-transformers-bf16", "zen4-avx512bf16-transformers-bf16.calibration.json"),
         "llamacpp": ("zen4-avx512bf16-llamacpp-q4km", "zen4-avx512bf16-llamacpp-q4km.calibration.json")}


def main() -> None:
    sweep = json.loads((SRC / "zen4-avx512bf16-context-costs.json").read_text())
    OUT.mkdir(parents=True, exist_ok=True)
    for backend, (name, cal_file) in FILES.items():
        cal = json.loads((SRC / cal_file).read_text())
        key, payload = cal["key"], cal["payload"]
        rows = [r for r in sweep["rows"] if r["backend"] == backend]
        target = {r["context"]: {int(k): v / 1e3 for k, v in r["c_t_ms"].items()} for r in rows}
        draft = {r["context"]: {1: r["c_d_ms"] / 1e3} for r in rows}
        prefill = {r["context"]: r["target_prefill_ms_per_token"] / 1e3 for r in rows}
        doubtful = doubtful_prefills(target, prefill)  # the sweep's 32-token prompts were its first forwards
        for n in doubtful:
            del prefill[n]
        prof = Profile(
            name, {"cpu": key["cpu"], "describe": describe_cpu(key["cpu"]), "threads": key["threads"],
                   "device": "cpu"},
            backend, key["runtime"], {"fingerprint": key["target"], "dtype": key["target_dtype"]},
            {"fingerprint": key["draft"], "dtype": key["draft_dtype"], "rows": key["draft_rows"]},
            target, prefill, draft, float(payload["costs"]["draft_prefill"]), measured="2026-12-04",
            source=f"shared/profiles: {cal_file} (identity, dtypes, draft prefill) and "
                   f"zen4-avx512bf16-context-costs.json (the curves: medians of 3 forwards, one run)",
            notes=["tree forwards were not measured on this machine: a tree is priced as a chain of the same length",
                   "between runs on this shared machine k=1 moved 240-345 ms (PyTorch) and 31-50 ms (llama.cpp)",
                   "prefill per token is the target's over a prompt of that many tokens",
                   *doubtful.values()])
        assert not prof.problems(), prof.problems()
        prof.save(OUT / f"{name}.json")
        print(f"{OUT / (name + '.json')}: c_t(1) at 32 = {target[32][1] * 1e3:.0f} ms")


if __name__ == "__main__":
    main()

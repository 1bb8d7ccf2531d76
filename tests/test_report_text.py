"""What a report says it checked (pacer.bench.report.markdown), on the committed reports' summaries: a sampling run
says no output was compared with plain decoding's (never "all checked greedy outputs are identical"), a greedy run
counts the outputs it compared, a divergence is judged by the one criterion the results page states, and a run
priced with a profile names the profile's content hash."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from pacer.bench.report import markdown

BENCH = Path(__file__).resolve().parents[1] / "docs" / "bench"


def summary(report: str) -> dict:
    return json.loads((BENCH / report / "summary.json").read_text(encoding="utf-8"))


def test_a_sampling_report_says_no_output_was_compared_and_names_its_profile_hash():
    s = summary("block-zen4-llamacpp/t07")
    text = markdown(s, s["meta"])
    assert "greedy outputs are identical" not in text
    assert "Sampling: no output is compared with plain decoding's token for token" in text
    assert f"content hash (sha256): `{s['meta']['profile_clock']['sha256']}`" in text


def test_a_greedy_report_counts_what_it_compared():
    s = copy.deepcopy(summary("tf-live-xeon-amx"))
    checked = sum(e.get("lossless_checked", 0) for e in s["groups"]["overall"].values())
    text = markdown(s, s["meta"])
    assert "LOSSLESSNESS" in text and "docs/results.md#losslessness" in text  # its divergences, by the criterion
    s["divergences"] = []
    assert f"All {checked} checked greedy outputs are identical" in markdown(s, s["meta"])
    for e in s["groups"]["overall"].values():
        e["lossless_checked"] = 0
    assert "No output was compared with plain decoding's" in markdown(s, s["meta"])


def test_every_committed_report_says_what_it_checked():
    """A committed sampling report never claims greedy outputs checked; one priced with a profile names its hash."""
    for folder in sorted(p.parent for p in BENCH.rglob("summary.json")):
        s = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
        text = (folder / "report.md").read_text(encoding="utf-8")
        if s["meta"].get("temperature"):
            assert "greedy outputs are identical" not in text, folder
        if sha := (s["meta"].get("profile_clock") or {}).get("sha256"):
            assert sha in text, folder

"""Every JSON file and text pacer reads goes through one checked reader (:func:`pacer.io.read_json` /
:func:`pacer.io.loads_json`): a document nested past what Python's parser takes (once a ``RecursionError``), an
integer of more digits than ``int()`` converts (once a ``ValueError``), bytes that are not UTF-8 and a folder where
the file should be are each one line naming the file and what to do (a :class:`~pacer.errors.PacerError`), or,
for a cache, an entry made again."""

from __future__ import annotations

from pathlib import Path

import pytest

from pacer.errors import PacerError

HOSTILE = {
    "nested past Python's parser": b'{"target": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "nested past pacer's bound": b'{"target": ' + b"[" * 80 + b"]" * 80 + b"}",
    "an integer of 5000 digits": b'{"format": "pacer-profile/1", "target": ' + b"7" * 5000 + b"}",
    "not UTF-8": b'{"target": "\xff\xfe"}',
    "a folder": None,
}


def _write(path: Path, content: bytes | None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    return path


def _profile(p: Path):
    from pacer.profiles import Profile

    Profile.load(p)


def _vllm_costs(p: Path):
    from pacer.integrations.vllm import load_costs

    load_costs(p)


def _tune_costs(p: Path):
    from pacer.preverify_cli import read_costs

    read_costs(str(p))


def _collection(p: Path):
    from pacer.preverify.collect import read_manifest

    read_manifest(p)


def _checkpoint(p: Path):
    from pacer.policies.learned import read_config

    read_config(p.parent)


def _questions(p: Path):
    from pacer.bench.data import load_question_file

    load_question_file(p)


READERS = {"cost profile": (_profile, "p.json"), "vLLM proposer's costs": (_vllm_costs, "p.json"),
           "pacer tune --costs": (_tune_costs, "p.json"), "collection manifest": (_collection, "manifest.json"),
           "checkpoint config": (_checkpoint, "ckpt/config.json"), "question file": (_questions, "q.jsonl")}


@pytest.mark.parametrize("content", list(HOSTILE))
@pytest.mark.parametrize("reader", list(READERS))
def test_every_file_reader_says_one_line(tmp_path, reader, content):
    read, name = READERS[reader]
    raw = HOSTILE[content]
    if reader == "question file" and raw is not None:
        raw = raw.replace(b"\n", b" ") + b"\n"
    p = _write(tmp_path / name, raw)
    if reader == "question file" and raw is None:
        pytest.skip("a question file that is a folder is refused before it is read (test_bench)")
    with pytest.raises(PacerError) as e:
        read(p)
    msg = str(e.value)
    assert "\n" not in msg and str(p) in msg and len(msg) < 400, msg


@pytest.mark.parametrize("content", list(HOSTILE))
def test_a_cache_entry_that_cannot_be_read_is_made_again(tmp_path, content):
    """The keyed store (calibrations, the dtype choice, draft vocabularies), manifests and file records: an entry
    that cannot be read is reported (the store) or ignored, and made again; never raised."""
    from pacer.cache import FileRecord, Manifest, Store

    store = Store("x", home=tmp_path)
    key = {"a": 1}
    _write(store.path(key), HOSTILE[content])
    payload, why = store.get(key)
    assert payload is None and str(store.path(key)) in why and "\n" not in why
    folder = tmp_path / "model"
    _write(folder / "pacer-manifest.json", HOSTILE[content])
    assert Manifest(folder).check() in ("its manifest is unreadable", "its manifest is not a pacer cache manifest")
    f = _write(tmp_path / "file.gguf", b"x")
    _write(tmp_path / "file.gguf.record.json", HOSTILE[content])
    assert FileRecord(f).read() is None


@pytest.mark.parametrize("content", list(HOSTILE)[:3])
def test_speculative_config_says_one_line(content):
    from pacer.serve.cli import speculative_config

    with pytest.raises(PacerError) as e:
        speculative_config(HOSTILE[content].decode())
    assert "\n" not in str(e.value) and "--speculative-config" in str(e.value)


@pytest.mark.parametrize("key", ["\u00b2", "9" * 5000, "\u0663"])
def test_a_cost_curve_key_is_ascii_digits(tmp_path, key):
    """``'²'.isdigit()`` and ``'٣'.isdigit()`` are true but ``int('²')`` fails; ``int`` refuses 5000 digits: each a
    field error naming the key (cut short), not a traceback."""
    from pacer.costs import BadField, Costs

    with pytest.raises(BadField) as e:
        Costs.from_dict({"draft": 0.01, "target": {key: 1.0}})
    assert "'target' k" in str(e.value) and len(str(e.value)) < 200

"""Small behaviours that a mutation audit found no test would notice if they broke: each test here fails
with the named bug planted (the phrase learned after a rejection, streamed text holding back split characters)."""

from __future__ import annotations

import io

import pytest

from pacer.drafters.pool import rejection_phrase
from pacer.streaming import TextStreamer
from pacer.tiny import tiny_tokenizer

# ---------------------------------------------------------------------------------------------- rejection_phrase
TOKENS, DRAFT = [1, 2, 3], [10, 11, 12, 13]
#: the target's argmax rows of one verification: row j is its token after the text and d_1..d_j (row 0 after the
#: text alone)
ARGMAX = [10, 20, 21, 22, 23]


@pytest.mark.parametrize("accepted,expected", [
    (0, ([3, 10, 20, 21, 22, 23], 2)),  # d_1 rejected: after "3 10" the target goes on with 20 (its row 1)
    (1, ([10, 11, 21, 22, 23], 2)),  # d_2 rejected: keyed by "10 11", continued from row 2
    (3, ([12, 13, 23], 2)),  # d_4, the last, rejected: one token after it
    (4, None),  # nothing rejected: nothing to learn
])
def test_rejection_phrase_continues_after_the_rejected_token(accepted, expected):
    """After ``d_{n+1}`` was rejected, the phrase is keyed by the text up to and including ``d_{n+1}`` and goes on
    with the target's tokens from the row after it (row ``n + 1``), not one position earlier."""
    assert rejection_phrase(TOKENS, DRAFT, ARGMAX, accepted, key_len=2) == expected


def test_rejection_phrase_reads_the_last_rows_and_a_longer_key():
    """Rows before the round's (``target_argmax`` may hold more) are skipped; the key is up to ``key_len`` tokens."""
    assert rejection_phrase(TOKENS, DRAFT, [99, 98, *ARGMAX], 1, key_len=3) == ([3, 10, 11, 21, 22, 23], 3)
    assert rejection_phrase(TOKENS, DRAFT, ARGMAX[:4], 1, key_len=2) is None  # too few rows for this draft


# ------------------------------------------------------------------------------------------------- streaming
TEXT = "héllo wörld €"


@pytest.mark.parametrize("step", [1, 2, 3])
def test_streaming_never_splits_a_character(step):
    """The tiny byte-level tokenizer splits 'é', 'ö' (2 bytes) and '€' (3 bytes) across tokens: what is written
    after each step is whole characters only, a prefix of the text, and all of it joined is the text."""
    tok = tiny_tokenizer()
    ids = tok.encode(TEXT, add_special_tokens=False)
    assert any("\ufffd" in tok.decode(ids[:i]) for i in range(1, len(ids)))  # the tokens do split characters
    out = io.StringIO()
    st = TextStreamer(tok, stream=out)
    for i in range(0, len(ids), step):
        st(ids[i : i + step])
        assert "\ufffd" not in out.getvalue() and TEXT.startswith(out.getvalue()), out.getvalue()
    st.finish(tok.decode(ids, skip_special_tokens=True))
    assert out.getvalue() == TEXT


def test_streaming_holds_back_a_split_character_before_a_stop_string():
    tok = tiny_tokenizer()
    ids = tok.encode(TEXT + " STOP", add_special_tokens=False)
    out = io.StringIO()
    st = TextStreamer(tok, stop=["STOP"], stream=out)
    for i in range(len(ids)):
        st(ids[i : i + 1])
        assert "\ufffd" not in out.getvalue() and "STOP" not in out.getvalue()
    assert out.getvalue() == TEXT + " "

"""Text that is not Unicode and clients that go away: a lone surrogate (JSON's ``"\\ud800"``, or a byte that is not
UTF-8 in a command-line argument) anywhere in a request or a file pacer reads is one line (HTTP 400 from the server,
exit 2 from the command line, a ``ValueError`` from the API), never a tokenizer's ``TypeError`` or a server error
while the answer is written; a client that declares a longer body than it sends is one line in the server's log."""

from __future__ import annotations

import logging
import socket
import time

import httpx
import pytest

import test_serve
from pacer import PacerError
from pacer.cli import main
from pacer.io import loads_json, read_json
from pacer.tiny import save_tiny_pair

dec, server = test_serve.dec, test_serve.server  # the served tiny pair's fixtures, shared with test_serve


LONE = [
    ("/v1/completions", rb'{"prompt": "a\ud800b", "max_tokens": 3}'),
    ("/v1/completions", rb'{"prompt": "\udfff", "max_tokens": 3}'),
    ("/v1/completions", rb'{"prompt": "ab", "max_tokens": 3, "stop": "\ud800"}'),
    ("/v1/completions", rb'{"prompt": "ab", "max_tokens": 3, "model": "\ud800"}'),  # echoed in an answer
    ("/v1/completions", rb'{"prompt": "ab", "max_tokens": 3, "pacer": {"method": "\ud800"}}'),  # in an error
    ("/v1/completions", rb'{"prompt": "ab", "max_tokens": 3, "pacer": {"\udc00": 1}}'),
    ("/v1/completions", rb'{"prompt": "ab", "max_tokens": 3, "user": "\ud800"}'),
    ("/v1/chat/completions", rb'{"messages": [{"role": "user", "content": "a\udc00"}], "max_tokens": 3}'),
    ("/v1/chat/completions", rb'{"messages": [{"role": "\udc00", "content": "a"}], "max_tokens": 3}'),
]


@pytest.mark.parametrize("path,raw", LONE, ids=[r.decode()[:40] for _, r in LONE])
def test_a_lone_surrogate_anywhere_in_a_request_is_a_400(server, path, raw):
    r = httpx.post(server.url + path, content=raw, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert "lone surrogate" in err["message"] and err["type"] == "invalid_request_error"


def test_a_surrogate_pair_is_one_character_and_taken(server):
    r = httpx.post(server.url + "/v1/completions", content=rb'{"prompt": "smile \ud83d\ude00", "max_tokens": 2}',
                   headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 200, r.text


def test_a_client_that_declares_a_longer_body_than_it_sends_is_one_log_line(server, caplog):
    caplog.set_level(logging.WARNING)
    for declared, sent in ((100, b'{"prompt"'), (10**6, b"")):
        caplog.clear()
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {declared}\r\n\r\n".encode() + sent)
        time.sleep(0.2)
        sock.close()
        deadline = time.monotonic() + 20
        while not any("went away" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
            time.sleep(0.05)
        time.sleep(0.3)  # whatever else the server logs about it
        mine = [r for r in caplog.records if "went away" in r.getMessage()]
        assert len(mine) == 1 and "\n" not in mine[0].getMessage()
        assert f"after {len(sent)} of {declared} body bytes" in mine[0].getMessage()
        assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR], \
            [r.getMessage() for r in caplog.records]
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200  # and it serves on


def test_the_api_refuses_a_prompt_history_or_stop_string_that_is_not_unicode(dec):
    from pacer.prompt import check_stop

    with pytest.raises(ValueError, match="the prompt is not valid Unicode text.*position 1"):
        dec.generate("a\ud800b", "sd", max_new_tokens=2)
    with pytest.raises(ValueError, match="a history message's content is not valid Unicode"):
        dec.encode("hi", chat=True, history=[{"role": "user", "content": "\udcff"}])
    with pytest.raises(ValueError, match="a stop string is not valid Unicode"):
        check_stop(["ok", "\ud800"])


def test_a_command_line_prompt_that_is_not_utf8_is_one_line(tmp_path, capsys, monkeypatch):
    """Python keeps an argument's byte that is not UTF-8 as a lone surrogate (``\\udcff``)."""
    monkeypatch.setenv("PACER_HOME", str(tmp_path / "home"))
    t, d = save_tiny_pair(tmp_path / "pair")
    capsys.readouterr()
    rc = main(["generate", "caf\udce9", "--target", str(t), "--draft", str(d), "--max-new-tokens", "2", "--dtype",
               "float32", "--threads", "1"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "the prompt is not valid Unicode text" in lines[0], lines


def test_the_json_reader_refuses_lone_surrogates_in_files_and_text(tmp_path):
    assert loads_json(r'{"a": "\ud83d\ude00 \u00e9 \\ud800"}', "x", "") == {"a": "\U0001F600 \u00e9 \\ud800"}
    for text in (r'{"a": "\ud800"}', r'["x", {"k": ["\uDBFF"]}]', r'{"\udc00": 1}', r'"\ud800\ud800"'):
        with pytest.raises(PacerError, match="a lone surrogate") as e:
            loads_json(text, "the thing", "fix it")
        assert "\n" not in str(e.value)
    (tmp_path / "p.json").write_text(r'{"name": "\ud800"}')
    with pytest.raises(PacerError, match=r"cost profile .*p.json cannot be read: a string holds '\\ud800'"):
        read_json(tmp_path / "p.json", "cost profile", "")

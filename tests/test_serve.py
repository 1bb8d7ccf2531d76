"""``pacer serve``: a real server on a loopback port over a tiny pair, spoken to with the official ``openai``
client and raw HTTP: streamed == non-streamed == ``Decoder.generate``; ``/metrics`` moves by exactly the
per-request numbers; a bounded load test (every request answered in full or 429, none mixed); clients that vanish
mid-stream; every bad request a 400 in OpenAI's error shape; the API key; the subcommand end to end."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from conftest import FLAT
from pacer import Decoder
from pacer.tiny import save_tiny_pair, tiny_pair

openai = pytest.importorskip("openai")

PROMPTS = ["hello world, this is", "def f(x):\n    return", "The 3 quick brown foxes", "a b c d e"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """uvicorn in a thread, on a free loopback port; stops by itself at the end of the test module."""

    def __init__(self, dec: Decoder, **kw) -> None:
        import uvicorn

        from pacer.serve.app import build_app
        from pacer.serve.protocol import Defaults

        self.app = build_app(dec, kw.pop("defaults", Defaults("sd", max_tokens=16)), "tiny", **kw)
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)

    def metrics(self) -> dict[str, float]:
        text = httpx.get(self.url + "/metrics", timeout=10).text
        return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(pacer:\S+?) (\S+)$", text, re.M)}


@pytest.fixture(scope="module")
def dec():
    return Decoder(*tiny_pair("close"), threads=1, costs=FLAT)


@pytest.fixture(scope="module")
def server(dec):
    s = Server(dec, queue_size=4)
    yield s
    s.stop()


def client(server: Server, **kw):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60, **kw)


def test_completions_streamed_equal_non_streamed_equal_generate(server, dec):
    c = client(server)
    for prompt in PROMPTS[:2]:
        for method in ("sd", "entropy", "ouroboros", "ar"):
            plain = c.completions.create(model="tiny", prompt=prompt, max_tokens=20, temperature=0,
                                         extra_body={"pacer": {"method": method}})
            pieces = [ch.choices[0].text for ch in c.completions.create(
                model="tiny", prompt=prompt, max_tokens=20, temperature=0, stream=True,
                extra_body={"pacer": {"method": method}}) if ch.choices]
            ref = dec.generate(prompt, "ar", max_new_tokens=20)
            assert plain.choices[0].text == "".join(pieces) == ref.text
            assert len(pieces) > 2  # really streamed
            assert plain.usage.completion_tokens == len(ref.token_ids)
            assert plain.choices[0].finish_reason == ("length" if ref.stats.finish_reason == "length" else "stop")
            assert plain.model_extra["pacer"]["method"] == method


def test_chat_streamed_equal_non_streamed_equal_generate(server, dec):
    c = client(server)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": PROMPTS[2]}]
    plain = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=16, temperature=0)
    chunks = list(c.chat.completions.create(model="tiny", messages=msgs, max_tokens=16, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    ref = dec.generate(PROMPTS[2], "sd", max_new_tokens=16, chat=True, history=msgs[:-1])
    assert plain.choices[0].message.content == text == ref.text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens == len(ref.token_ids)
    # seeded sampling is reproducible and the same streamed or not
    a = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=12, temperature=0.8, seed=7)
    b = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model="tiny", messages=msgs, max_tokens=12, temperature=0.8, seed=7, stream=True) if ch.choices)
    assert a.choices[0].message.content == b


def test_metrics_move_by_exactly_the_per_request_numbers(server):
    c = client(server)
    before = server.metrics()
    got, tokens = [], 0
    for i, prompt in enumerate(PROMPTS):
        r = c.completions.create(model="tiny", prompt=prompt, max_tokens=24, temperature=0,
                                 extra_body={"pacer": {"method": "sd", "gamma": 3 + i % 2}})
        got.append(r.model_extra["pacer"])
        tokens += r.usage.completion_tokens
    after = server.metrics()

    def delta(name):
        return after.get(name, 0) - before.get(name, 0)

    assert delta("pacer:spec_decode_num_drafts_total") == sum(m["num_drafts"] for m in got) > 0
    assert delta("pacer:spec_decode_num_draft_tokens_total") == sum(m["num_draft_tokens"] for m in got)
    assert delta("pacer:spec_decode_num_accepted_tokens_total") == sum(m["num_accepted_tokens"] for m in got) > 0
    text = httpx.get(server.url + "/metrics").text
    pos0 = sum(m["num_accepted_tokens_per_pos"][0] for m in got if m["num_accepted_tokens_per_pos"])
    assert pos0 > 0 and re.search(r'^pacer:spec_decode_num_accepted_tokens_per_pos_total\{position="0"\} \d+$', text,
                                  re.M)
    assert delta("pacer:spec_decode_draft_length_count") == sum(m["target_calls"] for m in got)
    assert delta("pacer:generation_tokens_total") == tokens > 0
    assert all(m["mean_acceptance_length"] >= 1 and 0 <= m["acceptance_rate"] <= 1 for m in got)


def test_bounded_load_every_request_answered_or_429(dec):
    """32 clients x 4 requests against a queue of 2: each gets its own full answer or a 429, nothing else."""
    expected = {p: dec.generate(p, "sd", max_new_tokens=8).text for p in PROMPTS}
    s = Server(dec, queue_size=2)
    try:
        def one(i: int):
            prompt = PROMPTS[i % len(PROMPTS)]
            r = httpx.post(s.url + "/v1/completions", timeout=60,
                           json={"prompt": prompt, "max_tokens": 8, "temperature": 0})
            return prompt, r

        with ThreadPoolExecutor(32) as pool:
            results = list(pool.map(one, range(128)))
        codes = [r.status_code for _, r in results]
        assert set(codes) <= {200, 429} and codes.count(200) >= 3 and codes.count(429) > 0
        for prompt, r in results:
            if r.status_code == 200:
                assert r.json()["choices"][0]["text"] == expected[prompt]
            else:
                assert r.headers["retry-after"] == "1" and r.json()["error"]["type"] == "rate_limit_exceeded"
        m = s.metrics()
        assert m['pacer:request_failure_total{reason="rejected"}'] == codes.count(429)
        assert m["pacer:num_requests_running"] == 0 and m["pacer:num_requests_waiting"] == 0
    finally:
        s.stop()


def test_clients_that_vanish_mid_stream_free_the_worker(dec):
    s = Server(dec, queue_size=16)
    try:
        for _ in range(10):
            with httpx.stream("POST", s.url + "/v1/completions", timeout=60,
                              json={"prompt": PROMPTS[0], "max_tokens": 400, "temperature": 0, "stream": True}) as r:
                next(r.iter_lines())  # the first chunk arrived: go away
        deadline = time.monotonic() + 60
        while s.metrics().get('pacer:request_failure_total{reason="cancelled"}', 0) < 10:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        r = httpx.post(s.url + "/v1/completions", json={"prompt": PROMPTS[1], "max_tokens": 8, "temperature": 0},
                       timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == dec.generate(PROMPTS[1], "sd",
                                                                                       max_new_tokens=8).text
        m = s.metrics()
        # the ten vanished clients' generations (400 tokens asked each) were ended within a few rounds
        assert m["pacer:generation_tokens_total"] - 8 < 200  # ~60 measured; one that ran on would add 400
    finally:
        s.stop()


BAD = {
    "malformed JSON": (b'{"prompt": "x",', "not valid JSON"),
    "not UTF-8": (b'{"prompt": "\xff\xfe"}', "not UTF-8"),
    "not an object": (b"[1, 2]", "JSON object"),
    "no prompt": (b"{}", "'prompt'"),
    "unknown method": (json.dumps({"prompt": "x", "pacer": {"method": "warp"}}).encode(), "unknown method 'warp'"),
    "option it does not take": (json.dumps({"prompt": "x", "pacer": {"method": "sd", "ngram": 3}}).encode(),
                                "takes no option 'ngram'"),
    "negative temperature": (json.dumps({"prompt": "x", "temperature": -1}).encode(), "temperature"),
    "top_p 0": (json.dumps({"prompt": "x", "top_p": 0}).encode(), "top_p"),
    "max_tokens 0": (json.dumps({"prompt": "x", "max_tokens": 0}).encode(), "max_tokens"),
    "n 2": (json.dumps({"prompt": "x", "n": 2}).encode(), "'n'"),
    "oracle sampling": (json.dumps({"prompt": "x", "temperature": 1, "pacer": {"method": "oracle"}}).encode(),
                        "greedy"),
    "prompt too long": (json.dumps({"prompt": "x" * 600}).encode(), "context"),
    "bad stop": (json.dumps({"prompt": "x", "stop": [""]}).encode(), "'stop'"),
    "empty stop": (json.dumps({"prompt": "x", "stop": ""}).encode(), "'stop'"),
    "stop an object": (json.dumps({"prompt": "x", "stop": {"a": 1}}).encode(), "'stop'"),
    "token id past the vocabulary": (json.dumps({"prompt": [1, 2, 10**6]}).encode(),
                                     "token id 1000000 is out of range"),
    "token id the vocabulary's size": (json.dumps({"prompt": [259]}).encode(), "token id 259 is out of range"),
    "seed past a generator's": (json.dumps({"prompt": "x", "seed": 10**30}).encode(), "seed must be between"),
    "five stop strings": (json.dumps({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}).encode(),
                          "up to 4"),  # OpenAI's limit
    "unknown verification rule": (json.dumps({"prompt": "x", "pacer": {"verify": "blocks"}}).encode(),
                                  "pacer.verify must be one of token, block, got 'blocks'"),
    # the JSON reader's whole error surface, in a field the server does not even read
    "nested deeper than Python reads": (b'{"prompt": "x", "user": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                                        "nested deeper than 64 levels"),
    "nested deeper than pacer reads": (b'{"prompt": "x", "user": ' + b"[" * 100 + b"]" * 100 + b"}",
                                       "nested deeper than 64 levels"),
    "an integer of 5000 digits": (b'{"prompt": "x", "user": ' + b"7" * 5000 + b"}", "4300"),
    # an extension or option that is not an object is refused, never taken as the defaults
    "pacer a list": (json.dumps({"prompt": "x", "pacer": []}).encode(), "'pacer' must be an object"),
    "pacer 0": (json.dumps({"prompt": "x", "pacer": 0}).encode(), "'pacer' must be an object"),
    "pacer false": (json.dumps({"prompt": "x", "pacer": False}).encode(), "'pacer' must be an object"),
    "stream_options a string": (json.dumps({"prompt": "x", "stream_options": "yes"}).encode(), "'stream_options'"),
    "model a number": (json.dumps({"prompt": "x", "model": 3}).encode(), "'model' must be a string"),
    # options whose cost is unbounded, or that write a cache, from a client
    "draft_vocab in a request": (json.dumps({"prompt": "x", "pacer": {"draft_vocab": 100}}).encode(),
                                 "'pacer.draft_vocab' is the server's"),
    "lookup_len past its bound": (json.dumps({"prompt": "x", "pacer": {"method": "ouroboros",
                                                                       "lookup_len": 10**9}}).encode(),
                                  "lookup_len must be <= 64"),
    "ngram past its bound": (json.dumps({"prompt": "x", "pacer": {"method": "lookup", "ngram": 10**7}}).encode(),
                             "ngram must be <= 64"),
    "key_len past its bound": (json.dumps({"prompt": "x", "pacer": {"method": "ouroboros",
                                                                    "key_len": 10**5}}).encode(),
                               "key_len must be <= 16"),
    "lookup_len 0": (json.dumps({"prompt": "x", "pacer": {"method": "ouroboros", "lookup_len": 0}}).encode(),
                     "lookup_len must be >= 1"),
}


def test_a_request_chooses_its_verification_rule(server, dec):
    """``{"pacer": {"verify": "block"}}``: the request's seeded draw is block verification's (``Decoder.generate``
    with the same seed and rule), and the server's own rule (``--verify``, :class:`Defaults`) where it names none."""
    from pacer import SamplingConfig
    from pacer.serve.protocol import Defaults, parse_request

    refs = {v: dec.generate(PROMPTS[0], "sd", max_new_tokens=16, gamma=3,
                            sampling=SamplingConfig(0.8, seed=7, verify=v)).text for v in ("token", "block")}
    assert refs["token"] != refs["block"]  # both valid draws, not the same ones: the rule is seen
    for v in ("token", "block"):
        r = httpx.post(server.url + "/v1/completions", json={"prompt": PROMPTS[0], "max_tokens": 16, "temperature": 0.8,
                                                             "seed": 7, "pacer": {"gamma": 3, "verify": v}})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == refs[v], r.text
    body = {"prompt": "x", "temperature": 0.8}
    assert parse_request(body, False, Defaults("sd"), "m").sampling.verify == "token"
    assert parse_request(body, False, Defaults("sd", verify="block"), "m").sampling.verify == "block"
    body["pacer"] = {"verify": "token"}
    assert parse_request(body, False, Defaults("sd", verify="block"), "m").sampling.verify == "token"


def test_a_body_past_the_bound_is_refused_before_it_is_read_whole(server):
    from pacer.serve.protocol import MAX_BODY

    body = json.dumps({"prompt": "x", "user": "y" * MAX_BODY}).encode()
    r = httpx.post(server.url + "/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "larger than 8 MiB" in r.json()["error"]["message"]

    def chunks():  # no Content-Length: refused while it streams in
        yield b'{"prompt": "x", "user": "'
        for _ in range(MAX_BODY >> 16):
            yield b"y" * (1 << 17)
        yield b'"}'

    r = httpx.post(server.url + "/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "the most the server reads" in r.json()["error"]["message"]


def test_four_stop_strings_are_taken(server):
    """OpenAI's limit is 4 stop strings: 4 are taken (5 are refused above)."""
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "hello", "max_tokens": 3, "temperature": 0,
                                                         "stop": ["\x00a", "\x00b", "\x00c", "\x00d"]})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("case", list(BAD))
def test_bad_requests_are_400_in_openai_shape(server, case):
    raw, words = BAD[case]
    before = server.metrics().get("pacer:spec_decode_draft_length_count", 0)
    r = httpx.post(server.url + "/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert words in err["message"] and err["type"] == "invalid_request_error"
    assert server.metrics().get("pacer:spec_decode_draft_length_count", 0) == before  # never reached the model


def test_chat_needs_the_users_last_message(server):
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": [{"role": "assistant", "content": "x"}]})
    assert r.status_code == 400 and "last message" in r.json()["error"]["message"]


def test_api_key_is_checked_on_every_request(dec):
    s = Server(dec, api_key="sesame")
    try:
        assert httpx.get(s.url + "/v1/models").status_code == 401
        assert httpx.get(s.url + "/metrics", headers={"authorization": "Bearer nope"}).status_code == 401
        ok = openai.OpenAI(base_url=s.url + "/v1", api_key="sesame", max_retries=0)
        assert [m.id for m in ok.models.list()] == ["tiny"]
        assert ok.completions.create(model="tiny", prompt="hi", max_tokens=3, temperature=0).usage.completion_tokens
    finally:
        s.stop()


def test_pacer_serve_subcommand_end_to_end(tmp_path):
    """``python -m pacer serve`` on a saved tiny pair: refuses a bad config before loading (exit 2, one line);
    serves; stops cleanly on SIGTERM."""
    t, d = save_tiny_pair(tmp_path)
    base = [sys.executable, "-m", "pacer", "serve", "--target", str(t), "--draft", str(d), "--dtype", "float32",
            "--threads", "1"]
    bad = subprocess.run([*base, "--speculative-config", "{nope"], capture_output=True, text=True, timeout=120)
    lines = bad.stderr.strip().splitlines()
    assert bad.returncode == 2 and len(lines) == 1 and lines[0].startswith(
        "pacer: error: --speculative-config cannot be read: not valid JSON (Expecting property name enclosed in "
        "double quotes")
    bad = subprocess.run([*base, "--speculative-config", '{"method": "sd", "num_speculative_tokens": 0}'],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--max-draft must be >= 1" in bad.stderr
    bad = subprocess.run([*base, "--verify", "token", "--speculative-config", '{"rejection_sample_method": "block"}'],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "pacer: error: --verify token and --speculative-config's rejection_sample_method (verify block) disagree; "
        "give one"]
    port = free_port()
    env = {**os.environ, "PACER_HOME": str(tmp_path / "home")}
    p = subprocess.Popen([*base, "--port", str(port), "--speculative-config",
                          '{"method": "sd", "num_speculative_tokens": 3}', "--cost-aware", "off", "--gamma", "3"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert p.poll() is None and time.monotonic() < deadline, p.stderr.read() if p.poll() is not None else ""
            time.sleep(0.2)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=60,
                       json={"prompt": "hello", "max_tokens": 10, "temperature": 0})
        assert r.status_code == 200 and max(r.json()["pacer"]["draft_lengths"]) == 3
    finally:
        p.send_signal(signal.SIGTERM)
        code = p.wait(60)
    # uvicorn shuts down gracefully, then re-raises the signal so the exit status says SIGTERM
    assert code in (0, -signal.SIGTERM) and "Traceback" not in p.stderr.read()


def test_a_request_past_its_timeout_is_ended_with_504(dec):
    s = Server(dec, request_timeout=1e-6)  # past by the first round's end, however fast the pair
    try:
        r = httpx.post(s.url + "/v1/completions", timeout=60,
                       json={"prompt": PROMPTS[0], "max_tokens": 480, "temperature": 0})
        assert r.status_code == 504 and r.json()["error"]["type"] == "timeout"
        m = s.metrics()
        assert m['pacer:request_failure_total{reason="timeout"}'] == 1
        assert m["pacer:generation_tokens_total"] < 480  # ended at a round, not run to the end
    finally:
        s.stop()


def test_a_request_never_chooses_a_file_or_folder_on_the_server(server, tmp_path, monkeypatch):
    """Every option that names a file or folder (``pool_file``, the pre-verifier's ``path``) is refused with a 400
    naming it, whatever the method: nothing is created where a request points, and a file it names is never
    opened (the pool reader, the pool writer's check and the checkpoint loader are never called)."""
    import pacer.io
    import pacer.policies.learned
    from pacer.drafters.pool import PhrasePool
    from pacer.methods import path_options

    assert set(path_options()) == {"pool_file", "path"}
    touched: list = []
    monkeypatch.setattr(PhrasePool, "load", lambda self, path, vocab: touched.append(("load", path)) or 0)
    monkeypatch.setattr(PhrasePool, "save", lambda self, path, vocab: touched.append(("save", path)))
    monkeypatch.setattr(pacer.io, "check_out_file", lambda path, what="": touched.append(("check", path)))
    monkeypatch.setattr(pacer.policies.learned, "make_learned_policy", lambda *a, **k: touched.append(("ckpt", a)))
    pool = tmp_path / "existing-pool.json"
    pool.write_text("{}")
    before = server.metrics().get("pacer:spec_decode_draft_length_count", 0)
    cases = [("ouroboros", "pool_file", str(tmp_path / "new" / "sub" / "pool.json")),
             ("pacer+ouroboros", "pool_file", str(pool)),
             ("ouroboros", "pool_file", None),
             ("sd", "pool_file", str(tmp_path / "other.json")),  # a method that does not even take it
             ("pacer", "path", str(tmp_path / "ckpt")),
             ("specdecpp", "path", str(tmp_path))]
    for method, key, value in cases:
        for url, body in (("/v1/completions", {"prompt": "hello"}),
                          ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello"}]})):
            for stream in (False, True):
                r = httpx.post(server.url + url, timeout=60, json={
                    **body, "max_tokens": 4, "temperature": 0, "stream": stream,
                    "pacer": {"method": method, key: value, "warm_start": False} if "ouroboros" in method else
                    {"method": method, key: value}})
                assert r.status_code == 400, (method, key, r.text)
                err = r.json()["error"]
                assert err["param"] == f"pacer.{key}" and f"'pacer.{key}'" in err["message"], err
    assert touched == []
    assert not (tmp_path / "new").exists() and not (tmp_path / "other.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing-pool.json"]
    assert pool.read_text() == "{}"
    assert server.metrics().get("pacer:spec_decode_draft_length_count", 0) == before  # never reached the model


def test_an_option_that_names_a_file_must_say_so():
    """A method whose option looks like a file or folder but is not declared ``path=True`` is refused at
    registration (a server would otherwise take it from a request)."""
    from pacer import PacerError
    from pacer.methods import Method, Option, register, unregister
    from pacer.methods.rules import fixed

    try:
        for name in ("log_file", "cache_dir", "out_folder", "weights_path"):
            with pytest.raises(PacerError, match="path=True"):
                register(Method("tmp-method", "x", fixed, options=(Option(name, str, "x"),)))
        register(Method("tmp-method", "x", fixed, options=(Option("cache_dir", str, "x", path=True),)))
    finally:
        unregister("tmp-method")


def test_speculative_config_takes_vllms_rejection_sample_method():
    """vLLM's ``rejection_sample_method`` (``standard`` / ``block``) is pacer's verification rule."""
    from pacer.errors import PacerError
    from pacer.serve.cli import speculative_config

    assert speculative_config('{"method": "sd", "rejection_sample_method": "block"}') == {"method": "sd",
                                                                                         "verify": "block"}
    assert speculative_config('{"rejection_sample_method": "standard"}') == {"verify": "token"}
    with pytest.raises(PacerError, match="rejection_sample_method must be one of standard, block, got 'synthetic'"):
        speculative_config('{"rejection_sample_method": "synthetic"}')

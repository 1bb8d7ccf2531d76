"""OpenAI request bodies -> :class:`Request`, and the response / chunk bodies.

Fields read (others are ignored, as OpenAI's own servers ignore what they do not know): ``model``, ``prompt``
(completions: a string, or a list holding one string or token ids) or ``messages`` (chat: ``role`` / ``content``
strings, the last from the user), ``max_tokens`` (``max_completion_tokens`` for chat too), ``temperature``
(OpenAI's default 1.0), ``top_p``, ``top_k``, ``seed`` (absent: a random one), ``stop`` (a string or a list),
``stream``, ``stream_options.include_usage``, ``n`` (1 only), ``min_p`` (0 only: another is refused, not ignored),
and the extension ``pacer``: ``{"method": ..., "gamma"/"min_draft"/"max_draft"/"cost_aware": ..., <the method's
registered options>}`` (a
:class:`~pacer.request.MethodRequest`) and ``"verify": "token"|"block"`` (the sampling verification rule,
:attr:`pacer.SamplingConfig.verify`), defaulting to the server's configuration; an option that names a file or
folder (:func:`pacer.methods.path_options`: ``pool_file``, the pre-verifier's ``path``) is refused: paths on the
server's disk come from its own configuration only. Every problem is a
:class:`BadRequest` (HTTP 400, OpenAI's error shape).
"""

from __future__ import annotations

import json
import random
import time
import uuid
from dataclasses import dataclass, field, replace

from ..errors import PacerError
from ..io import loads_json
from ..methods import DEFAULT_METHOD, DRAFT_VOCAB, path_options
from ..prompt import check_stop
from ..request import SETTINGS, GenerationRequest, MethodRequest
from ..sampling import SamplingConfig


class BadRequest(Exception):
    """A request the server refuses (``status``, OpenAI's error ``type``)."""

    def __init__(self, message: str, status: int = 400, kind: str = "invalid_request_error",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.param = status, kind, param

    def body(self) -> dict:
        return error_body(str(self), self.kind, self.param)


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


@dataclass
class Defaults:
    """The server's configuration: its method request (``--method``, ``--speculative-config``, option flags;
    a method's name is taken as its request with no settings), ``max_tokens`` and the verification rule
    (``--verify``)."""

    request: MethodRequest | str = DEFAULT_METHOD
    max_tokens: int = 256
    verify: str = "token"

    def __post_init__(self) -> None:
        self.request = MethodRequest.of(self.request)


@dataclass
class Request:
    chat: bool
    prompt: str | list[int]
    history: list[dict]
    max_tokens: int | None
    sampling: SamplingConfig
    stop: list[str]
    stream: bool
    include_usage: bool
    method: MethodRequest
    model: str
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))


def _number(body: dict, key: str, kind: type, default, lo=None, hi=None):
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not float(v).is_integer()):
        raise BadRequest(f"'{key}' must be a {'integer' if kind is int else 'number'}, got {v!r}", param=key)
    v = kind(v)
    if v != v or (lo is not None and v < lo) or (hi is not None and v > hi):
        raise BadRequest(f"'{key}' is out of range: {v!r}", param=key)
    return v


#: the largest request body the server reads (a prompt of a model's whole context is well under 1 MiB of text, or
#: of token ids)
MAX_BODY = 8 << 20


async def read_body(request) -> bytes:
    """The body of a Starlette ``request``, read up to :data:`MAX_BODY` bytes (a larger one is refused as soon as it
    is seen: by its ``Content-Length``, else while it streams in)."""
    too_large = BadRequest(f"the request body is larger than {MAX_BODY >> 20} MiB, the most the server reads; send "
                           f"a shorter prompt", status=413)
    size = request.headers.get("content-length", "")
    if size.isascii() and size.isdigit() and len(size) < 20 and int(size) > MAX_BODY:
        raise too_large
    from starlette.requests import ClientDisconnect

    parts, n = [], 0
    try:
        async for part in request.stream():
            n += len(part)
            if n > MAX_BODY:
                raise too_large
            parts.append(part)
    except ClientDisconnect:  # it declared more than it sent, or hung up mid-body: nobody to answer
        raise ClientGone(f"a client ({_peer(request)}) went away after {n} of "
                         f"{size or 'an undeclared number of'} body bytes; its request is dropped") from None
    return b"".join(parts)


class ClientGone(Exception):
    """A client that went away before its request body was read whole: logged in one line, answered with nothing."""


def _peer(request) -> str:
    client = getattr(request, "client", None)
    return f"{client.host}:{client.port}" if client else "unknown address"


def parse_body(raw: bytes) -> dict:
    """The request body: a JSON object of at most :data:`MAX_BODY` bytes, else :class:`BadRequest` (400) saying
    why (not UTF-8, not JSON, nested too deep, a number Python cannot read, too large)."""
    try:
        body = loads_json(raw, "the request body", "send a JSON object (OpenAI's request shape)",
                          max_bytes=MAX_BODY)
    except PacerError as e:
        raise BadRequest(str(e)) from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def _object(body: dict, key: str, shape: str) -> dict:
    """An optional object field: absent or null is ``{}``; anything else but an object is refused (never taken as
    the defaults)."""
    v = body.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise BadRequest(f"'{key}' must be an object: {shape}, got {json.dumps(v)[:40]}", param=key)
    return v


def parse_request(body: dict, chat: bool, defaults: Defaults, model: str) -> Request:
    """A checked :class:`Request` (the prompt's length is checked when it is tokenized)."""
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise BadRequest("'messages' must be a non-empty list", param="messages")
        for m in msgs:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise BadRequest("each message needs a string 'role' and a string 'content'", param="messages")
        if msgs[-1]["role"] != "user":
            raise BadRequest("the last message must be the user's", param="messages")
        prompt: str | list[int] = msgs[-1]["content"]
        history = [{"role": m["role"], "content": m["content"]} for m in msgs[:-1]]
    else:
        prompt, history = body.get("prompt"), []
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        ok = isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in prompt))
        if not ok:
            raise BadRequest("'prompt' must be a string or a list of token ids (one prompt per request)",
                             param="prompt")
    if isinstance(prompt, str) and not prompt.strip():
        raise BadRequest("the prompt is empty", param="messages" if chat else "prompt")
    if _number(body, "n", int, 1) != 1:
        raise BadRequest("'n' must be 1 (one completion per request)", param="n")
    key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _number(body, key, int, None, lo=1)
    seed = _number(body, "seed", int, None)
    if _number(body, "min_p", float, 0.0) != 0.0:  # vLLM's filter: not one pacer samples with, never ignored
        raise BadRequest("'min_p' is not supported (pacer samples with temperature, top_k and top_p); leave it out "
                         "or pass 0", param="min_p")
    try:
        sampling = SamplingConfig(_number(body, "temperature", float, 1.0), _number(body, "top_k", int, 0),
                                  _number(body, "top_p", float, 1.0),
                                  random.randrange(1 << 31) if seed is None else seed)
    except PacerError as e:
        raise BadRequest(str(e)) from None
    try:
        stop = check_stop(body.get("stop"))
    except PacerError:
        stop = None
    if stop is None or len(stop) > 4:
        raise BadRequest("'stop' must be a non-empty string or a list of up to 4 of them", param="stop")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be true or false", param="stream")
    include_usage = _object(body, "stream_options", '{"include_usage": true}').get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise BadRequest("'stream_options.include_usage' must be true or false", param="stream_options")
    ext = dict(_object(body, "pacer", '{"method": ..., options}'))
    try:  # the verification rule is the sampling's (the server's own unless the request chooses)
        # the server's rule applies where the request samples; one that names block at temperature 0 is refused
        sampling = replace(sampling, verify=ext.pop("verify", "token" if sampling.greedy else defaults.verify))
    except PacerError as e:
        raise BadRequest(f"pacer.{e}", param="pacer.verify") from None
    for name in path_options():  # files and folders on the server's disk are the server's: never a client's
        if name in ext:
            raise BadRequest(f"'pacer.{name}' names a file or folder on the server, which a request may not choose "
                             f"(the server's own configuration sets it); leave it out", param=f"pacer.{name}")
    if ext.get(DRAFT_VOCAB.name, "auto") not in ("auto", defaults.request.options.get(DRAFT_VOCAB.name, "auto")):
        # another vocabulary is a corpus count and a calibration in the single worker, each cached on disk
        raise BadRequest("'pacer.draft_vocab' is the server's (--draft-vocab at start): another one would count a "
                         "corpus and measure costs in the decoding worker and write them to its cache; leave it out "
                         "(or pass auto)",
                         param="pacer.draft_vocab")
    model_name = body.get("model")
    if model_name is not None and not isinstance(model_name, str):
        raise BadRequest("'model' must be a string", param="model")
    base = defaults.request
    method = ext.pop("method", base.method)
    if not isinstance(method, str):
        raise BadRequest("'pacer.method' must be a string", param="pacer.method")
    same = method == base.method  # the server's settings and options are for its own method
    settings = {k: ext.pop(k, getattr(base, k) if same else None) for k in SETTINGS}
    try:
        request = MethodRequest(method, **settings, options={**(base.options if same else {}), **ext})
        GenerationRequest(request, max_tokens or 1, sampling)  # refused here (400), before the request queues
    except PacerError as e:
        raise BadRequest(str(e), param="pacer") from None
    return Request(chat, prompt, history, max_tokens, sampling, stop, stream, include_usage, request,
                   model_name or model)


FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}


def _choice(req: Request, text: str | None, finish: str | None, delta: bool) -> dict:
    if req.chat:
        key = "delta" if delta else "message"
        content = {} if text is None else {"content": text}
        if not delta:
            content = {"role": "assistant", "content": text or ""}
        return {"index": 0, key: content, "finish_reason": finish, "logprobs": None}
    return {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def response(req: Request, text: str, finish: str, use: dict, pacer: dict) -> dict:
    return {"id": ("chatcmpl-" if req.chat else "cmpl-") + req.id,
            "object": "chat.completion" if req.chat else "text_completion", "created": req.created,
            "model": req.model, "choices": [_choice(req, text, finish, False)], "usage": use, "pacer": pacer}


def chunk(req: Request, text: str | None, finish: str | None = None, use: dict | None = None,
          pacer: dict | None = None, choices: bool = True) -> dict:
    body = {"id": ("chatcmpl-" if req.chat else "cmpl-") + req.id,
            "object": "chat.completion.chunk" if req.chat else "text_completion", "created": req.created,
            "model": req.model, "choices": [_choice(req, text, finish, True)] if choices else []}
    if use is not None:
        body["usage"] = use
    if pacer is not None:
        body["pacer"] = pacer
    return body

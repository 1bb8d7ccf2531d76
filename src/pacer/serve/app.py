"""The FastAPI application of ``pacer serve`` (see :mod:`pacer.serve`)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from ..api import Decoder
from ..errors import NonFiniteLogits, PacerError
from ..streaming import TextStreamer
from .metrics import Metrics, request_metrics
from .protocol import (
    FINISH,
    BadRequest,
    ClientGone,
    Defaults,
    chunk,
    error_body,
    parse_body,
    parse_request,
    read_body,
    response,
    usage,
)
from .worker import Cancelled, Job, Worker

#: the server's own log lines (a client that went away)
LOG = logging.getLogger("pacer.serve")


class _Sink:
    """Collects what a :class:`TextStreamer` writes."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> None:
        self.parts.append(text)

    def flush(self) -> None:
        pass

    def take(self) -> str:
        out, self.parts = "".join(self.parts), []
        return out


def _sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"


def _failure(e: BaseException) -> tuple[int, str, str]:
    """(HTTP status, metrics reason, error type) of a generation that ended in ``e``."""
    if isinstance(e, Cancelled):
        why = str(e) or "cancelled"
        return (504, "timeout", "timeout") if why == "timeout" else (503, why, "server_shutdown" if why ==
                                                                       "shutdown" else "cancelled")
    if isinstance(e, NonFiniteLogits):  # the server's model, not the request: its cause in one line, as a 500
        return 500, "error", "server_error"
    if isinstance(e, PacerError):
        return 400, "error", "invalid_request_error"
    return 500, "error", "server_error"


def build_app(decoder: Decoder, defaults: Defaults, model_name: str, queue_size: int = 8,
              request_timeout: float = 600.0, api_key: str | None = None) -> FastAPI:
    """The server over ``decoder`` (one decoding worker; at most ``queue_size`` requests wait behind the running
    one, more get 429; a request still unfinished ``request_timeout`` seconds after it arrived is ended at its next
    round, 504)."""
    if decoder.tokenizer is None:
        raise PacerError("pacer serve needs a pair with a tokenizer")
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.worker = Worker(decoder, metrics, queue_size)
        yield
        app.state.worker.stop()  # what waits is cancelled; a running generation ends at its next round

    app = FastAPI(title="pacer", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.metrics = metrics

    @app.middleware("http")
    async def check_key(request: Request, call_next):
        if api_key is not None and request.headers.get("authorization") != f"Bearer {api_key}":
            return JSONResponse(error_body("missing or wrong API key (Authorization: Bearer KEY)",
                                           "authentication_error"), status_code=401)
        return await call_next(request)

    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, e: BadRequest):
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, e: ClientGone):
        LOG.warning("pacer serve: %s", e)  # one line, no traceback: the server is fine
        return Response(status_code=400)  # (nobody reads it)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "pacer"}]}

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, chat=True)

    async def generate(request: Request, chat: bool):
        req = parse_request(parse_body(await read_body(request)), chat, defaults, model_name)
        try:
            ids = decoder.encode(req.prompt, chat, req.history)
        except PacerError as e:  # e.g. longer than the context, no chat template
            raise BadRequest(str(e), param="messages" if chat else "prompt") from None
        if req.max_tokens is None:
            req.max_tokens = defaults.max_tokens
        job = Job(req, ids, asyncio.get_running_loop(), asyncio.Queue(), time.monotonic() + request_timeout)
        if not request.app.state.worker.submit(job):
            metrics.failed("rejected")
            return JSONResponse(error_body(f"the server is busy ({queue_size} requests wait); retry shortly",
                                           "rate_limit_exceeded"), status_code=429, headers={"Retry-After": "1"})
        if req.stream:
            return StreamingResponse(stream(job, len(ids)), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        while True:
            try:
                kind, payload = await asyncio.wait_for(job.events.get(), 0.5)
            except TimeoutError:
                if await request.is_disconnected():
                    job.cancel("cancelled")
                continue
            if kind == "done":
                res = payload
                finish = FINISH.get(res.stats.finish_reason, "stop")
                metrics.finished(res.stats, finish)
                return JSONResponse(response(req, res.text, finish, usage(len(ids), len(res.token_ids)),
                                             request_metrics(res.stats)))
            if kind == "error":
                status, reason, kind_ = _failure(payload)
                metrics.failed(reason)
                return JSONResponse(error_body(f"generation ended: {payload}", kind_), status_code=status)

    async def stream(job: Job, prompt_tokens: int):
        req, sink = job.req, _Sink()
        streamer = TextStreamer(decoder.tokenizer, req.stop, stream=sink)
        ended = False
        try:
            if req.chat:
                first = chunk(req, None)
                first["choices"][0]["delta"] = {"role": "assistant", "content": ""}
                yield _sse(first)
            while True:
                kind, payload = await job.events.get()
                if kind == "tokens":
                    streamer(payload)
                    if text := sink.take():
                        yield _sse(chunk(req, text))
                elif kind == "done":
                    res = payload
                    streamer.finish(res.text)
                    if text := sink.take():
                        yield _sse(chunk(req, text))
                    finish = FINISH.get(res.stats.finish_reason, "stop")
                    metrics.finished(res.stats, finish)
                    ended = True
                    use = usage(prompt_tokens, len(res.token_ids))
                    yield _sse(chunk(req, None, finish, pacer=request_metrics(res.stats)))
                    if req.include_usage:
                        yield _sse(chunk(req, None, use=use, choices=False))
                    yield _sse("[DONE]")
                    return
                else:
                    status, reason, kind_ = _failure(payload)
                    metrics.failed(reason)
                    ended = True
                    yield _sse(error_body(f"generation ended: {payload}", kind_))
                    yield _sse("[DONE]")
                    return
        finally:
            if not ended:  # the client went away (or the server is stopping): end the generation at its next round
                job.cancel("cancelled")
                metrics.failed("cancelled")

    return app

"""``pacer serve``: load a pair once and serve it over HTTP (OpenAI-compatible; see :mod:`pacer.serve`)."""

from __future__ import annotations

import argparse
import socket
import sys

from ..args import (
    add_method_args,
    add_model_args,
    add_verify_arg,
    as_flags,
    auto_method,
    check_model_args,
    cost_aware,
    load_decoder,
    method_options,
)
from ..bounds import MAX_NEW_TOKENS, MAX_PORT, MAX_QUEUE, Count
from ..errors import PacerError
from ..io import loads_json


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "serve", help="serve the pair over HTTP: OpenAI-compatible completions and chat, streaming, /metrics",
        description="An OpenAI-compatible server over one loaded pair (one decoding worker, a bounded queue). "
                    "A request may choose its method: {\"pacer\": {\"method\": \"sd\", \"max_draft\": 8}}.")
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    g.add_argument("--port", type=Count("--port", 0, MAX_PORT, "the largest TCP port; 0: any free port"), default=8000)
    g.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on every request")
    g.add_argument("--served-model-name", default=None, help="the model id clients use (default: --target)")
    g.add_argument("--queue-size", type=Count("--queue-size", 0, MAX_QUEUE), default=8,
                   help="requests that may wait behind the running one; "
                   "more get 429 with Retry-After")
    g.add_argument("--request-timeout", type=float, default=600.0,
                   help="seconds after which an unfinished request is ended at its next round (504)")
    g.add_argument("--max-tokens", type=Count("--max-tokens", 1, MAX_NEW_TOKENS), default=256,
                   help="max_tokens of a request that gives none")
    g.add_argument("--speculative-config", default=None, metavar="JSON",
                   help='vLLM-style: \'{"method": "pacer", "num_speculative_tokens": 16}\' (the method and its '
                        "upper bound on draft tokens per round; other keys are the method's options; vLLM's "
                        "rejection_sample_method standard|block sets --verify token|block)")
    add_verify_arg(g, "token; a request's {\"pacer\": {\"verify\": \"block\"}} chooses its own")
    add_method_args(p)
    add_model_args(p)
    p.set_defaults(func=cmd_serve)


def speculative_config(text: str | None) -> dict:
    """``--speculative-config`` as ``{"method": ..., "max_draft": ..., <options>}``."""
    if text is None:
        return {}
    cfg = loads_json(text, "--speculative-config", "pass a JSON object, e.g. '{\"method\": \"pacer\", "
                     "\"num_speculative_tokens\": 16}'", max_bytes=1 << 20)
    if not isinstance(cfg, dict):
        raise PacerError("--speculative-config must be a JSON object, e.g. '{\"method\": \"pacer\", "
                         "\"num_speculative_tokens\": 16}'")
    cfg = dict(cfg)
    if "num_speculative_tokens" in cfg:
        cfg["max_draft"] = cfg.pop("num_speculative_tokens")
    if "rejection_sample_method" in cfg:
        rule = cfg.pop("rejection_sample_method")
        if not isinstance(rule, str) or rule not in REJECTION_SAMPLE_METHODS:  # a JSON list is unhashable
            raise PacerError(f"--speculative-config: rejection_sample_method must be one of "
                             f"{', '.join(REJECTION_SAMPLE_METHODS)}, got {rule!r}")
        cfg["verify"] = REJECTION_SAMPLE_METHODS[rule]
    return cfg


#: vLLM's ``rejection_sample_method`` -> pacer's verification rule (``--verify``)
REJECTION_SAMPLE_METHODS = {"standard": "token", "block": "block"}


def listen_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (what uvicorn would bind, done before any model loads): a port outside
    0-65535, an address that is not this machine's or a port in use is a one-line error."""
    if not 0 <= port <= 65535:
        raise PacerError(f"--port must be between 0 and 65535 (0: any free port), got {port}")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except (OSError, OverflowError) as e:
        sock.close()
        reason = getattr(e, "strerror", None) or str(e)
        raise PacerError(f"cannot listen on --host {host} --port {port} ({reason}); pass an address of this machine "
                         f"(127.0.0.1, 0.0.0.0) and a free port") from None
    return sock


def cmd_serve(args: argparse.Namespace) -> int:
    from ..request import GenerationRequest, MethodRequest
    from ..sampling import SamplingConfig
    from .protocol import Defaults

    cfg = speculative_config(args.speculative_config)
    for name, lo, v in (("--queue-size", 0, args.queue_size), ("--max-tokens", 1, args.max_tokens)):
        if v < lo:
            raise PacerError(f"{name} must be >= {lo}, got {v}")
    if not args.request_timeout > 0:
        raise PacerError(f"--request-timeout must be > 0, got {args.request_timeout}")
    check_model_args(args)
    args.method = cfg.pop("method", None) or args.method
    args.method = auto_method(args, cfg)
    settings = {k: cfg.pop(k, getattr(args, k)) for k in ("gamma", "min_draft", "max_draft")}
    if (given := cfg.pop("verify", None)) is not None and args.verify not in (None, given):
        raise PacerError(f"--verify {args.verify} and --speculative-config's rejection_sample_method (verify "
                         f"{given}) disagree; give one")
    verify = args.verify or given or "token"
    try:
        request = MethodRequest(args.method, **settings, cost_aware=cfg.pop("cost_aware", cost_aware(args)),
                                options={**method_options(args), **cfg})
        # checked before loading; the server's rule is for sampled requests (OpenAI's default temperature, 1.0)
        GenerationRequest(request, args.max_tokens, SamplingConfig(1.0, verify=verify))
        request.check_files()
    except PacerError as e:
        raise PacerError(as_flags(str(e))) from None
    import uvicorn

    from .app import build_app

    sock = listen_socket(args.host, args.port)  # before the models load: a taken port is said at once
    dec = load_decoder(args, request)
    defaults = Defaults(request, args.max_tokens, verify)
    name = args.served_model_name or args.target
    app = build_app(dec, defaults, name, args.queue_size, args.request_timeout, args.api_key)
    port = sock.getsockname()[1]
    print(f"pacer serve: {name} ({request.method}) on http://{args.host}:{port}/v1", file=sys.stderr)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=port, log_level="warning",
                                           timeout_graceful_shutdown=30))
    server.run(sockets=[sock])
    return 0 if server.started else 1

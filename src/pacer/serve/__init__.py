"""``pacer serve``: an OpenAI-compatible HTTP server over one loaded pair, with speculative-decoding metrics.

* :mod:`.protocol` - OpenAI request bodies checked and turned into a :class:`~.protocol.Request` (every bad
  request is a 400 in OpenAI's error shape, before it reaches the model); response and chunk bodies.
* :mod:`.worker`   - one decoding worker thread per loaded pair behind a bounded queue; cancellation at the next
  round (a client that went away, a timeout, shutdown).
* :mod:`.metrics`  - Prometheus text with vLLM's speculative-decoding counter names (``pacer:`` prefix).
* :mod:`.app`      - the FastAPI application: ``/v1/completions``, ``/v1/chat/completions`` (both streaming as
  server-sent events or not), ``/v1/models``, ``/health``, ``/metrics``.
* :mod:`.cli`      - the ``pacer serve`` subcommand (uvicorn).
"""

"""One decoding worker per loaded pair: a thread that runs one generation at a time from a bounded queue.

A :class:`Job` carries its tokenized prompt and settings; the worker calls :meth:`pacer.Decoder.generate` with
an ``on_tokens`` hook that (1) stops the generation at the next round once the job is cancelled - a client that
went away, its timeout, a shutdown - by raising :class:`Cancelled` out of the loop, and (2) hands the committed
tokens to the request's event loop. Events a job's handler reads: ``("tokens", ids)``, then ``("done", result)``
or ``("error", exception)``.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field

from ..api import Decoder
from .metrics import Metrics
from .protocol import Request


class Cancelled(Exception):
    """Raised inside a generation to end it at the next round."""


@dataclass
class Job:
    req: Request
    ids: list[int]
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    deadline: float
    cancelled: threading.Event = field(default_factory=threading.Event)
    why: str = ""

    def cancel(self, why: str) -> None:
        if not self.cancelled.is_set():
            self.why = why
            self.cancelled.set()

    def emit(self, kind: str, payload) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))


class Worker:
    """Runs jobs one at a time; at most ``queue_size`` wait behind the running one (:meth:`submit` says no
    beyond that: the handler answers 429)."""

    def __init__(self, decoder: Decoder, metrics: Metrics, queue_size: int = 8) -> None:
        self.decoder, self.metrics, self.queue_size = decoder, metrics, queue_size
        self._q: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._admitted: set[int] = set()
        self.running: Job | None = None
        self._thread = threading.Thread(target=self._run, name="pacer-decoder", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> bool:
        with self._lock:
            if len(self._admitted) >= self.queue_size + 1:
                return False
            self._admitted.add(id(job))
            self.metrics.waiting += 1
        self._q.put(job)
        return True

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel what waits, let the running generation end at its next round, end the thread."""
        with self._lock:
            if self.running is not None:
                self.running.cancel("shutdown")
        self._q.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                self._drain()
                return
            with self._lock:
                self.metrics.waiting -= 1
                self.running = job
                self.metrics.running = 1
            try:
                self._one(job)
            finally:
                with self._lock:
                    self.running = None
                    self.metrics.running = 0
                    self._admitted.discard(id(job))

    def _drain(self) -> None:
        while True:
            try:
                job = self._q.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                with self._lock:
                    self.metrics.waiting -= 1
                    self._admitted.discard(id(job))
                job.cancel("shutdown")
                job.emit("error", Cancelled("shutdown"))

    def _one(self, job: Job) -> None:
        if time.monotonic() > job.deadline:
            job.cancel("timeout")
        if job.cancelled.is_set():
            job.emit("error", Cancelled(job.why))
            return
        r = job.req

        def on_tokens(ids: list[int]) -> None:
            if time.monotonic() > job.deadline:
                job.cancel("timeout")
            if job.cancelled.is_set():
                raise Cancelled(job.why)
            self.metrics.generated(len(ids))
            job.emit("tokens", list(ids))

        try:
            res = self.decoder.generate(job.ids, r.method, r.max_tokens, r.sampling, stop=r.stop,
                                        on_tokens=on_tokens)
        except Exception as e:  # noqa: BLE001 - a failed generation is this request's error, never the worker's
            job.emit("error", e)
            return
        job.emit("done", res)

"""Benchmark and test fixture: a loopback fake of an OpenAI-compatible server with unlimited batch.

It is not a server for real work. Every `/v1/chat/completions` is answered after `delay` seconds
(however many are in flight: an ideal server that never queues) with `max_tokens` words and usage
counts, so a client that keeps C requests in flight gets C / delay answers per second, and any
shortfall is the client's. It counts what the real server's log showed, requests in flight
(`GET /stats`: time-weighted mean, median of 0.1 s samples, peak; `POST /stats/reset`).
`/v1/models` and `/health` answer the client's preflight.

Stdlib only, asyncio streams, HTTP/1.1 keep-alive; it runs in a thread
(`with FakeOpenAI(delay=0.5) as srv:`) or as its own process, whose CPU then is not the measured
client's (`with FakeOpenAIProcess(delay=2) as srv:`, or by hand:
`python tests/helpers_regen/fake_openai.py --delay 2 [--port 0]`, which prints "port N").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import threading
import time


class FakeOpenAI:
    def __init__(
        self,
        delay: float = 1.0,
        jitter: float = 0.0,
        host: str = "127.0.0.1",
        port: int = 0,
        sample_every: float = 0.1,
        seed: int = 0,
    ):
        self.delay, self.jitter, self.host, self.port = delay, jitter, host, port
        self.sample_every = sample_every
        self.rng = random.Random(seed)
        self._bodies: dict[int, bytes] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.reset()

    # ---------------------------------------------------------------- counts

    def reset(self) -> None:
        self.requests = self.answered = self.in_flight = self.peak = self.connections = 0
        self.area, self.t_change = 0.0, None
        self.t_first = self.t_last = None  # wall clock (time.time): comparable across processes
        self.samples: list[int] = []

    def _change(self, by: int) -> None:
        now = time.monotonic()
        if self.t_change is not None:
            self.area += self.in_flight * (now - self.t_change)
        self.t_change = now
        self.in_flight += by
        self.peak = max(self.peak, self.in_flight)

    def stats(self) -> dict:
        """Requests in flight between the first request and the last answer (what a server sees)."""
        busy = (self.t_last - self.t_first) if self.t_first and self.t_last else 0.0
        return {
            "requests": self.requests,
            "answered": self.answered,
            "in_flight": self.in_flight,
            "peak_in_flight": self.peak,
            "connections": self.connections,
            "mean_in_flight": round(self.area / busy, 1) if busy > 0 else 0.0,
            "median_in_flight": statistics.median(self.samples) if self.samples else 0,
            "t_first": self.t_first,
            "t_last": self.t_last,
            "busy_s": round(busy, 3),
            "answers_per_s": round(self.answered / busy, 1) if busy > 0 else 0.0,
            "delay_s": self.delay,
        }

    async def _sampler(self) -> None:
        while True:
            await asyncio.sleep(self.sample_every)
            if self.in_flight or (self.t_first and not self.t_last):
                self.samples.append(self.in_flight)

    # ---------------------------------------------------------------- HTTP

    def _completion(self, max_tokens: int) -> bytes:
        if max_tokens not in self._bodies:
            words = " ".join(f"w{i % 100}" for i in range(max_tokens))
            self._bodies[max_tokens] = json.dumps(
                {
                    "id": "fake",
                    "object": "chat.completion",
                    "created": 0,
                    "model": "fake",
                    "choices": [
                        {"index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": words}}
                    ],
                    "usage": {"prompt_tokens": 32, "completion_tokens": max_tokens, "total_tokens": 32 + max_tokens},
                }
            ).encode()
        return self._bodies[max_tokens]

    @staticmethod
    def _response(status: int, body: bytes) -> bytes:
        return (
            f"HTTP/1.1 {status} {'OK' if status == 200 else 'Not Found'}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        ).encode() + body

    async def _chat(self, body: bytes) -> bytes:
        self.requests += 1
        if self.t_first is None:
            self.t_first = time.time()
        self._change(+1)
        try:
            max_tokens = int(json.loads(body).get("max_tokens") or 16)
            delay = self.delay * (1 + self.jitter * (2 * self.rng.random() - 1))
            await asyncio.sleep(delay)
        finally:
            self._change(-1)
        self.answered += 1
        self.t_last = time.time()
        return self._response(200, self._completion(max_tokens))

    async def _route(self, method: str, path: str, body: bytes) -> bytes:
        if method == "POST" and path == "/v1/chat/completions":
            return await self._chat(body)
        if method == "GET" and path == "/v1/models":
            return self._response(200, b'{"object": "list", "data": [{"id": "fake", "object": "model"}]}')
        if method == "GET" and path == "/health":
            return self._response(200, b"{}")
        if method == "GET" and path == "/stats":
            return self._response(200, json.dumps(self.stats()).encode())
        if method == "POST" and path == "/stats/reset":
            self.reset()
            return self._response(200, b"{}")
        return self._response(404, b'{"error": "not found"}')

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                length = 0
                for line in lines[1:]:
                    if line[:15].lower() == "content-length:":
                        length = int(line[15:])
                body = await reader.readexactly(length) if length else b""
                writer.write(await self._route(method, path, body))
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.connections -= 1
            writer.close()

    # ---------------------------------------------------------------- running

    async def serve(self, ready=None) -> None:
        server = await asyncio.start_server(self._handle, self.host, self.port, backlog=4096)
        self.port = server.sockets[0].getsockname()[1]
        sampler = asyncio.ensure_future(self._sampler())
        if ready is not None:
            ready()
        try:
            async with server:
                await server.serve_forever()
        finally:
            sampler.cancel()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "FakeOpenAI":
        """Serve from a thread of this process (tests)."""
        started = threading.Event()

        def run():
            self._loop = asyncio.new_event_loop()
            self._task = self._loop.create_task(self.serve(started.set))
            try:
                self._loop.run_until_complete(self._task)
            except asyncio.CancelledError:
                pass
            finally:
                self._loop.close()

        self._thread = threading.Thread(target=run, name="fake-openai", daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError("fake OpenAI server did not start in 10 s")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> "FakeOpenAI":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class FakeOpenAIProcess:
    """The fake server as a child process, so its CPU is not the measured client's."""

    def __init__(self, delay: float = 1.0, jitter: float = 0.0):
        import subprocess
        import sys

        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--delay", str(delay), "--jitter", str(jitter)],
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        if not line.startswith("port "):
            self.proc.kill()
            raise RuntimeError(f"fake OpenAI server did not start (said {line!r})")
        self.base_url = f"http://127.0.0.1:{int(line.split()[1])}"

    def _call(self, path: str, method: str = "GET") -> dict:
        import urllib.request

        req = urllib.request.Request(self.base_url + path, method=method, data=b"" if method == "POST" else None)
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def stats(self) -> dict:
        return self._call("/stats")

    def reset(self) -> None:
        self._call("/stats/reset", "POST")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)

    def __enter__(self) -> "FakeOpenAIProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--delay", type=float, default=2.0, help="seconds before each answer")
    p.add_argument("--jitter", type=float, default=0.0, help="delay x (1 +- jitter), uniform")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    srv = FakeOpenAI(delay=args.delay, jitter=args.jitter, host=args.host, port=args.port)
    asyncio.run(srv.serve(lambda: print(f"port {srv.port}", flush=True)))


if __name__ == "__main__":
    main()

"""A fault-injecting HTTP/1.1 proxy for the regeneration tests.

It sits in front of a real server and, per request, picks (seeded) one of: pass, drop (close the
connection without an answer), http500, http429 (with Retry-After), timeout (hold the connection
silent), truncated (the upstream answer cut short of its Content-Length), malformed (a 200 whose
body is not the JSON a client expects). Requests whose body contains `poison` always get a 500,
so those rows can never succeed and must end in the errors file.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections import Counter

import httpx

FAULTS = ("drop", "http500", "http429", "timeout", "truncated", "malformed")


class FaultProxy:
    def __init__(
        self, upstream: str, rates: dict[str, float], *, seed: int = 0, poison: str = "POISON", hang_s: float = 30.0
    ):
        unknown = set(rates) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown faults {unknown}")
        self.upstream = upstream.rstrip("/")
        self.rates = rates
        self.rng = random.Random(seed)
        self.poison = poison.encode()
        self.hang_s = hang_s
        self.injected: Counter = Counter()
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _pick(self, body: bytes) -> str:
        if self.poison in body:
            return "poison"
        x, acc = self.rng.random(), 0.0
        for fault, rate in self.rates.items():
            acc += rate
            if x < acc:
                return fault
        return "pass"

    async def _forward(self, method: str, path: str, body: bytes) -> tuple[int, bytes]:
        r = await self.http.request(
            method, self.upstream + path, content=body, headers={"content-type": "application/json"}
        )
        return r.status_code, r.content

    @staticmethod
    def _response(
        status: int, body: bytes, *, length: int | None = None, extra: str = "", close: bool = False
    ) -> bytes:
        reason = {200: "OK", 429: "Too Many Requests", 500: "Internal Server Error"}.get(status, "X")
        head = (
            f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body) if length is None else length}\r\n{extra}"
            f"connection: {'close' if close else 'keep-alive'}\r\n\r\n"
        )
        return head.encode() + body

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:] if ":" in l)}
                body = await reader.readexactly(int(headers.get("content-length", 0)))
                fault = self._pick(body) if method == "POST" else "pass"
                self.injected[fault] += 1
                if fault == "drop":
                    return
                if fault == "timeout":
                    await asyncio.sleep(self.hang_s)
                    return
                if fault in ("http500", "poison"):
                    writer.write(self._response(500, b'{"error": "injected 500"}'))
                elif fault == "http429":
                    writer.write(self._response(429, b'{"error": "slow down"}', extra="retry-after: 0.1\r\n"))
                else:
                    status, data = await self._forward(method, path, body)
                    if fault == "truncated":
                        writer.write(self._response(status, data[: len(data) // 2], length=len(data), close=True))
                        await writer.drain()
                        return
                    if fault == "malformed":
                        bad = (
                            data[: len(data) // 2]
                            if self.rng.random() < 0.5
                            else json.dumps({"object": "chat.completion"}).encode()
                        )
                        writer.write(self._response(200, bad))
                    else:
                        writer.write(self._response(status, data))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    def start(self) -> "FaultProxy":
        ready = threading.Event()

        def run():
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            self.http = httpx.AsyncClient(timeout=120)
            server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
            self.port = server.sockets[0].getsockname()[1]
            self._server = server
            ready.set()
            self._loop.run_forever()
            server.close()
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
            self._loop.run_until_complete(asyncio.sleep(0.05))
            self._loop.run_until_complete(self.http.aclose())
            self._loop.close()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

"""Loopback stubs of an OpenAI-compatible server that is alive but wrong, for the fault tests.

Each `StubServer(mode)` listens on 127.0.0.1 (a real socket, in a thread of the test process):
  ok         answers every chat completion with `answer` (may be "": an empty answer)
  drop       accepts, reads the request, closes the connection without a byte back
  hang       answers GET /v1/models, but never answers a chat completion
  500        answers every chat completion with HTTP 500
  malformed  answers every chat completion with HTTP 200 and a body that is not JSON
It records the request paths it saw (`paths`), so a test can check what the client asked for.
"""

from __future__ import annotations

import asyncio
import json
import threading

MODES = ("ok", "drop", "hang", "500", "malformed")


def _response(status: int, body: bytes) -> bytes:
    reason = {200: "OK", 404: "Not Found", 500: "Internal Server Error"}.get(status, "Status")
    head = f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    return head.encode() + body


def completion(answer: str, finish_reason: str = "stop", tokens: int | None = None) -> bytes:
    n = len(answer.split()) if tokens is None else tokens
    return json.dumps(
        {
            "choices": [
                {"index": 0, "finish_reason": finish_reason, "message": {"role": "assistant", "content": answer}}
            ],
            "usage": {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n},
        }
    ).encode()


class StubServer:
    def __init__(self, mode: str = "ok", answer: str = "a short answer", finish_reason: str = "stop"):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        self.mode, self.answer, self.finish_reason = mode, answer, finish_reason
        self.port = 0
        self.paths: list[str] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _chat(self, writer: asyncio.StreamWriter) -> bool:
        """Answer (or not) one chat completion; False: the connection is to be closed."""
        if self.mode == "drop":
            return False
        if self.mode == "hang":
            await asyncio.sleep(3600)
        if self.mode == "500":
            writer.write(_response(500, b'{"error": "internal error"}'))
        elif self.mode == "malformed":
            writer.write(_response(200, b'{"choices": [ not json'))
        else:
            writer.write(_response(200, completion(self.answer, self.finish_reason)))
        return True

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                length = next((int(x[15:]) for x in lines[1:] if x[:15].lower() == "content-length:"), 0)
                if length:
                    await reader.readexactly(length)
                self.paths.append(path)
                if method == "POST" and path == "/v1/chat/completions":
                    if not await self._chat(writer):
                        return
                elif self.mode == "drop":
                    return
                elif path == "/v1/models":
                    writer.write(_response(200, b'{"object": "list", "data": [{"id": "stub"}]}'))
                else:
                    writer.write(_response(404, b'{"error": "not found"}'))
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()

        async def main():
            server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            self._ready.set()
            async with server:
                await server.serve_forever()

        try:
            self._loop.run_until_complete(main())
        except asyncio.CancelledError:
            pass
        # let the cancelled connection handlers (a hanging answer) run their clean-up before the loop goes
        self._loop.run_until_complete(asyncio.sleep(0.2))
        self._loop.close()

    def start(self) -> "StubServer":
        threading.Thread(target=self._run, name=f"stub-{self.mode}", daemon=True).start()
        if not self._ready.wait(10):
            raise RuntimeError("stub server did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None:
            for task in asyncio.all_tasks(self._loop):
                self._loop.call_soon_threadsafe(task.cancel)

    def __enter__(self) -> "StubServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

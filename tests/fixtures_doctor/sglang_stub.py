"""A loopback HTTP stub answering in SGLang's documented shapes, for testing the doctor probe.

It is a test fixture, not a model: it replays fixed numbers (`tokens` completion tokens and
`verify` verify steps per request) so the probe's arithmetic and cause ranking can be checked
exactly. Shapes follow SGLang 0.5.x: `/server_info` carries the server args as top-level keys
plus `internal_states[0].avg_spec_accept_length`; `/generate` returns `meta_info`; the OpenAI
endpoint puts `meta_info` in each choice when the request has `return_meta_info: true`.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class SGLangStub:
    """Start with `with SGLangStub(...) as url:`; records the request bodies it saw in `.requests`."""

    def __init__(
        self,
        algorithm: str | None = "EAGLE3",
        tokens: int = 40,
        verify: int | None = 16,
        server_info_path: str = "/server_info",
        draft_path: str = "/models/draft",
        num_steps: int = 3,
        topk: int = 1,
        num_draft_tokens: int = 4,
        openai_meta: bool = True,
        has_generate: bool = True,
    ):
        self.algorithm, self.tokens, self.verify = algorithm, tokens, verify
        self.server_info_path, self.draft_path = server_info_path, draft_path
        self.num_steps, self.topk, self.num_draft_tokens = num_steps, topk, num_draft_tokens
        self.openai_meta, self.has_generate = openai_meta, has_generate
        self.requests = []
        self._server = None

    def server_info(self) -> dict:
        info = {
            "model_path": "/models/target",
            "served_model_name": "/models/target",
            "context_length": 2048,
            "max_running_requests": 48 if self.algorithm else None,
            "version": "0.5.4",
            "speculative_algorithm": self.algorithm,
            "speculative_draft_model_path": self.draft_path if self.algorithm else None,
            "speculative_num_steps": self.num_steps if self.algorithm else None,
            "speculative_eagle_topk": self.topk if self.algorithm else None,
            "speculative_num_draft_tokens": self.num_draft_tokens if self.algorithm else None,
            "internal_states": [{"last_gen_throughput": 12.5}],
        }
        if self.algorithm and self.verify:
            info["internal_states"][0]["avg_spec_accept_length"] = self.tokens / self.verify
        return info

    def meta(self) -> dict:
        meta = {
            "id": "stub",
            "finish_reason": {"type": "length", "length": self.tokens},
            "prompt_tokens": 12,
            "completion_tokens": self.tokens,
            "cached_tokens": 0,
            "e2e_latency": 0.1,
        }
        if self.algorithm and self.verify is not None:
            meta.update(spec_verify_ct=self.verify, spec_accept_length=self.tokens / self.verify)
        return meta

    def _handler(self):
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def _send(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == stub.server_info_path:
                    return self._send(200, stub.server_info())
                if self.path == "/v1/models":
                    return self._send(200, {"object": "list", "data": [{"id": "/models/target", "object": "model"}]})
                return self._send(404, {"detail": "Not Found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                stub.requests.append((self.path, body))
                if self.path == "/v1/chat/completions":
                    choice = {
                        "index": 0,
                        "message": {"role": "assistant", "content": "x " * stub.tokens},
                        "finish_reason": "length",
                    }
                    if stub.openai_meta and body.get("return_meta_info"):
                        choice["meta_info"] = stub.meta()
                    return self._send(
                        200,
                        {
                            "id": "stub",
                            "object": "chat.completion",
                            "model": body.get("model"),
                            "choices": [choice],
                            "usage": {
                                "prompt_tokens": 12,
                                "completion_tokens": stub.tokens,
                                "total_tokens": 12 + stub.tokens,
                            },
                        },
                    )
                if self.path == "/generate" and stub.has_generate:
                    return self._send(200, {"text": "x " * stub.tokens, "meta_info": stub.meta()})
                return self._send(404, {"detail": "Not Found"})

        return Handler

    def __enter__(self) -> str:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()

"""A real HTTP server process for the process-management tests: `python health_server.py PORT
[--ready-after S] [--spawn-child | --stubborn-child] [--accept A] [--fail-generate]`. It answers GET /health with 200
once S seconds have passed (503 before), and with --spawn-child it starts a sleeping grandchild (as SGLang's launcher
starts its scheduler) whose pid it prints, so tests can check that the whole group goes (--stubborn-child: one that
ignores SIGTERM, so only the group's SIGKILL ends it, after this process has exited). It also
answers POST /flush_cache and POST /generate in SGLang's shapes (output ids = the input ids + 1, at
most max_new_tokens; with --accept A, spec_verify_ct = ceil(tokens / A)) so a measurement loop can
run against a real process (with --fail-generate every /generate answers 500, as a server whose
scheduler died behind a live HTTP front). It is a fixture for draftlab's own loop, not a model."""

import json
import math
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port = int(sys.argv[1])
ready_after = float(sys.argv[sys.argv.index("--ready-after") + 1]) if "--ready-after" in sys.argv else 0.0
accept = float(sys.argv[sys.argv.index("--accept") + 1]) if "--accept" in sys.argv else None
fail_generate = "--fail-generate" in sys.argv
t0 = time.monotonic()
if "--spawn-child" in sys.argv or "--stubborn-child" in sys.argv:
    ignore = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " if "--stubborn-child" in sys.argv else ""
    child = subprocess.Popen([sys.executable, "-c", ignore + "import time; time.sleep(600)"])
    print(f"grandchild {child.pid}", flush=True)


class Handler(BaseHTTPRequestHandler):
    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        ok = self.path == "/health" and time.monotonic() - t0 >= ready_after
        self._send(200 if ok else 503, b"ok" if ok else b"starting")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path == "/flush_cache":
            return self._send(200, b"Cache flushed.")
        if self.path != "/generate":
            return self._send(404, b"no such path")
        if fail_generate:
            return self._send(500, b"scheduler died")
        ids = [t + 1 for t in body["input_ids"]][: body["sampling_params"]["max_new_tokens"]]
        meta = {"completion_tokens": len(ids), "prompt_tokens": len(body["input_ids"])}
        if accept:
            meta["spec_verify_ct"] = math.ceil(len(ids) / accept)
        self._send(200, json.dumps({"text": "x", "output_ids": ids, "meta_info": meta}).encode())

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()

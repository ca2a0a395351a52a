"""A real HTTP server process for the process-management tests: `python health_server.py PORT
[--ready-after S] [--spawn-child]`. It answers GET /health with 200 once S seconds have passed (503
before), and with --spawn-child it starts a sleeping grandchild (as SGLang's launcher starts its
scheduler) whose pid it prints, so tests can check that the whole group goes."""

import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port = int(sys.argv[1])
ready_after = float(sys.argv[sys.argv.index("--ready-after") + 1]) if "--ready-after" in sys.argv else 0.0
t0 = time.monotonic()
if "--spawn-child" in sys.argv:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(f"grandchild {child.pid}", flush=True)


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.path == "/health" and time.monotonic() - t0 >= ready_after
        self.send_response(200 if ok else 503)
        self.end_headers()
        self.wfile.write(b"ok" if ok else b"starting")

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()

"""A webhook receiver run as its own process (``python endpoint.py PORT LOG``): answers
200 to every POST after appending its ``Idempotency-Key`` to LOG (an O_APPEND write:
a SIGKILL after it keeps the line). Killed and restarted by the acceptance tests."""

import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a real receiver

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        os.write(LOG, (self.headers["Idempotency-Key"] + "\n").encode())
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class Server(ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = 128


if __name__ == "__main__":
    port, path = int(sys.argv[1]), sys.argv[2]
    LOG = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    server = Server(("127.0.0.1", port), Handler)
    print("listening", flush=True)
    server.serve_forever()

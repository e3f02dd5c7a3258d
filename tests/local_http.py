"""A real HTTP server in a thread for the comparator's API tests (``http.server``, loopback only)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Server:
    """Answers each POST with the next scripted reply ``(status, body, headers, delay_s)``, or with
    ``handler(request) -> reply`` when given; records every request (path, headers, JSON body)."""

    def __init__(self, replies=(), handler=None):
        self.replies, self.handler, self.requests = list(replies), handler, []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                request = {"path": self.path, "headers": dict(self.headers), "body": body}
                server.requests.append(request)
                reply = server.handler(request) if server.handler else server.replies.pop(0)
                status, payload, headers, delay = (*reply, *({}, 0.0)[len(reply) - 2 :])
                time.sleep(delay)
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                    pass

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1/chat/completions"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def serving():
    """A generator for a fixture: yields ``make(replies=(), handler=None) -> Server`` and shuts every
    server down afterwards (``server_factory = pytest.fixture(local_http.serving)``)."""
    servers = []

    def make(replies=(), handler=None):
        servers.append(Server(replies, handler))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def chat_reply(texts):
    """An OpenAI chat-completions reply holding ``texts``."""
    return 200, {
        "choices": [{"index": i, "message": {"role": "assistant", "content": t}} for i, t in enumerate(texts)]
    }

"""A fake OpenAI server that streams several tokens per SSE event, as vLLM or SGLang do under speculation.

    python tests/e2e/multitoken_server.py [--port 0] [--tokens-per-event K] [--text-only] [--no-usage]
                                          [--decode-ms X] [--round-ms Y] [--serialize]

A speculative request (the default; `"speculative": false` opts out) gets K tokens per
event every --round-ms; a classic one 1 token every --decode-ms. --text-only drops
`token_ids` from the events (only the final usage chunk says how many tokens came),
--no-usage also ignores stream_options.include_usage. /health reports no costs, so
clients must calibrate alone first. --serialize serves one request at a time (as
mlx_lm.server does with a draft model). Token i's text is 1-3 characters, so text
length is not a token count. Stdlib only; the first stderr line says where it listens.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from http.server import ThreadingHTTPServer

from json_http import JsonHandler

MODEL = "fake-multitoken"


def token_text(i: int) -> str:
    return "abc"[: 1 + i % 3]


class Handler(JsonHandler):
    options: argparse.Namespace
    lock = threading.Lock()

    def do_GET(self) -> None:
        if self.path == "/health":
            self.send_json(200, {"status": "ok"})
        elif self.path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        else:
            self.send_json(404, {"error": {"message": "not found", "type": "invalid_request_error", "param": None,
                                       "code": "not_found"}})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        max_tokens = int(body.get("max_tokens", 16))
        per_event = self.options.tokens_per_event if body.get("speculative", True) else 1
        pause_s = (self.options.round_ms if per_event > 1 else self.options.decode_ms) / 1e3
        guard = self.lock if self.options.serialize else threading.Lock()
        with guard:
            if not body.get("stream"):
                text = "".join(token_text(i) for i in range(max_tokens))
                time.sleep(pause_s * -(-max_tokens // per_event))
                self.send_json(200, {"id": "cmpl-fake", "object": "text_completion", "model": MODEL,
                                 "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                                 "usage": {"prompt_tokens": 4, "completion_tokens": max_tokens,
                                           "total_tokens": 4 + max_tokens}})
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for start in range(0, max_tokens, per_event):
                time.sleep(pause_s)
                ids = list(range(start, min(start + per_event, max_tokens)))
                choice = {"index": 0, "text": "".join(token_text(i) for i in ids),
                          "finish_reason": "length" if ids[-1] == max_tokens - 1 else None}
                if not self.options.text_only:
                    choice["token_ids"] = ids
                self._event({"id": "cmpl-fake", "object": "text_completion", "model": MODEL, "choices": [choice]})
            wants_usage = (body.get("stream_options") or {}).get("include_usage")
            if wants_usage and not self.options.no_usage:
                self._event({"id": "cmpl-fake", "object": "text_completion", "model": MODEL, "choices": [],
                             "usage": {"prompt_tokens": 4, "completion_tokens": max_tokens,
                                       "total_tokens": 4 + max_tokens}})
            self.wfile.write(b"data: [DONE]\n\n")

    def _event(self, event: dict) -> None:
        self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        self.wfile.flush()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--tokens-per-event", type=int, default=3)
    parser.add_argument("--text-only", action="store_true")
    parser.add_argument("--no-usage", action="store_true")
    parser.add_argument("--decode-ms", type=float, default=5.0)
    parser.add_argument("--round-ms", type=float, default=12.0)
    parser.add_argument("--serialize", action="store_true")
    Handler.options = parser.parse_args(argv)
    server = ThreadingHTTPServer(("127.0.0.1", Handler.options.port), Handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"multitoken fake listening on http://127.0.0.1:{server.server_address[1]}", file=sys.stderr, flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

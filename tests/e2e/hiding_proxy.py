"""A proxy that makes `coopsched serve` look like a server that reports nothing about itself.

    python tests/e2e/hiding_proxy.py --upstream URL [--port 0] [--speculate-all] [--no-token-ids]

/health answers a bare {"status": "ok"} (as vLLM, llama.cpp and mlx_lm.server do), /metrics
is not there, and the OpenAI endpoints are forwarded with each SSE event's `coopsched` extension
(costs' witnesses: tick stamps, BurstFinalized) removed; a request served speculatively gets
llama.cpp's `timings` (`draft_n`, `draft_n_accepted`) in its last event instead. --speculate-all
ignores `speculative: false`, as llama.cpp does. Stdlib only; stderr says where it listens.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import urllib.parse
from http.server import ThreadingHTTPServer

from json_http import JsonHandler

HOP_HEADERS = {"connection", "transfer-encoding", "content-length", "keep-alive"}


class Proxy(JsonHandler):
    options: argparse.Namespace
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path == "/health":
            self.send_json(200, {"status": "ok"})
        elif self.path.startswith("/v1/"):
            self._forward(None)
        else:
            self.send_json(404, {"error": {"message": f"{self.path}: not found", "type": "invalid_request_error",
                                       "param": None, "code": "not_found"}})

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.loads(raw or b"{}")
        if self.options.speculate_all:
            body["speculative"] = True
        self._forward(body)

    def _forward(self, body: dict | None) -> None:
        parts = urllib.parse.urlsplit(self.options.upstream)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=300)
        try:
            conn.request(self.command, self.path, None if body is None else json.dumps(body),
                         {"Content-Type": "application/json"})
            upstream = conn.getresponse()
            streaming = upstream.getheader("Content-Type", "").startswith("text/event-stream")
            if not streaming:
                data = upstream.read()
                if body is not None and upstream.status == 200:
                    data = json.dumps(self._hide(json.loads(data))).encode()
                self.send_response(upstream.status)
                self.send_header("Content-Type", upstream.getheader("Content-Type", "application/json"))
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self.send_response(upstream.status)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            self._relay(upstream)
        finally:
            conn.close()

    def _relay(self, upstream: http.client.HTTPResponse) -> None:
        """Line by line, each event written and flushed as its blank line arrives."""
        while True:
            line = upstream.readline()
            if not line:
                return
            if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                line = b"data: " + json.dumps(self._hide(json.loads(line[5:]))).encode() + b"\n"
            self.wfile.write(line)
            if line == b"\n":
                self.wfile.flush()

    def _hide(self, event: dict) -> dict:
        ext = event.pop("coopsched", None) or {}
        burst = ext.get("burst")
        if "timings" not in event and ext.get("served_speculatively") and burst:
            event["timings"] = {"draft_n": burst.get("drafted_tokens", 0),
                                "draft_n_accepted": burst.get("accepted_draft_tokens", 0)}
        if not self.options.keep_token_ids:
            for choice in event.get("choices") or ():
                choice.pop("token_ids", None)
        return event


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="the server to forward to, http://HOST:PORT")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--speculate-all", action="store_true", help="ignore speculative: false")
    parser.add_argument("--no-token-ids", dest="keep_token_ids", action="store_false",
                        help="drop token_ids from events (text and the final usage only)")
    Proxy.options = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", Proxy.options.port), Proxy)
    server.daemon_threads = True
    print(f"hiding proxy listening on http://127.0.0.1:{server.server_address[1]}", file=sys.stderr, flush=True)
    try:
        server.serve_forever(poll_interval=0.05)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()

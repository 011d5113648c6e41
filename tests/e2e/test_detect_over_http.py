"""Detection over HTTP: small fake servers answer /health, /props, /v1/models and /metrics as each kind
does (bodies as those servers send them), and `coopsched serve` is recognized as itself."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from http.server import ThreadingHTTPServer

import pytest
from e2e_servers import serve
from json_http import JsonHandler

from harness.calibrate.detect import detect_kind

pytestmark = [pytest.mark.e2e, pytest.mark.parallel]  # what each server answers, never how fast

NOT_FOUND = (404, "application/json", b"Not Found")  # mlx_lm.server's answer to a path it lacks
JSON_404 = (404, "application/json", json.dumps({"error": {"message": "not found"}}).encode())


def _json(body) -> tuple[int, str, bytes]:
    return 200, "application/json", json.dumps(body).encode()


FAKES = {  # kind: {path: (status, content type, body)}, anything else -> the "*" answer
    "vllm": {"/health": (200, "application/json", b""),
             "/v1/models": _json({"data": [{"id": "tiny", "object": "model", "owned_by": "vllm",
                                            "max_model_len": 2048}]}),
             "/metrics": (200, "text/plain", b'# TYPE vllm:num_requests_running gauge\n'
                                             b'vllm:num_requests_running{model_name="tiny"} 0.0\n'),
             "*": JSON_404},
    "llama.cpp": {"/health": _json({"status": "ok"}),
                  "/props": _json({"default_generation_settings": {"n_ctx": 4096}, "total_slots": 2}),
                  "/v1/models": _json({"data": [{"id": "tiny.gguf", "object": "model", "owned_by": "llamacpp"}]}),
                  "*": JSON_404},
    "mlx-lm": {"/health": _json({"status": "ok"}),
               "/v1/models": _json({"object": "list", "data": [{"id": "/m/tiny", "object": "model", "created": 1}]}),
               "*": NOT_FOUND},
    "unknown": {"/health": _json({"status": "ok"}), "/v1/models": _json({"data": [{"id": "m", "object": "model"}]}),
                "*": JSON_404},
}


@contextmanager
def fake(routes: dict):
    class Handler(JsonHandler):
        def do_GET(self) -> None:
            status, kind, body = routes.get(self.path, routes["*"])
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize("kind", list(FAKES))
def test_a_fake_of_each_kind_is_detected(kind):
    with fake(FAKES[kind]) as url:
        got, evidence = detect_kind(url)
    assert got == kind, evidence


def test_coopsched_serve_is_detected_by_its_health():
    with serve("--decode-ms", "1", "--round-ms", "4") as served:
        kind, evidence = detect_kind(served.url)
    assert (kind, evidence) == ("coopsched", "/health reports mode='slice' and block_size")

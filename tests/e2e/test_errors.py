"""Malformed requests -> exact status codes and OpenAI-shaped errors with OpenAI's error types,
while another stream runs intact."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from e2e_servers import serve, wait_for

from harness.live.client import collect

pytestmark = [pytest.mark.e2e, pytest.mark.parallel]  # no wall-clock verdict: may run beside another test

CONTEXT = 4096
LONG_PROMPT = "x" * (CONTEXT + 10)
# what OpenAI's API sends as `type` for each status (a rate limit is typed by what ran out)
OPENAI_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 405: "invalid_request_error",
                413: "invalid_request_error", 429: "requests"}

# (id, path, raw body or JSON, status, param, code)
CASES = [
    ("not-json", "/v1/completions", b"{", 400, None, "invalid_json"),
    ("not-utf8", "/v1/completions", b"\xff\xfe", 400, None, "invalid_json"),
    ("body-is-a-list", "/v1/completions", [1], 400, None, "invalid_type"),
    ("prompt-missing", "/v1/completions", {"max_tokens": 4}, 400, "prompt", "missing_required_parameter"),
    ("prompt-a-number", "/v1/completions", {"prompt": 5}, 400, "prompt", "invalid_type"),
    ("prompt-empty", "/v1/completions", {"prompt": ""}, 400, "prompt", "invalid_value"),
    ("prompt-token-out-of-vocab", "/v1/completions", {"prompt": [72, 9999]}, 400, "prompt", "invalid_value"),
    ("prompt-batch", "/v1/completions", {"prompt": ["a", "b"]}, 400, "prompt", "invalid_value"),
    ("max-tokens-zero", "/v1/completions", {"prompt": "a", "max_tokens": 0}, 400, "max_tokens",
     "invalid_value"),
    ("max-tokens-negative", "/v1/completions", {"prompt": "a", "max_tokens": -3}, 400, "max_tokens",
     "invalid_value"),
    ("max-tokens-a-string", "/v1/completions", {"prompt": "a", "max_tokens": "8"}, 400, "max_tokens",
     "invalid_type"),
    ("max-tokens-a-float", "/v1/completions", {"prompt": "a", "max_tokens": 8.5}, 400, "max_tokens",
     "invalid_type"),
    ("max-tokens-a-bool", "/v1/completions", {"prompt": "a", "max_tokens": True}, 400, "max_tokens",
     "invalid_type"),
    ("temperature-negative", "/v1/completions", {"prompt": "a", "temperature": -0.1}, 400, "temperature",
     "invalid_value"),
    ("temperature-a-string", "/v1/completions", {"prompt": "a", "temperature": "hot"}, 400, "temperature",
     "invalid_type"),
    ("stream-a-string", "/v1/completions", {"prompt": "a", "stream": "yes"}, 400, "stream", "invalid_type"),
    ("speculative-a-number", "/v1/completions", {"prompt": "a", "speculative": 1}, 400, "speculative",
     "invalid_type"),
    ("return-token-ids-a-string", "/v1/completions", {"prompt": "a", "return_token_ids": "y"}, 400,
     "return_token_ids", "invalid_type"),
    ("stop-a-number", "/v1/completions", {"prompt": "a", "stop": 3}, 400, "stop", "invalid_type"),
    ("seed-a-string", "/v1/completions", {"prompt": "a", "seed": "s"}, 400, "seed", "invalid_type"),
    ("include-usage-a-string", "/v1/completions",
     {"prompt": "a", "stream": True, "stream_options": {"include_usage": "y"}}, 400,
     "stream_options.include_usage", "invalid_type"),
    ("prompt-longer-than-context", "/v1/completions", {"prompt": LONG_PROMPT}, 400, "prompt",
     "context_length_exceeded"),
    ("prompt-plus-budget-over-context", "/v1/completions", {"prompt": "y" * 4000, "max_tokens": 200}, 400,
     "max_tokens", "context_length_exceeded"),
    ("unknown-model", "/v1/completions", {"model": "gpt-4", "prompt": "a"}, 404, "model", "model_not_found"),
    ("chat-messages-missing", "/v1/chat/completions", {"max_tokens": 3}, 400, "messages",
     "missing_required_parameter"),
    ("chat-messages-a-string", "/v1/chat/completions", {"messages": "hi"}, 400, "messages", "invalid_type"),
    ("chat-message-without-role", "/v1/chat/completions", {"messages": [{"content": "hi"}]}, 400,
     "messages[0]", "invalid_type"),
    ("chat-max-tokens-zero", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, 400, "max_tokens", "invalid_value"),
    ("chat-unknown-model", "/v1/chat/completions",
     {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}, 404, "model", "model_not_found"),
    ("min-tokens-over-max-tokens", "/v1/completions", {"prompt": "a", "max_tokens": 4, "min_tokens": 5}, 400,
     "min_tokens", "invalid_value"),
    ("min-tokens-over-default-max-tokens", "/v1/completions", {"prompt": "a", "min_tokens": 17}, 400,
     "min_tokens", "invalid_value"),
    ("min-tokens-negative", "/v1/completions", {"prompt": "a", "min_tokens": -1}, 400, "min_tokens",
     "invalid_value"),
    ("min-tokens-a-string", "/v1/completions", {"prompt": "a", "min_tokens": "2"}, 400, "min_tokens",
     "invalid_type"),
    ("ignore-eos-a-number", "/v1/completions", {"prompt": "a", "ignore_eos": 1}, 400, "ignore_eos",
     "invalid_type"),
    ("chat-min-tokens-over-max-completion-tokens", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 3, "min_tokens": 4}, 400,
     "min_tokens", "invalid_value"),
    ("oversized-body", "/v1/completions", b'{"prompt": "' + b"z" * (2 << 20) + b'"}', 413, None,
     "request_too_large"),
    ("unknown-route", "/v1/embeddings", {"input": "a"}, 404, None, "not_found"),
]


def post(url: str, path: str, body) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(url + path, content=content, headers={"content-type": "application/json"}, timeout=30)


def assert_error_shape(response: httpx.Response, status: int, param, code) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] == OPENAI_TYPES[status]
    assert (error["param"], error["code"]) == (param, code)


def stream_tokens(url: str, body: dict, out: dict) -> None:
    got = collect(url, {**body, "return_token_ids": True}, timeout_s=60)
    out.update(status=got.status, done=got.done and got.error is None, token_ids=got.token_ids,
               finish=[a.finish_reason for a in got.arrivals])


@pytest.fixture(scope="module")
def slow_server():
    # 3 ms decode steps: the concurrent stream below is still running when the table is done
    with serve("--decode-ms", "3", "--round-ms", "12") as served:
        yield served


def test_malformed_requests_leave_a_concurrent_stream_intact(slow_server):
    url = slow_server.url
    body = {"prompt": "steady stream", "max_tokens": 300, "temperature": 0}
    solo = post(url, "/v1/completions", {**body, "return_token_ids": True, "speculative": False}).json()
    expected = solo["choices"][0]["token_ids"]

    out, out_spec = {}, {}
    streams = [threading.Thread(target=stream_tokens, args=(url, {**body, "speculative": spec}, result))
               for spec, result in ((False, out), (True, out_spec))]
    for thread in streams:
        thread.start()
    failures = []
    for case_id, path, payload, status, param, code in CASES:
        try:
            assert_error_shape(post(url, path, payload), status, param, code)
        except AssertionError as exc:
            failures.append(f"{case_id}: {exc}")
    for thread in streams:
        thread.join(timeout=120)
    assert not failures, "\n".join(failures)
    for result in (out, out_spec):
        assert result["status"] == 200 and result.get("done")
        assert result["token_ids"] == expected
        assert result["finish"] == [None] * 299 + ["length"]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_each_malformed_request(server, case):
    _, path, payload, status, param, code = case
    assert_error_shape(post(server.url, path, payload), status, param, code)


def test_min_tokens_over_max_tokens_names_both_values(server):
    response = post(server.url, "/v1/completions", {"prompt": "a", "max_tokens": 7, "min_tokens": 11})
    assert "'min_tokens' is 11 but 'max_tokens' is 7" in response.json()["error"]["message"]


@pytest.mark.parametrize("method, path, status, param, code", [
    pytest.param("GET", "/v1/models/gpt-4", 404, "model", "model_not_found", id="unknown-model-id"),
    pytest.param("GET", "/v1/models/org/some-model", 404, "model", "model_not_found", id="model-id-with-slash"),
    pytest.param("GET", "/v1/nothing", 404, None, "not_found", id="unknown-route"),
    pytest.param("GET", "/v1/completions", 405, None, None, id="wrong-method"),
])
def test_get_errors(server, method, path, status, param, code):
    assert_error_shape(httpx.request(method, server.url + path, timeout=30), status, param, code)


def test_queue_full_is_429():
    # prefill of a 2000-token prompt takes 2 s: the first request is still waiting for its first token
    with serve("--prefill-ms-per-token", "1", "--max-queue", "1") as served:
        first: dict = {}
        thread = threading.Thread(target=lambda: first.update(
            post(served.url, "/v1/completions", {"prompt": "p" * 2000, "max_tokens": 1}).json()))
        thread.start()
        try:
            assert wait_for(lambda: served.metrics()["coopsched_requests_waiting"] >= 1
                            or served.metrics()["coopsched_kv_slots_in_use"] >= 1)
            assert_error_shape(post(served.url, "/v1/completions", {"prompt": "b", "max_tokens": 1}),
                               429, None, "queue_full")
        finally:
            thread.join(timeout=30)
        assert first["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(("args", "line"), [
    (["--port", "99999"], "error: --port=99999 must be at most 65535 (0 picks a free port)"),
    (["--port", "-1"], "error: --port=-1 must be >= 0"),
    (["--decode-ms", "-1"], "error: --decode-ms=-1.0 must be >= 0"),
    (["--backend", "mlx", "--model", "/no/such/model"], "error: /no/such/model is not a model directory"),
], ids=["port-too-high", "port-negative", "decode-negative", "mlx-model-missing"])
def test_bad_serve_options_are_one_line_before_anything_starts(args, line, capsys):
    from coopsched.cli import main as cli
    assert cli(["serve", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(line) and "Traceback" not in err and err.count("\n") == 1

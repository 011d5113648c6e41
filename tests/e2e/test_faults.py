"""Server faults on loopback: schema fuzzing, mass disconnects, a failing request, SIGTERM.

- schemathesis against the app's OpenAPI schema (valid and invalid bodies): no 5xx,
  every 4xx documented and OpenAI-shaped;
- 100 clients disconnecting mid-stream (and while still queued): no slot leaks;
- a backend error for one request: that stream ends with an error event, others finish;
- SIGTERM: every open stream ends with an error event and the process exits 0.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from collections import Counter
from pathlib import Path

import httpx
import pytest
import schemathesis
from e2e_servers import serve, wait_for
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from harness.live.client import StreamError, stream

pytestmark = [pytest.mark.e2e, pytest.mark.parallel]  # no wall-clock verdict: may run beside another test

FAULT_SERVER = Path(__file__).with_name("fault_server.py")
FUZZ_EXAMPLES = 200  # per operation and generation mode: ~900 requests in all
OPENAI_ERROR_KEYS = {"message", "type", "param", "code"}


def is_openai_error(body) -> bool:
    return (isinstance(body, dict) and set(body) == {"error"} and set(body["error"]) == OPENAI_ERROR_KEYS
            and isinstance(body["error"]["message"], str) and body["error"]["message"])


def idle(server) -> bool:
    m = server.metrics()
    return (m["coopsched_kv_slots_in_use"], m["coopsched_requests_running"],
            m["coopsched_requests_waiting"]) == (0, 0, 0)


# -- schemathesis -----------------------------------------------------------------------
def test_schema_fuzzing_finds_no_5xx_and_only_openai_shaped_4xx():
    # tiny costs and context: every generated request finishes in milliseconds
    with serve("--decode-ms", "0.05", "--round-ms", "0.2", "--prefill-ms-per-token", "0.01",
               "--max-context", "128") as served:
        schema = schemathesis.openapi.from_url(f"{served.url}/openapi.json")
        statuses: Counter = Counter()
        by_operation: Counter = Counter()
        problems: list[str] = []
        session = __import__("requests").Session()
        for result in schema.get_all_operations():
            operation = result.ok()
            modes = [GenerationMode.POSITIVE] + ([GenerationMode.NEGATIVE] if operation.method == "post" else [])
            for mode in modes:
                _fuzz(operation, mode, served.url, session, statuses, by_operation, problems)
        total = sum(statuses.values())
        print(f"\nschemathesis: {total} requests, statuses {dict(sorted(statuses.items()))}")
        for (label, status), n in sorted(by_operation.items()):
            print(f"  {label}: {status} x {n}")
        assert total >= 500, statuses
        assert not problems, "\n".join(problems[:20])
        assert any(400 <= s < 500 for s in statuses) and 200 in statuses
        assert wait_for(lambda: idle(served)), served.metrics()


def _fuzz(operation, mode, url, session, statuses: Counter, by_operation: Counter, problems: list[str]) -> None:
    checks = [not_a_server_error, status_code_conformance, content_type_conformance,
              response_schema_conformance]

    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case):
        response = case.call(base_url=url, session=session, timeout=30)
        statuses[response.status_code] += 1
        by_operation[f"{operation.method.upper()} {operation.path} {mode.value}", response.status_code] += 1
        label = f"{operation.method.upper()} {operation.path} [{mode.value}] -> {response.status_code}"
        try:
            case.validate_response(response, checks=checks)
        except (Exception, BaseExceptionGroup) as exc:  # schemathesis raises a group of named failures
            problems.append(f"{label}: {exc}\n  body sent: {str(case.body)[:200]}")
        if 400 <= response.status_code < 500:
            try:
                body = response.json()
            except ValueError:
                body = None
            if not is_openai_error(body):
                problems.append(f"{label}: not an OpenAI error: {response.text[:200]}")

    run()


# -- 100 clients vanish -------------------------------------------------------------------
def fault_server(*args: str, plant: str | None = None):
    command = [sys.executable, str(FAULT_SERVER), *args, "--port", "0"]
    return serve(command=command + (["--plant", plant] if plant else []))


async def _client_that_vanishes(client: httpx.AsyncClient, url: str, i: int) -> int:
    """Reads i % 5 events (0: leaves while still queued, before any token), then drops the connection."""
    body = {"prompt": f"client {i} never reads to the end", "max_tokens": 3000, "temperature": 0,
            "stream": True, "speculative": i % 2 == 0}
    seen = 0
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        assert response.status_code == 200
        if i % 5 == 0:
            return 0
        async for line in response.aiter_lines():
            seen += line.startswith("data: ")
            if seen >= i % 5:
                break
    return seen


async def _hundred_clients(url: str, timeout_s: float) -> list:
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout_s) as client:
        return await asyncio.gather(*(_client_that_vanishes(client, url, i) for i in range(100)),
                                    return_exceptions=True)


@pytest.mark.parametrize("plant", [None, "no-cancel"], ids=["handled", "planted-no-cancel"])
def test_a_hundred_clients_disconnecting_mid_stream_leak_no_slot(plant):
    with fault_server("--decode-ms", "1", "--round-ms", "4", "--num-slots", "32", plant=plant) as served:
        seen = asyncio.run(_hundred_clients(served.url, timeout_s=5 if plant else 60))
        if plant:  # without the cancel, the vanished clients' rows keep their slots (and later ones starve)
            assert not wait_for(lambda: idle(served), timeout_s=3)
            assert served.metrics()["coopsched_kv_slots_in_use"] > 0
            return
        assert not [s for s in seen if isinstance(s, BaseException)], seen
        assert sum(1 for n in seen if n > 0) == 80, seen  # the others left before their first token
        assert wait_for(lambda: idle(served), timeout_s=10), served.metrics()
        response = httpx.post(f"{served.url}/v1/completions", json={"prompt": "after", "max_tokens": 5},
                              timeout=30)
        assert response.status_code == 200 and response.json()["choices"][0]["finish_reason"] == "length"
        assert httpx.get(f"{served.url}/health", timeout=10).status_code == 200


# -- a backend error for one request ----------------------------------------------------------
def _read(url: str, body: dict, out: dict, started: threading.Event | None = None) -> None:
    """The shared SSE reader (harness/live/client.py); `started` is set after 3 events."""
    arrivals = out["arrivals"] = []
    out.update(status=200, error=None, done=False)
    try:
        for arrival in stream(url, {**body, "return_token_ids": True}, timeout_s=60):
            arrivals.append(arrival)
            if started is not None and len(arrivals) >= 3:
                started.set()
        out["done"] = True
    except StreamError as exc:
        out.update(status=exc.status, error=exc.error, done=exc.done)


def _tokens(out: dict) -> list[int]:
    return [t for a in out["arrivals"] for t in a.token_ids or ()]


@pytest.mark.parametrize("plant", [None, "no-containment"], ids=["handled", "planted-no-containment"])
def test_a_backend_error_ends_only_that_stream_with_an_error_event(plant):
    with fault_server("--poison", "POISON", "--poison-after", "3", "--decode-ms", "2", "--round-ms", "8",
                      plant=plant) as served:
        base = {"max_tokens": 40, "temperature": 0}
        bodies = {"poisoned-classic": {"prompt": "POISON classic", "speculative": False},
                  "poisoned-spec": {"prompt": "POISON spec", "speculative": True},
                  **{f"healthy-{i}": {"prompt": f"healthy {i}", "speculative": i % 2 == 0} for i in range(4)}}
        outs = {name: {} for name in bodies}
        threads = [threading.Thread(target=_read, args=(served.url, {**base, **body}, outs[name]))
                   for name, body in bodies.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        if plant:  # the first failure kills the engine: no stream finishes (error event or 503), health 503
            finished = [name for name, out in outs.items()
                        if any(a.finish_reason == "length" for a in out["arrivals"])]
            assert not finished
            assert httpx.get(f"{served.url}/health", timeout=10).status_code == 503
            return
        for name, out in outs.items():
            assert out["status"] == 200 and out["done"], (name, out)  # [DONE] ends every stream
            tokens = _tokens(out)
            if name.startswith("poisoned"):
                error = {"error": out["error"]}
                assert is_openai_error(error) and error["error"]["code"] == "model_error", error
                assert "injected" in error["error"]["message"]
                assert 0 < len(tokens) < 40  # it streamed, then failed mid-stream
                assert all(a.finish_reason is None for a in out["arrivals"])
            else:
                solo = httpx.post(f"{served.url}/v1/completions", timeout=30,
                                  json={**base, **bodies[name], "return_token_ids": True}).json()
                assert out["error"] is None, (name, out["error"])
                assert tokens == solo["choices"][0]["token_ids"] and len(tokens) == 40, name
                assert out["arrivals"][-1].finish_reason == "length"
        assert wait_for(lambda: idle(served)), served.metrics()
        assert httpx.get(f"{served.url}/health", timeout=10).status_code == 200


# -- SIGTERM ---------------------------------------------------------------------------------
@pytest.mark.parametrize("plant", [None, "plain-shutdown"], ids=["handled", "planted-plain-shutdown"])
def test_sigterm_ends_open_streams_with_an_error_event_and_exits_0(plant):
    # 400 tokens: a few seconds per stream, so every stream is open when SIGTERM lands
    with fault_server("--decode-ms", "4", "--round-ms", "16", plant=plant) as served:
        outs = [{} for _ in range(6)]
        started = [threading.Event() for _ in outs]
        threads = [threading.Thread(target=_read, args=(served.url, {
            "prompt": f"long {i}", "max_tokens": 400, "speculative": i % 2 == 0}, outs[i], started[i]))
            for i in range(len(outs))]
        for thread in threads:
            thread.start()
        assert all(event.wait(timeout=30) for event in started)
        served.proc.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(timeout=60)
        assert served.proc.wait(timeout=60) == 0
        if plant:  # uvicorn alone lets every stream run to its end: no error event
            assert not any(out["error"] for out in outs)
            assert all(out["done"] and out["arrivals"][-1].finish_reason == "length" for out in outs)
            return
        for out in outs:
            assert out["done"] and out["error"]["code"] == "server_shutting_down", out["error"]
            assert 3 <= len(_tokens(out)) < 400

"""Locust soak workload: a mixed OpenAI load on one server, every response checked.

    locust -f scenarios/soak.py --headless -u 64 -r 16 -t 5m --host URL

Streaming and plain completions and chats, classic and speculative, short and long,
a share of clients that drop their stream mid-way (the cancel path), and /metrics
scrapes. A stream passes iff it ends with [DONE] and no error event. `harness/live/soak.py`
runs this against a mock server and watches the server's RSS.
"""

from __future__ import annotations

import random

from locust import HttpUser, between, task

from harness.live import client

TIMEOUT_S = 120


class SoakUser(HttpUser):
    wait_time = between(0.0, 0.2)

    def _body(self, is_chat: bool, **extra) -> dict:
        text = f"soak {random.randrange(10 ** 6)}: " + "tick " * random.randint(1, 40)
        body = {"max_tokens": random.choice((8, 32, 64, 128)), "temperature": random.choice((0, 0.7)),
                "speculative": random.random() < 0.5, **extra}
        if is_chat:
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        return body

    def _stream(self, path: str, body: dict, name: str, abandon_after: int | None = None) -> None:
        with self.client.post(path, json={**body, "stream": True}, stream=True, catch_response=True,
                              name=name, timeout=TIMEOUT_S) as response:
            if response.status_code != 200:
                response.failure(f"{response.status_code}: {response.text[:200]}")
                return
            events = 0
            for line in response.iter_lines(decode_unicode=True):
                try:
                    item = client.decode_line(line, 0)  # the shared SSE reader's event decoding
                except client.StreamError as exc:
                    response.failure(str(exc))
                    return
                if item is None:
                    continue
                if item is client.DONE:
                    response.success()
                    return
                events += 1
                if abandon_after is not None and events >= abandon_after:
                    response.success()  # leaving the block drops the connection mid-stream
                    return
            response.failure("the stream ended without [DONE]")

    @task(4)
    def stream_completion(self) -> None:
        self._stream("/v1/completions", self._body(False), "stream completion")

    @task(2)
    def stream_chat(self) -> None:
        self._stream("/v1/chat/completions", self._body(True), "stream chat")

    @task(2)
    def completion(self) -> None:
        body = self._body(False)
        with self.client.post("/v1/completions", json=body, catch_response=True, name="completion",
                              timeout=TIMEOUT_S) as response:
            if response.status_code != 200:
                response.failure(f"{response.status_code}: {response.text[:200]}")
            elif response.json()["choices"][0]["finish_reason"] not in ("stop", "length"):
                response.failure(f"finish_reason {response.json()['choices'][0]['finish_reason']}")

    @task(1)
    def stream_then_vanish(self) -> None:
        body = self._body(False, max_tokens=512)
        self._stream("/v1/completions", body, "stream, then disconnect", abandon_after=random.randint(1, 6))

    @task(1)
    def scrape(self) -> None:
        self.client.get("/metrics", name="/metrics", timeout=TIMEOUT_S)

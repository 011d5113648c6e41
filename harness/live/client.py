"""The one live client: spawn a server on loopback, read an OpenAI SSE stream, GET its JSON.

Stdlib transport only (http.client, subprocess): the locust files import this under
gevent's monkey-patching, where every call stays cooperative. A stream yields one
`Arrival` per data event; `token_counts` turns arrivals into tokens by the rule in
harness/run/metrics.py (token ids when the event has them, else the final usage).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from harness.run import metrics

LISTENING = re.compile(r"listening on (http://[\w.\-]+:\d+)")
LOOPBACK = "127.0.0.1"


# -- HTTP --------------------------------------------------------------------------------
def split_url(url: str) -> tuple[str, int, str]:
    """(host, port, path prefix) of an http:// URL (a bare HOST:PORT is taken as http)."""
    parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"{url!r}: want http://HOST:PORT")
    return parts.hostname, parts.port or 80, parts.path.rstrip("/")


def request(base: str, method: str, path: str, body: dict | None = None,
            timeout_s: float = 10.0) -> tuple[int, bytes]:
    host, port, prefix = split_url(base)
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        payload = None if body is None else json.dumps(body)
        headers = {} if body is None else {"Content-Type": "application/json"}
        conn.request(method, prefix + path, payload, headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def get_json(base: str, path: str, timeout_s: float = 5.0) -> dict | None:
    """The JSON body of a 200 answer; None for anything else (refused, non-200, not JSON)."""
    try:
        status, body = request(base, "GET", path, timeout_s=timeout_s)
        return json.loads(body) if status == 200 else None
    except (OSError, ValueError):
        return None


def scrape_metrics(base: str) -> dict[str, float]:
    """Every sample of /metrics as {'name{labels}': value}."""
    status, body = request(base, "GET", "/metrics")
    if status != 200:
        raise OSError(f"{base}/metrics answered {status}")
    out = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


T = TypeVar("T")

# the speculative counters of llama.cpp's /metrics (coopsched serve and upstream serve them too);
# without them, coopsched's own: rounds are its drafts, and K - 1 drafted per round + the round is K
SPEC_COUNTERS = {"drafts": "llamacpp:spec_decode_num_drafts_total",
                 "draft_tokens": "llamacpp:spec_decode_num_draft_tokens_total",
                 "accepted": "llamacpp:spec_decode_num_accepted_tokens_total"}
OWN_ROUNDS, OWN_DRAFTED = "coopsched_spec_rounds_total", "coopsched_spec_draft_tokens_total"


def spec_counters(samples: dict[str, float] | None) -> dict[str, float] | None:
    """{drafts, draft_tokens, accepted} from a scrape (label sets summed), or None when it has none."""
    if not samples:
        return None
    summed = folded(samples)
    if SPEC_COUNTERS["drafts"] in summed:
        return {key: summed.get(name) for key, name in SPEC_COUNTERS.items()}
    if OWN_ROUNDS in summed:
        rounds = summed[OWN_ROUNDS]
        return {"drafts": rounds, "draft_tokens": summed.get(OWN_DRAFTED, 0.0) + rounds, "accepted": None}
    return None


def folded(samples: Mapping[str, float] | None) -> dict[str, float]:
    """A scrape with every label set summed per metric name (vLLM labels each by engine and model)."""
    out: dict[str, float] = {}
    for name, value in (samples or {}).items():
        bare = name.split("{", 1)[0]
        out[bare] = out.get(bare, 0.0) + value
    return out


def settled(scrape: Callable[[], T | None], settle_s: float = 0.05, timeout_s: float = 3.0) -> T | None:
    """A scrape once two in a row agree: a server books a tick's counters just after its tokens."""
    last = scrape()
    deadline = time.monotonic() + timeout_s
    while last is not None and time.monotonic() < deadline:
        time.sleep(settle_s)
        now = scrape()
        if now == last:
            break
        last = now
    return last


def try_scrape(base: str) -> dict[str, float] | None:
    """scrape_metrics, or None from a server without a Prometheus /metrics."""
    try:
        return scrape_metrics(base)
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def is_healthy(base: str) -> bool:
    """/health answers 200 (vLLM's has an empty body, so JSON is not required)."""
    try:
        return request(base, "GET", "/health", timeout_s=2)[0] == 200
    except OSError:
        return False


def wait_healthy(base: str, timeout_s: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not is_healthy(base):
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}) before {base}/health answered")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{base}/health never answered 200 within {timeout_s:g} s")
        time.sleep(0.05)


# -- servers -----------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


@dataclass
class Served:
    url: str
    proc: subprocess.Popen
    log_path: Path
    returncode: int | None = None
    own_group: bool = False
    _final_log: list[str] | None = field(default=None, repr=False)

    @property
    def log(self) -> list[str]:
        """The server's stderr lines so far (kept after the log file is gone)."""
        if self._final_log is not None:
            return self._final_log
        return self.log_path.read_text(errors="replace").splitlines(keepends=True)

    def metrics(self) -> dict[str, float]:
        return scrape_metrics(self.url)

    def stop(self, timeout_s: float = 15.0) -> int:
        """SIGTERM, then SIGKILL after timeout_s; the exit code. A server in its own process group
        (`own_group`) is stopped with its whole group, so workers it forked do not outlive it."""
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.proc.wait()
        if self.own_group:
            self._signal(signal.SIGKILL)  # whatever of its group is left
        self.returncode = self.proc.returncode
        return self.returncode

    def _signal(self, sig: int) -> None:
        try:
            if self.own_group:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)
        except ProcessLookupError:
            pass


def serve_command(args: Sequence[str]) -> list[str]:
    """`coopsched serve` on a free loopback port, from this interpreter (and its PYTHONPATH)."""
    return [sys.executable, "-m", "coopsched.cli", "serve", "--host", LOOPBACK, "--port", "0", *args]


@contextmanager
def spawn_server(args: Sequence[str] = (), *, command: Sequence[str] | None = None, port: int | None = None,
                 env: dict | None = None, log_path: Path | None = None, timeout_s: float = 60.0,
                 own_group: bool = False):
    """A server for the `with` block: `coopsched serve --port 0 ARGS`, or `command`.

    The URL is read from the server's "listening on http://..." stderr line, or, for a
    command told to listen on `port` (e.g. mlx_lm.server), is that loopback port. Yields
    once /health answers 200; SIGTERM on exit (SIGKILL after 15 s). stderr goes to
    `log_path` (a temporary file by default: its lines stay readable as `served.log`).
    `own_group` starts it in a new session and stops the whole group (servers that fork workers).
    """
    own_log = log_path is None
    if own_log:
        handle, name = tempfile.mkstemp(prefix="coopsched-server-", suffix=".log")
        os.close(handle)
        log_path = Path(name)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(list(command) if command else serve_command(args), stdout=subprocess.DEVNULL,
                                stderr=log, env=env, start_new_session=own_group)
    served = Served("", proc, log_path, own_group=own_group)
    try:
        try:
            served.url = f"http://{LOOPBACK}:{port}" if port else _listening_url(served, timeout_s)
            wait_healthy(served.url, timeout_s, proc)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; server log {log_path}:\n{''.join(served.log)[-3000:]}") from None
        yield served
    finally:
        served.stop()
        if own_log:
            served._final_log = served.log
            log_path.unlink(missing_ok=True)


def _listening_url(served: Served, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        match = LISTENING.search("".join(served.log))
        if match:
            return match.group(1)
        if served.proc.poll() is not None:
            raise RuntimeError(f"the server exited ({served.proc.returncode}) before listening")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server printed no 'listening on' line within {timeout_s:g} s")
        time.sleep(0.02)


# -- SSE ---------------------------------------------------------------------------------
@dataclass(slots=True)
class Arrival:
    """One SSE data event. n_tokens: len(token_ids) when the event carries ids, 0 when it
    carries no text either, None when it carries text only (resolved by `token_counts`)."""
    time_ns: int
    n_tokens: int | None
    token_ids: list[int] | None
    text: str
    finish_reason: str | None
    usage: dict | None
    event: dict


class StreamError(Exception):
    """A stream that failed: a non-200 status, an error event (`error`; `done`: [DONE] followed
    it, as an OpenAI server sends it), or a connection cut before [DONE]."""

    def __init__(self, message: str, *, status: int | None = None, error: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.error, self.done = status, error, False


DONE = "[DONE]"


def decode_line(line: bytes | str, now_ns: int) -> Arrival | str | None:
    """One SSE line: an Arrival, DONE, or None (not a data line). An error event raises."""
    if isinstance(line, bytes):
        line = line.decode("utf-8", errors="replace")
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if payload == DONE:
        return DONE
    event = json.loads(payload)
    if "error" in event:
        error = event["error"]
        raise StreamError(f"error event: {json.dumps(error)[:300]}", error=error)
    choice = (event.get("choices") or [{}])[0]  # n = 1: the first choice is the stream
    ids = choice.get("token_ids")
    text = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
    n_tokens = len(ids) if ids is not None else (None if text else 0)
    return Arrival(now_ns, n_tokens, ids, text, choice.get("finish_reason"), event.get("usage"), event)


def stream(base: str, body: dict, *, path: str = "/v1/completions", timeout_s: float = 300.0,
           clock=time.perf_counter_ns, opened: Callable[[http.client.HTTPConnection], None] | None = None,
           ) -> Iterator[Arrival]:
    """POST a streaming request; yield every data event as it arrives, until [DONE].
    Raises StreamError on a non-200 answer, a stream cut before [DONE], or an error event
    (after reading on to the stream's end); closing the generator early drops the
    connection (the server cancels the request). `opened` gets the connection once the request
    is sent (another thread may cut it: see `hang_up`)."""
    host, port, prefix = split_url(base)
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    failed: StreamError | None = None
    try:
        conn.request("POST", prefix + path, json.dumps({**body, "stream": True}),
                     {"Content-Type": "application/json", "Accept": "text/event-stream"})
        if opened is not None:
            opened(conn)
        response = conn.getresponse()
        if response.status != 200:
            raise StreamError(f"HTTP {response.status}: {response.read()[:300]!r}", status=response.status)
        while True:
            line = response.readline()
            now = clock()
            if not line:
                raise failed or StreamError("the stream ended without [DONE]", status=200)
            try:
                item = decode_line(line, now)
            except StreamError as exc:
                exc.status = response.status
                failed = failed or exc
                continue
            if item is DONE:
                if failed:
                    failed.done = True
                    raise failed
                return
            if item is not None and failed is None:
                yield item
    finally:
        conn.close()


@dataclass
class Collected:
    """A whole stream: when it was sent, what arrived, and how it ended (error None = [DONE])."""
    sent_ns: int
    arrivals: list[Arrival] = field(default_factory=list)
    error: str | None = None
    error_event: dict | None = None
    status: int | None = None
    done: bool = False
    abandoned: bool = False  # the client gave it up (never sent, or its stream cut): not the server's failure

    @property
    def counts(self) -> list[int]:
        return token_counts(self.arrivals)

    @property
    def token_ids(self) -> list[int]:
        return [t for a in self.arrivals for t in a.token_ids or ()]

    @property
    def text(self) -> str:
        return "".join(a.text for a in self.arrivals)

    @property
    def timings(self) -> dict | None:
        """llama.cpp's per-response `timings` (coopsched's too), from the last event that has them."""
        return next((a.event["timings"] for a in reversed(self.arrivals) if isinstance(a.event.get("timings"), dict)),
                    None)

    @property
    def finish_reason(self) -> str | None:
        return next((a.finish_reason for a in reversed(self.arrivals) if a.finish_reason), None)

    @property
    def usage(self) -> dict | None:
        return next((a.usage for a in reversed(self.arrivals) if a.usage), None)

    def token_times_ms(self, origin_ns: int = 0) -> list[float]:
        """Each token's arrival, ms after origin_ns (a multi-token arrival repeats its time)."""
        return metrics.token_times([(a.time_ns - origin_ns) / 1e6 for a in self.arrivals], self.counts)

    @property
    def first_token_ns(self) -> int | None:
        """When the first event that carried tokens arrived (None: none yet)."""
        return next((a.time_ns for a in self.arrivals if a.n_tokens != 0), None)


def collect(base: str, body: dict, *, path: str = "/v1/completions", timeout_s: float = 300.0,
            clock=time.perf_counter_ns, into: Collected | None = None,
            opened: Callable[[http.client.HTTPConnection], None] | None = None) -> Collected:
    """Read a whole stream; a failure is kept in `error` along with what arrived before it. `into`
    is filled as the stream arrives (another thread may watch it), `opened` as for `stream`."""
    out = into if into is not None else Collected(0)
    out.sent_ns, out.error, out.error_event, out.status, out.done = clock(), None, None, None, False
    out.arrivals.clear()  # `into` may hold a refused try's
    try:
        for arrival in stream(base, body, path=path, timeout_s=timeout_s, clock=clock, opened=opened):
            out.arrivals.append(arrival)
        out.status, out.done = 200, True
    except StreamError as exc:
        out.error, out.error_event, out.status, out.done = str(exc), exc.error, exc.status, exc.done
    except (OSError, ValueError) as exc:  # refused, reset, timed out, a malformed event
        out.error = repr(exc)
    return out


def hang_up(conn: http.client.HTTPConnection) -> None:
    """Cut a stream another thread is reading: its read ends (the server sees the client go)."""
    try:
        conn.sock.shutdown(socket.SHUT_RDWR)  # type: ignore[union-attr]
    except (OSError, AttributeError):  # already closed
        pass


def token_counts(arrivals: Sequence[Arrival]) -> list[int]:
    """Tokens per arrival: the event's token ids when it has them, else the final usage's
    completion_tokens shared over the text-only events (see metrics.token_counts)."""
    usage = next((a.usage for a in reversed(arrivals) if a.usage), None) or {}
    return metrics.token_counts([a.n_tokens for a in arrivals], [len(a.text) for a in arrivals],
                                usage.get("completion_tokens"))

"""Which server is this? Its kind (coopsched.twins.KINDS, or "unknown") from what it exposes without
generating anything: /health, /props, /v1/models' `owned_by`, /metrics' name prefixes, and how it
answers a path it lacks. `classify` is the rule over those answers; `detect_kind` asks the server.
The evidence is one line naming what decided.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.live import client

UNKNOWN = "unknown"
MLX_LM_NOT_FOUND = b"Not Found"  # mlx_lm.server's whole body for a path it does not serve


@dataclass(frozen=True)
class Exposed:
    """The server's answers: JSON bodies (None: no 200 JSON), /metrics text (None: none), and the
    status and body of a GET of /metrics (what a server without one says)."""
    health: dict | None = None
    props: dict | None = None
    models: list | None = None
    metrics: str | None = None
    missing_status: int | None = None
    missing_body: bytes = b""

    def owned_by(self) -> set[str]:
        return {str(m.get("owned_by")) for m in self.models or [] if isinstance(m, dict) and m.get("owned_by")}

    def metric_prefixes(self) -> set[str]:
        names = {line.split("{", 1)[0].split(None, 1)[0] for line in (self.metrics or "").splitlines()
                 if line.strip() and not line.startswith("#")}
        return {p for p in ("coopsched_", "vllm:", "llamacpp:") if any(n.startswith(p) for n in names)}


def classify(seen: Exposed) -> tuple[str, str]:
    """(kind, evidence). coopsched first: its /metrics also carries llama.cpp's counter names."""
    from coopsched.core import MODES

    health, owners, prefixes = seen.health or {}, seen.owned_by(), seen.metric_prefixes()
    if health.get("mode") in MODES and "block_size" in health:
        return "coopsched", f"coopsched: /health reports mode {health['mode']} and block_size {health['block_size']}"
    if "coopsched" in owners or "coopsched_" in prefixes:
        return "coopsched", "coopsched: " + ("/v1/models owned_by coopsched" if "coopsched" in owners
                                             else "/metrics has coopsched_ series")
    if "vllm:" in prefixes or "vllm" in owners:
        return "vllm", "vllm: " + ("/metrics has vllm: counters" if "vllm:" in prefixes else "/v1/models owned_by vllm")
    settings = (seen.props or {}).get("default_generation_settings")
    if isinstance(settings, dict) or "llamacpp" in owners or "llamacpp:" in prefixes:
        why = ("/props has default_generation_settings" if isinstance(settings, dict) else
               "/v1/models owned_by llamacpp" if "llamacpp" in owners else "/metrics has llamacpp: counters")
        return "llama.cpp", f"llama.cpp: {why}"
    if (health == {"status": "ok"} and seen.models and not owners and seen.missing_status == 404
            and seen.missing_body.strip() == MLX_LM_NOT_FOUND):
        return "mlx-lm", ("mlx-lm: /health is {\"status\": \"ok\"}, /v1/models has no owned_by and a missing "
                          "path answers a bare 404 \"Not Found\", as mlx_lm.server does")
    return UNKNOWN, (f"unknown: no rule matched (/health keys {sorted(health) or 'none'}, /v1/models owned_by "
                     f"{sorted(owners) or 'none'}, /metrics prefixes {sorted(prefixes) or 'none'}, /props "
                     f"{'without' if seen.props is not None else 'no'} default_generation_settings)")


def exposed(url: str) -> Exposed:
    """GET what classify reads (each a short timeout; a refusal is an absence)."""
    models = (client.get_json(url, "/v1/models") or {}).get("data")
    try:
        status, body = client.request(url, "GET", "/metrics", timeout_s=5)
    except OSError:
        status, body = None, b""
    text = body.decode("utf-8", errors="replace") if status == 200 else None
    return Exposed(client.get_json(url, "/health"), client.get_json(url, "/props"),
                   models if isinstance(models, list) else None, text, status, body)


def detect_kind(server) -> tuple[str, str]:
    """(kind, evidence) of the server at `server.url` (a calibrate target.Server, or a URL)."""
    return classify(exposed(getattr(server, "url", server)))

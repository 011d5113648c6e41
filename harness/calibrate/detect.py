"""Which server is this? Its kind from what it exposes, with the evidence, for `calibrate --target`.

`kind_of` is a pure rule over what was fetched (so each rule is tested on planted answers);
`detect_kind` fetches /health, /v1/models, /props, /metrics and the Server header once each.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from coopsched.twins import UNKNOWN
from harness.live import client


class Exposed(NamedTuple):
    """What a server answered: None/empty where it answered nothing (or not 200)."""
    health: Mapping = {}
    models: Sequence[Mapping] = ()    # /v1/models `data`
    props: Mapping | None = None      # llama.cpp's /props
    metric_names: frozenset[str] = frozenset()
    server_header: str = ""
    not_found: bytes | None = None    # the body of /metrics when it answered 404
    models_unreadable: bool = False   # /v1/models answered 200 with no JSON body


def kind_of(exposed: Exposed) -> tuple[str, str]:
    """(kind, evidence): the first rule that matches, strongest first. coopsched serve also exports
    llama.cpp's spec counter names, so its own marks are looked for before any other server's."""
    metrics = exposed.metric_names
    owners = {str(m.get("owned_by", "")) for m in exposed.models}
    if "mode" in exposed.health and "block_size" in exposed.health:
        return "coopsched", f"/health reports mode={exposed.health['mode']!r} and block_size"
    if any(name.startswith("coopsched_") for name in metrics):
        return "coopsched", "/metrics has coopsched_ series"
    if "coopsched" in owners:  # behind a proxy that hides /health and /metrics
        return "coopsched", "/v1/models owned_by 'coopsched'"
    if any(name.startswith("vllm:") for name in metrics) or "vllm" in owners:
        return "vllm", "/metrics has vllm: series" if metrics else "/v1/models owned_by 'vllm'"
    if exposed.props is not None and ("default_generation_settings" in exposed.props
                                      or "total_slots" in exposed.props):
        return "llama.cpp", "/props answers with llama.cpp's generation settings and slots"
    if any(name.startswith("llamacpp:") for name in metrics) or "llamacpp" in owners:
        return "llama.cpp", "/metrics has llamacpp: series" if metrics else "/v1/models owned_by 'llamacpp'"
    # any stdlib server sends that header (the test fakes too): mlx_lm.server also lists models
    # without owned_by (or, with no Hugging Face cache to scan, sends 200 and no body) and answers a
    # path it lacks with a bare "Not Found"
    listed = bool(exposed.models) and owners <= {""}
    if (exposed.server_header.startswith("BaseHTTP") and (listed or exposed.models_unreadable)
            and (exposed.not_found or b"").strip() == b"Not Found"):
        models = "lists models without owned_by" if listed else "answers 200 with no body (no Hugging Face cache)"
        return "mlx-lm", (f"the Server header is Python's http.server ({exposed.server_header!r}), /v1/models "
                          f"{models} and /metrics answers a bare 404 Not Found: mlx_lm.server")
    return UNKNOWN, ("no rule matched: no /health mode, no vllm:/llamacpp:/coopsched_ metrics, no /props, "
                     f"/v1/models owned_by {sorted(owners) or 'absent'}, Server header "
                     f"{exposed.server_header or 'absent'!r}")


def exposed_by(url: str) -> Exposed:
    """Everything `kind_of` looks at, fetched once."""
    models = (client.get_json(url, "/v1/models") or {}).get("data") or []
    try:
        status, body = client.request(url, "GET", "/metrics", timeout_s=5.0)
    except OSError:
        status, body = None, b""
    text = body.decode("utf-8", errors="replace") if status == 200 else ""
    names = frozenset(line.split("{")[0].split()[0] for line in text.splitlines()
                      if line.strip() and not line.startswith("#"))
    header, unreadable = models_answer(url)
    return Exposed(client.get_json(url, "/health") or {}, [m for m in models if isinstance(m, dict)],
                   client.get_json(url, "/props"), names, header, body if status == 404 else None, unreadable)


def models_answer(url: str) -> tuple[str, bool]:
    """/v1/models' Server header, and whether it answered 200 with a body that is not JSON."""
    host, port, prefix = client.split_url(url)
    conn = http.client.HTTPConnection(host, port, timeout=5.0)
    try:
        conn.request("GET", prefix + "/v1/models")
        response = conn.getresponse()
        body = response.read()
    except OSError:
        return "", False
    finally:
        conn.close()
    try:
        json.loads(body)
        unreadable = False
    except ValueError:
        unreadable = response.status == 200
    return response.getheader("Server", "") or "", unreadable


def detect_kind(url: str) -> tuple[str, str]:
    return kind_of(exposed_by(url))

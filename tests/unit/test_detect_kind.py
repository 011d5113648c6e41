"""Which server is this: each detection rule on planted answers, strongest evidence first."""

from __future__ import annotations

import pytest

from harness.calibrate.detect import Exposed, kind_of

COOPSCHED_HEALTH = {"status": "ok", "mode": "slice", "block_size": 4}
LLAMA_PROPS = {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 4}


@pytest.mark.parametrize("exposed, kind, evidence", [
    (Exposed(health=COOPSCHED_HEALTH, metric_names=frozenset({"llamacpp:spec_decode_num_drafts_total"})),
     "coopsched", "/health reports mode='slice'"),
    (Exposed(metric_names=frozenset({"coopsched_ticks_total", "llamacpp:spec_decode_num_drafts_total"})),
     "coopsched", "coopsched_ series"),
    (Exposed(health={"status": "ok"}, metric_names=frozenset({"vllm:num_requests_running"})), "vllm", "vllm:"),
    (Exposed(models=[{"id": "m", "owned_by": "vllm"}]), "vllm", "owned_by 'vllm'"),
    (Exposed(props=LLAMA_PROPS), "llama.cpp", "/props"),
    (Exposed(models=[{"id": "m", "owned_by": "llamacpp"}]), "llama.cpp", "owned_by 'llamacpp'"),
    (Exposed(health={"status": "ok"}, models=[{"id": "m", "owned_by": "coopsched"}]), "coopsched",
     "owned_by 'coopsched'"),
    (Exposed(models=[{"id": "m", "object": "model"}], server_header="BaseHTTP/0.6 Python/3.11.7",
             not_found=b"Not Found"), "mlx-lm", "mlx_lm.server"),
    # a stdlib fake (the tests' own servers) that answers a JSON 404 is not mlx_lm.server
    (Exposed(models=[{"id": "m", "object": "model"}], server_header="BaseHTTP/0.6 Python/3.11.7",
             not_found=b'{"error": {"message": "not found"}}'), "unknown", "no rule matched"),
    (Exposed(models=[{"id": "m", "owned_by": "someone"}], server_header="BaseHTTP/0.6 Python/3.11.7",
             not_found=b"Not Found"), "unknown", "no rule matched"),
    (Exposed(health={"status": "ok"}, models=[{"id": "m"}], server_header="uvicorn"), "unknown", "no rule matched"),
])
def test_each_rule_names_its_kind_and_evidence(exposed, kind, evidence):
    got, why = kind_of(exposed)
    assert got == kind and evidence in why


def test_a_bare_server_is_unknown_and_the_evidence_lists_what_was_looked_for():
    kind, why = kind_of(Exposed())
    assert kind == "unknown"
    assert all(word in why for word in ("/health mode", "metrics", "/props", "owned_by", "Server header"))

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
    # mlx_lm.server with no Hugging Face cache: its /v1/models sends 200, then no body
    (Exposed(server_header="BaseHTTP/0.6 Python/3.11.7", not_found=b"Not Found", models_unreadable=True),
     "mlx-lm", "no Hugging Face cache"),
    (Exposed(server_header="BaseHTTP/0.6 Python/3.11.7", not_found=b"Not Found"), "unknown", "no rule matched"),
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


@pytest.mark.parametrize("server, in_profile, kind, source", [
    pytest.param(None, None, "coopsched", "", id="detected"),
    pytest.param(None, "vllm", "vllm", "the profile's server vllm (detected coopsched", id="the-profiles-kind"),
    pytest.param("unknown", "vllm", "unknown", "--server unknown (detected coopsched", id="server-wins"),
])
def test_which_kind_a_calibration_twins(tmp_path, monkeypatch, server, in_profile, kind, source):
    import argparse
    import json

    from rich.console import Console

    from harness.calibrate import cli, detect

    monkeypatch.setattr(detect, "detect_kind", lambda url: ("coopsched", "/health reports mode='slice'"))
    profile = None
    if in_profile:
        profile = tmp_path / "p.json"
        profile.write_text(json.dumps({"server": in_profile}))
    kept = cli._profile_document(profile).get("server") if profile else None
    got, evidence = cli._server_kind(argparse.Namespace(server=server, profile=profile), kept, "http://x", Console())
    assert got == kind and evidence.startswith(source)

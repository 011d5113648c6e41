"""The server-kind rule over what a server exposes: each rule decides on its own evidence, coopsched
wins over the llama.cpp counter names it also serves, and a server matching none is unknown."""

import pytest

from harness.calibrate.detect import Exposed, classify

COOPSCHED_METRICS = "# TYPE coopsched_spec_rounds_total counter\ncoopsched_spec_rounds_total 3.0\n" \
                    "llamacpp:spec_decode_num_drafts_total 3.0\n"
VLLM_METRICS = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 0.0\n'
LLAMACPP_METRICS = "# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 12\n"
OK = {"status": "ok"}
MLX_MODELS = [{"id": "/models/tiny", "object": "model", "created": 1}]

CASES = [  # id, what the server exposes, kind, a fragment of the evidence
    ("coopsched-health", Exposed(health={"status": "ok", "mode": "slice", "block_size": 4}),
     "coopsched", "/health reports mode slice"),
    ("coopsched-owned-by", Exposed(health=OK, models=[{"id": "m", "owned_by": "coopsched"}]),
     "coopsched", "owned_by coopsched"),
    ("coopsched-metrics-beside-llamacpp-names", Exposed(health=OK, metrics=COOPSCHED_METRICS),
     "coopsched", "coopsched_ series"),
    ("vllm-metrics", Exposed(models=[{"id": "m"}], metrics=VLLM_METRICS), "vllm", "/metrics has vllm: counters"),
    ("vllm-owned-by", Exposed(models=[{"id": "m", "owned_by": "vllm"}]), "vllm", "owned_by vllm"),
    ("llamacpp-props", Exposed(health=OK, props={"default_generation_settings": {"n_ctx": 512}}),
     "llama.cpp", "/props has default_generation_settings"),
    ("llamacpp-owned-by", Exposed(health=OK, models=[{"id": "m", "owned_by": "llamacpp"}]),
     "llama.cpp", "owned_by llamacpp"),
    ("llamacpp-metrics", Exposed(health=OK, metrics=LLAMACPP_METRICS), "llama.cpp", "llamacpp: counters"),
    ("mlx-lm", Exposed(health=OK, models=MLX_MODELS, missing_status=404, missing_body=b"Not Found"),
     "mlx-lm", "bare 404"),
    ("bare-ok-and-a-json-404-is-unknown", Exposed(health=OK, models=MLX_MODELS, missing_status=404,
                                                  missing_body=b'{"error": {"message": "not found"}}'),
     "unknown", "no rule matched"),
    ("nothing-is-unknown", Exposed(), "unknown", "/health keys none"),
    ("a-mode-coopsched-does-not-have-is-not-coopsched", Exposed(health={"mode": "turbo", "block_size": 4}),
     "unknown", "/health keys ['block_size', 'mode']"),
]


@pytest.mark.parametrize(("seen", "kind", "fragment"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_rule(seen, kind, fragment):
    got, evidence = classify(seen)
    assert got == kind and evidence.startswith(f"{kind}: ") and fragment in evidence, evidence

"""The official `openai` client streams and non-streams completions and chat from `coopsched serve`."""

from __future__ import annotations

import pytest

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=30)


def test_models_list(client):
    assert [m.id for m in client.models.list()] == ["coopsched-mock"]


@pytest.mark.parametrize("speculative", [True, False], ids=["speculative", "classic"])
def test_completion_stream_equals_non_stream(client, speculative):
    kwargs = dict(model="coopsched-mock", prompt="The quick brown fox", max_tokens=24, temperature=0,
                  extra_body={"speculative": speculative, "return_token_ids": True})
    whole = client.completions.create(**kwargs)
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 24 and len(whole.choices[0].text) == 24
    assert whole.model_extra["coopsched"]["served_speculatively"] is speculative

    chunks = list(client.completions.create(stream=True, **kwargs))
    assert len(chunks) == 24  # one event per token
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    ids = [t for c in chunks for t in c.choices[0].model_extra["token_ids"]]
    assert ids == whole.choices[0].model_extra["token_ids"]
    assert [c.choices[0].finish_reason for c in chunks] == [None] * 23 + ["length"]


def test_speculative_and_classic_tokens_agree(client):
    """Greedy parity over HTTP: speculation never changes the text."""
    texts = {spec: client.completions.create(model="coopsched-mock", prompt="parity", max_tokens=40,
                                             temperature=0, extra_body={"speculative": spec}).choices[0].text
             for spec in (True, False)}
    assert texts[True] == texts[False]


def test_chat_non_stream(client):
    reply = client.chat.completions.create(
        model="coopsched-mock", messages=[{"role": "user", "content": "hello"}], max_tokens=12, temperature=0)
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and len(choice.message.content) == 12
    assert choice.finish_reason == "length" and reply.usage.completion_tokens == 12


def test_chat_stream_with_usage(client):
    chunks = list(client.chat.completions.create(
        model="coopsched-mock", messages=[{"role": "system", "content": "be brief"},
                                          {"role": "user", "content": "hello"}],
        max_tokens=10, temperature=0, stream=True, stream_options={"include_usage": True}))
    token_chunks = [c for c in chunks if c.choices]
    assert len(token_chunks) == 10
    assert token_chunks[0].choices[0].delta.role == "assistant"
    assert token_chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10


def test_stop_string_is_cut(client):
    base = client.completions.create(model="coopsched-mock", prompt="stop test", max_tokens=30,
                                     temperature=0).choices[0].text
    stop = base[10:12]
    cut = base[:base.index(stop)]
    whole = client.completions.create(model="coopsched-mock", prompt="stop test", max_tokens=30,
                                      temperature=0, stop=[stop])
    assert whole.choices[0].text == cut and whole.choices[0].finish_reason == "stop"
    streamed = list(client.completions.create(model="coopsched-mock", prompt="stop test", max_tokens=30,
                                              temperature=0, stop=[stop], stream=True))
    assert "".join(c.choices[0].text for c in streamed) == cut
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_token_id_prompt_and_seeded_sampling(client):
    kwargs = dict(model="coopsched-mock", prompt=[72, 105, 33], max_tokens=8, temperature=0.8, seed=7)
    first = client.completions.create(**kwargs).choices[0].text
    assert client.completions.create(**kwargs).choices[0].text == first


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="gpt-4", prompt="x", max_tokens=1)
    assert info.value.body["code"] == "model_not_found"

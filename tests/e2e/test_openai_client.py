"""The official `openai` client, sync and async, against `coopsched serve`: models, completions and
chat (streamed, plain, the `chat.completions.stream()` helper), vLLM's min_tokens / ignore_eos
through `extra_body`, and OpenAI's error types."""

from __future__ import annotations

import asyncio

import pytest
from e2e_servers import serve

openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.e2e, pytest.mark.parallel]  # no wall-clock verdict: may run beside another test

CHAT = [{"role": "user", "content": "hello"}]


def make_client(url: str):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def client(server):
    return make_client(server.url)


@pytest.fixture(scope="module")
def eos_client():
    """A mock whose target samples EOS at 30% of positions: plain requests end early."""
    with serve("--decode-ms", "1", "--round-ms", "4", "--eos-rate", "0.3") as served:
        yield make_client(served.url)


def test_models_list(client):
    assert [m.id for m in client.models.list()] == ["coopsched-mock"]


def test_models_retrieve(client):
    model = client.models.retrieve("coopsched-mock")
    assert (model.id, model.object, model.owned_by) == ("coopsched-mock", "model", "coopsched")
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("gpt-4")
    assert info.value.status_code == 404
    assert (info.value.body["type"], info.value.body["code"]) == ("invalid_request_error", "model_not_found")


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
    role, *token_chunks = [c for c in chunks if c.choices]
    assert (role.choices[0].delta.role, role.choices[0].delta.content) == ("assistant", "")  # as OpenAI
    assert len(token_chunks) == 10 and all(c.choices[0].delta.role is None for c in token_chunks)
    assert all(len(c.choices[0].delta.content) == 1 for c in token_chunks)
    assert token_chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10


def test_chat_stream_helper_cuts_at_a_stop_string(client):
    """`client.chat.completions.stream()` accumulates our chunks into the same reply as a plain call."""
    kwargs = dict(model="coopsched-mock", messages=CHAT, max_tokens=30, temperature=0)
    base = client.chat.completions.create(**kwargs).choices[0].message.content
    stop = base[12:14]
    with client.chat.completions.stream(stop=[stop], **kwargs) as stream:
        deltas = [event.delta for event in stream if event.type == "content.delta"]
        final = stream.get_final_completion()
    cut = base[:base.index(stop)]
    assert "".join(deltas) == cut
    assert final.choices[0].message.content == cut and final.choices[0].message.role == "assistant"
    assert final.choices[0].finish_reason == "stop"


def test_async_client(server):
    """AsyncOpenAI: models, then a chat and a completion streamed concurrently, speculative and classic."""
    async def main():
        async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0,
                                      timeout=30) as client:
            assert [m.id async for m in client.models.list()] == ["coopsched-mock"]
            assert (await client.models.retrieve("coopsched-mock")).id == "coopsched-mock"

            async def chat(speculative: bool) -> str:
                stream = await client.chat.completions.create(
                    model="coopsched-mock", messages=CHAT, max_tokens=20, temperature=0, stream=True,
                    extra_body={"speculative": speculative})
                return "".join([c.choices[0].delta.content or "" async for c in stream])

            async def complete(speculative: bool) -> str:
                stream = await client.completions.create(
                    model="coopsched-mock", prompt="async", max_tokens=20, temperature=0, stream=True,
                    extra_body={"speculative": speculative})
                return "".join([c.choices[0].text async for c in stream])

            return await asyncio.gather(chat(True), chat(False), complete(True), complete(False))

    chat_spec, chat_classic, text_spec, text_classic = asyncio.run(main())
    assert chat_spec == chat_classic and len(chat_spec) == 20
    assert text_spec == text_classic and len(text_spec) == 20


def early_eos_prompts(client, num: int = 3) -> list[tuple[str, int]]:
    """Prompts whose plain greedy reply ends on EOS within its first 8 tokens, with that length."""
    out = []
    for i in range(200):
        reply = client.completions.create(model="coopsched-mock", prompt=f"eos probe {i}", max_tokens=40,
                                          temperature=0)
        if reply.choices[0].finish_reason == "stop" and reply.usage.completion_tokens < 8:
            out.append((f"eos probe {i}", reply.usage.completion_tokens))
        if len(out) == num:
            return out
    raise AssertionError("no prompt ends early at --eos-rate 0.3")


def test_min_tokens_and_ignore_eos_in_extra_body(eos_client):
    """EOS waits for min_tokens, never comes with ignore_eos; speculative and classic replies are equal."""
    for prompt, plain_len in early_eos_prompts(eos_client):
        for extra in ({"min_tokens": 24}, {"ignore_eos": True}, {"min_tokens": plain_len}):
            spec, classic = [eos_client.completions.create(
                model="coopsched-mock", prompt=prompt, max_tokens=40, temperature=0,
                extra_body={"speculative": speculative, **extra}) for speculative in (True, False)]
            assert spec.choices[0].text == classic.choices[0].text
            n, reason = spec.usage.completion_tokens, spec.choices[0].finish_reason
            if extra.get("ignore_eos"):
                assert (n, reason) == (40, "length")
            elif extra["min_tokens"] == plain_len:  # EOS may come at index plain_len: the plain reply
                assert (n, reason) == (plain_len, "stop")
            else:
                assert n >= 24
        chunks = list(eos_client.chat.completions.create(
            model="coopsched-mock", messages=[{"role": "user", "content": prompt}], max_tokens=16, temperature=0,
            stream=True, extra_body={"ignore_eos": True, "min_tokens": 16}))
        assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) == 16
        assert chunks[-1].choices[0].finish_reason == "length"


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
    assert (info.value.body["type"], info.value.body["code"]) == ("invalid_request_error", "model_not_found")
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-4", messages=CHAT, max_tokens=1)
    assert info.value.body["type"] == "invalid_request_error"


def test_min_tokens_over_max_tokens_is_a_bad_request(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="coopsched-mock", prompt="x", max_tokens=4, extra_body={"min_tokens": 9})
    body = info.value.body
    assert (body["type"], body["param"], body["code"]) == ("invalid_request_error", "min_tokens", "invalid_value")
    assert "9" in body["message"] and "4" in body["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_string_before_min_tokens_stays_in_the_text(client, stream):
    """vLLM's rule: a stop string inside the first min_tokens tokens neither ends the request nor
    cuts its text; the next one after min_tokens ends it and is cut."""
    base = client.completions.create(model="coopsched-mock", prompt="stop test", max_tokens=40,
                                     temperature=0).choices[0].text
    stop = base[3:5]
    later = base.find(stop, 5 + 20)
    kwargs = dict(model="coopsched-mock", prompt="stop test", max_tokens=40, temperature=0, stop=[stop],
                  extra_body={"min_tokens": 20})
    if stream:
        chunks = list(client.completions.create(**kwargs, stream=True))
        text, reason = "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason
    else:
        choice = client.completions.create(**kwargs).choices[0]
        text, reason = choice.text, choice.finish_reason
    if later == -1:  # no later match: the whole budget, the early stop string included
        assert (text, reason) == (base, "length")
    else:
        assert (text, reason) == (base[:later], "stop")
    assert text.startswith(base[:5])

"""The FastAPI app: parse, submit, stream. Thin by design: the scheduler lives in the engine thread.

`create_app(host)` serves one EngineHost: OpenAI completions and chat (SSE, one
event per token; a chat stream opens with OpenAI's role chunk), /v1/models and
/v1/models/{id}, /health (with the mock's cost terms) and /metrics. Every error
body is OpenAI's. A client that disconnects cancels its request.
"""

from __future__ import annotations

import asyncio
import gc
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Path, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from coopsched.core.request import RequestError, SamplingParams

from . import openapi, protocol
from .protocol import ApiError, CompletionParams, Envelope
from .runtime import Delivery, EngineHost, Live, ModelCallFailed, QueueFull
from .stream import TextStream

MAX_BODY_BYTES = 1 << 20


def create_app(host: EngineHost) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        gc.freeze()  # imports and the model are long-lived: keep them out of every GC pass
        host.start()
        try:
            yield
        finally:
            host.stop()

    app = FastAPI(title="coopsched", lifespan=lifespan)
    app.state.host = host

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:  # OpenAI's words for a route that does not exist
            error = ApiError(404, f"Invalid URL ({request.method} {request.url.path})", code="not_found")
        else:
            error = ApiError(exc.status_code, str(exc.detail))
        return JSONResponse(error.body(), status_code=exc.status_code, headers=exc.headers)

    context, names = host.config.slot_tokens, [host.model.name, *host.model.aliases]
    completion_schema = openapi.completion_request(host.model.vocab_size, context, names)

    @app.post("/v1/completions", openapi_extra=openapi.operation(completion_schema))
    async def completions(request: Request):
        return await _complete(host, request, is_chat=False)

    @app.post("/v1/chat/completions", openapi_extra=openapi.operation(openapi.chat_request(context, names)))
    async def chat_completions(request: Request):
        return await _complete(host, request, is_chat=True)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [_model_card(host)]}

    # `:path` so that ids with a slash (an alias that is a directory) reach the handler, as vLLM allows
    @app.get("/v1/models/{model_id:path}", responses=openapi.model_responses())
    async def model(model_id: str = Path(examples=names)):  # examples: a fuzzer also tries the served ids
        if not host.model.answers_to(model_id):
            raise _unknown_model(host, model_id)
        return _model_card(host)

    @app.get("/health")
    async def health():
        body = {"status": "ok" if host.is_healthy else "failed", "model": host.model.name,
                "mode": host.config.mode, "block_size": host.config.block_size,
                "grant_rounds": host.config.grant_rounds, "backlog_cap": host.config.backlog_cap,
                "max_batch_size": host.config.max_batch_size,
                "prefill_chunk_tokens": host.config.prefill_chunk_tokens,
                "prefill_grant_interval": host.config.prefill_grant_interval, "mixed_step": host.config.mixed_step,
                "context_tokens": host.config.slot_tokens, "max_queue": host.max_queue,
                "costs": host.model.costs}
        if host.failure is not None:
            body["error"] = repr(host.failure)
        return JSONResponse(body, status_code=200 if host.is_healthy else 503)

    @app.get("/metrics", response_class=PlainTextResponse)  # documents the Prometheus text type
    async def metrics():
        return Response(host.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app


def _model_card(host: EngineHost) -> dict:
    """OpenAI's model object, plus vLLM's `max_model_len` (load tools size requests by it)."""
    return {"id": host.model.name, "object": "model", "created": 0, "owned_by": "coopsched",
            "max_model_len": host.config.slot_tokens}


def _unknown_model(host: EngineHost, name: str) -> ApiError:
    # OpenAI answers an unknown model with 404, type invalid_request_error, code model_not_found
    return ApiError(404, f"the model {name!r} does not exist; this server serves {host.model.name!r}",
                    param="model", code="model_not_found")


async def _read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise ApiError(413, f"the request body is {declared} bytes; the limit is {MAX_BODY_BYTES}",
                       code="request_too_large")
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        raise ApiError(413, f"the request body is {len(body)} bytes; the limit is {MAX_BODY_BYTES}",
                       code="request_too_large")
    return body


async def _complete(host: EngineHost, request: Request, *, is_chat: bool):
    model = host.model
    body = protocol.parse_json(await _read_body(request))
    params = protocol.parse_request(body, is_chat=is_chat, encode=model.encode, encode_chat=model.encode_chat,
                                    vocab_size=model.vocab_size, context_tokens=host.config.slot_tokens)
    if params.model is not None and not model.answers_to(params.model):
        raise _unknown_model(host, params.model)
    if not host.is_healthy:
        raise ApiError(503, f"the engine has stopped: {host.failure!r}", code="engine_failed")
    seq_id = host.new_id("chatcmpl" if is_chat else "cmpl")
    try:
        live = host.submit(seq_id, params.prompt_token_ids, params.max_tokens, params.stop, params.speculative,
                           SamplingParams(params.temperature, params.seed, params.min_tokens, params.ignore_eos))
    except QueueFull as exc:
        raise ApiError(429, str(exc), code="queue_full") from exc
    except RequestError as exc:
        raise ApiError(400, str(exc), code="invalid_value") from exc
    envelope = Envelope(seq_id, model.name, is_chat)
    if params.stream:
        return StreamingResponse(_stream(host, live, params, envelope), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    return await _respond(host, request, live, params, envelope)


def _error_of(delivery: Delivery) -> ApiError:
    exc = delivery.error
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, RequestError):
        return ApiError(400, str(exc), code="invalid_value")
    if isinstance(exc, ModelCallFailed):
        return ApiError(500, str(exc), code="model_error")
    return ApiError(500, f"the engine failed: {exc!r}", code="engine_failed")


def _extension(delivery: Delivery) -> dict:
    """llama.cpp's `timings`, and (namespaced) how the request was served and its BurstFinalized record."""
    return {"timings": delivery.timings,
            "coopsched": {"served_speculatively": delivery.served_speculatively, "burst": delivery.burst}}


async def _stream(host: EngineHost, live: Live, params: CompletionParams, envelope: Envelope):
    """SSE: one event per token (a round's tokens in one write), finish_reason on the last, [DONE]."""
    text = TextStream(host.model.detokenize, params.stop)
    with_ids = params.return_token_ids
    usage_field = {"usage": None} if params.include_usage else {}
    num_tokens, needs_role, is_done = 0, envelope.is_chat, False
    # the engine's tick end on the client's clock: what the HTTP/SSE layer adds is arrival - tick end
    with_ticks, tick_end_ns = params.return_tick_times, lambda d: host.clock.to_ns(d.time_ms)
    try:
        while not is_done:
            delivery: Delivery = await live.queue.get()
            if delivery.error is not None:
                yield protocol.sse(_error_of(delivery).body()) + protocol.sse("[DONE]")
                is_done = True
                break
            reason = delivery.finish_reason
            deltas = text.push(delivery.token_ids)
            tail = text.finish(reason) if reason is not None else ""
            events = []
            if needs_role:  # OpenAI's first chat chunk: the role and empty content, with the first token
                events.append(protocol.sse(envelope.chunk(envelope.role_choice(with_ids), **usage_field)))
                needs_role = False
            for i, (token, delta) in enumerate(zip(delivery.token_ids, deltas)):
                is_last = reason is not None and i == len(deltas) - 1
                choice = envelope.token_choice(delta + (tail if is_last else ""), [token] if with_ids else None,
                                               reason if is_last else None)
                extra = _extension(delivery) if is_last else {}
                if with_ticks:
                    stamps = {"tick_end_ns": tick_end_ns(delivery), "sent_ns": time.perf_counter_ns()}
                    extra = {**extra, "coopsched": {**extra.get("coopsched", {}), **stamps}}
                events.append(protocol.sse(envelope.chunk(choice, **usage_field, **extra)))
            num_tokens += len(delivery.token_ids)
            if reason is not None:
                if not delivery.token_ids:  # EOS or cancel: a final event of its own
                    choice = envelope.token_choice(tail, [] if with_ids else None, reason)
                    events.append(protocol.sse(envelope.chunk(choice, **usage_field, **_extension(delivery))))
                if params.include_usage:
                    events.append(protocol.sse(envelope.chunk(
                        None, usage=protocol.usage(len(params.prompt_token_ids), num_tokens),
                        timings=delivery.timings)))
                events.append(protocol.sse("[DONE]"))
                is_done = True
            yield "".join(events)
    finally:
        if not is_done:  # the client disconnected (or the server is stopping)
            host.cancel(live.request.id)


async def _respond(host: EngineHost, request: Request, live: Live, params: CompletionParams,
                   envelope: Envelope):
    collector = asyncio.ensure_future(_collect(live))
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({collector, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not collector.done():
            collector.cancel()
            host.cancel(live.request.id)
    if not collector.done() or collector.cancelled():
        return Response(status_code=499)  # nobody is listening
    token_ids, last = collector.result()
    if last.error is not None:
        raise _error_of(last)
    text = TextStream(host.model.detokenize, params.stop)
    text.push(token_ids)
    text.finish(last.finish_reason)
    with_ids = params.return_token_ids
    return envelope.final(text.text, last.finish_reason,
                          protocol.usage(len(params.prompt_token_ids), len(token_ids)),
                          token_ids if with_ids else None,
                          params.prompt_token_ids if with_ids else None, **_extension(last))


async def _collect(live: Live) -> tuple[list[int], Delivery]:
    token_ids: list[int] = []
    while True:
        delivery: Delivery = await live.queue.get()
        token_ids += delivery.token_ids
        if delivery.error is not None or delivery.finish_reason is not None:
            return token_ids, delivery


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass

"""The HTTP API: the OpenAI API's completions and chat completions, streamed or not, as vLLM's
and llama.cpp's servers implement them; ``/v1/models``, ``/health``, ``/metrics``.

Starlette (the ASGI toolkit FastAPI and vLLM's OpenAI server are built on; small, typed,
maintained, with streaming responses) served by uvicorn. The request bodies are checked here
by hand against the API's shapes, each bad field a 400 naming it (``param``), so that the
error bodies are the API's own and no schema library is needed.

* ``POST /v1/completions``: ``prompt`` (a string, or token ids), ``max_tokens`` (default 16,
  as the OpenAI API's), ``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop``, ``stream``,
  ``stream_options.include_usage``; ``n`` must be 1; ``logprobs``, ``echo`` and
  ``suffix`` are refused.
* ``POST /v1/chat/completions``: ``messages`` through the chat template
  (:mod:`ringkv.serve.template`), ``max_tokens`` or ``max_completion_tokens`` (default
  :data:`CHAT_MAX_TOKENS`, within the token memory), the same sampling fields.
* Both accept ``session_id`` (a string, an extension: ``extra_body`` in the ``openai``
  client) to pin a conversation (:mod:`ringkv.serve.engine`).
* Streaming: server-sent events ``data: {json}`` (``text_completion`` /
  ``chat.completion.chunk`` objects; a chat stream begins with the ``role`` delta and ends
  with an empty delta carrying ``finish_reason``), then with ``include_usage`` a last chunk
  with ``"choices": []`` and the ``usage``, then ``data: [DONE]``. An error after the stream
  began is one ``data: {"error": {...}}`` event before ``[DONE]`` (what vLLM sends; the
  ``openai`` client raises it as an ``APIError``).
* ``usage``: ``prompt_tokens``, ``completion_tokens``, ``total_tokens`` and
  ``prompt_tokens_details.cached_tokens``: the prompt tokens this request did not compute:
  imported from the device's store, or still in its rings from the conversation's previous
  turn.
* The response header ``X-RingKV-Device`` names the device that served the request (for a
  stream: the one it was sent to first).
* API keys (``ringkv serve --api-key``): with keys given, every route under ``/v1`` needs
  ``Authorization: Bearer KEY`` with one of them (what the ``openai`` client sends from its
  ``api_key``), else 401 ``invalid_api_key`` with ``WWW-Authenticate: Bearer``; ``/health``
  and ``/metrics`` stay open (for load balancers and Prometheus), as vLLM's do. The check is
  an ASGI middleware ahead of the routes, so that no route can forget it, and it compares in
  constant time (``hmac.compare_digest``) against every key.
* Errors: ``{"error": {"message", "type", "param", "code"}}`` with the status of the
  :class:`~ringkv.host.errors.RingKVError` (400 bad request, 401 no or another API key, 404
  unknown model, 429 every device's queue full, 503 no device ready or the device failed);
  anything else is a 500 with a one-line body (the traceback goes to the log only).
"""

import asyncio
import hmac
import json
import logging
import time
import uuid

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ringkv.host.errors import NotFound, RingKVError, Unauthorized, UsageError
from ringkv.host.model.sampling import SamplingParams

from .engine import Cancelled, Job
from .template import chat_prompt, completion_prompt

__all__ = ["create_app", "error_body", "ApiKeyGate", "CHAT_MAX_TOKENS",
           "COMPLETION_MAX_TOKENS"]

log = logging.getLogger(__name__)

#: ``max_tokens`` when a request gives none (the OpenAI API's 16 for completions; a chat reply
#: stops at the end of its message, this bounds one that does not)
COMPLETION_MAX_TOKENS = 16
CHAT_MAX_TOKENS = 256


def error_body(message, *, type_="invalid_request_error", param=None, code=None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _error_response(exc: RingKVError) -> JSONResponse:
    headers = {"Retry-After": "1"} if exc.http_status in (429, 503) else None
    return JSONResponse(error_body(exc.one_line(), type_=exc.api_type, param=exc.param,
                                   code=exc.api_code), status_code=exc.http_status,
                        headers=headers)


class ApiKeyGate:
    """ASGI middleware: HTTP requests under ``/v1`` need ``Authorization: Bearer KEY`` with one
    of ``keys`` (strings, or a dict of key -> tenant); any other is answered 401
    (:class:`Unauthorized`) before it reaches a route, and counted in ``metrics.requests``
    (when given) under its endpoint. Every key is compared, in constant time, whatever matched
    first. The matching key's tenant (None for none) goes to the route as
    ``scope["ringkv.tenant"]``."""

    #: the ``endpoint`` label of a refused request (any other path: ``other``, so that a
    #: client cannot grow the metric's label set)
    ENDPOINTS = {"/v1/completions": "completions", "/v1/chat/completions": "chat",
                 "/v1/models": "models"}

    def __init__(self, app, keys, metrics=None):
        self.app = app
        tenants = keys if isinstance(keys, dict) else dict.fromkeys(keys)
        self.keys = [(k.encode("ascii"), t) for k, t in tenants.items()]
        if not self.keys:
            raise ValueError("ApiKeyGate needs at least one key")
        self.metrics = metrics

    def _refusal(self, scope) -> Unauthorized | None:
        """None for a request that may pass (``scope["ringkv.tenant"]`` set for ``/v1``), else
        the refusal."""
        if scope["type"] != "http" or not (scope["path"] == "/v1"
                                           or scope["path"].startswith("/v1/")):
            return None
        given = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer":
                    given = token.strip()
                break
        if given is None:
            return Unauthorized("no API key: this server requires one, sent as Bearer auth "
                                "(Authorization: Bearer KEY; the openai client's api_key)")
        matched, tenant = False, None
        for key, owner in self.keys:
            if hmac.compare_digest(given, key):
                matched, tenant = True, owner
        if not matched:
            return Unauthorized("incorrect API key provided")
        scope["ringkv.tenant"] = tenant
        return None

    async def __call__(self, scope, receive, send):
        refusal = self._refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        if self.metrics is not None:
            endpoint = self.ENDPOINTS.get(scope["path"], "other")
            self.metrics.requests.labels(endpoint, "401").inc()
        response = _error_response(refusal)
        response.headers["WWW-Authenticate"] = 'Bearer realm="ringkv"'
        await response(scope, receive, send)


def _dumps(obj) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


class _Api:
    def __init__(self, engine, model_name: str, fingerprint: str, tenant=None):
        self.engine, self.model_name, self.fingerprint = engine, model_name, fingerprint
        self.tenant = tenant
        self.metrics = engine.metrics
        self.created = int(time.time())
        self.max_context = engine.config.max_tokens

    # -- request checks ------------------------------------------------------------------------
    async def _body(self, request: Request) -> dict:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UsageError(f"the request body is not valid JSON ({e})") from None
        if not isinstance(body, dict):
            raise UsageError("the request body must be a JSON object")
        return body

    def _check_model(self, body):
        model = body.get("model", self.model_name)
        if model != self.model_name:
            raise NotFound(f"The model `{model}` does not exist; this server serves "
                           f"`{self.model_name}` (GET /v1/models)", param="model")

    def _params(self, body, prompt_len: int, chat: bool) -> SamplingParams:
        if body.get("n", 1) not in (1, None):
            raise UsageError("n must be 1 (one choice per request)", param="n")
        for name in ("logprobs", "echo", "suffix", "top_logprobs", "tools", "functions"):
            if body.get(name) not in (None, False) and not (name == "logprobs"
                                                            and body[name] == 0):
                raise UsageError(f"{name} is not supported by this server", param=name)
        limit = self.max_context - prompt_len + 1
        where = "messages" if chat else "prompt"
        if limit < 1:
            raise UsageError(f"This model's maximum context length is {self.max_context} "
                             f"tokens (the device's token memory); the {where} has "
                             f"{prompt_len}", param=where)
        key = "max_tokens"
        if chat and body.get("max_completion_tokens") is not None:
            key = "max_completion_tokens"
        max_tokens = body.get(key)
        if max_tokens is None:
            max_tokens = min(CHAT_MAX_TOKENS if chat else COMPLETION_MAX_TOKENS, limit)
        params = {}
        for name, default in (("temperature", 1.0), ("top_p", 1.0), ("top_k", 0),
                              ("seed", None), ("stop", ())):
            value = body.get(name)
            params[name] = default if value is None else value
        try:
            out = SamplingParams(max_tokens=max_tokens, **params)
        except UsageError as e:
            if e.param == "max_tokens":
                e.param = key
            raise
        if out.max_tokens > limit:
            raise UsageError(f"This model's maximum context length is {self.max_context} "
                             f"tokens; the {where} has {prompt_len} and {key} asks for "
                             f"{out.max_tokens} more (at most {limit})", param=key)
        return out

    def _stream_flags(self, body):
        stream = body.get("stream", False)
        if stream not in (True, False, None):
            raise UsageError(f"stream must be a boolean, not {stream!r}", param="stream")
        options = body.get("stream_options")
        if options is not None:
            if not stream:
                raise UsageError("stream_options is only allowed with stream: true",
                                 param="stream_options")
            if not isinstance(options, dict):
                raise UsageError("stream_options must be an object", param="stream_options")
        usage = bool((options or {}).get("include_usage", False))
        return bool(stream), usage

    def _session(self, body):
        sid = body.get("session_id")
        if sid is not None and (not isinstance(sid, str) or not sid or len(sid) > 256):
            raise UsageError("session_id must be a non-empty string (at most 256 characters)",
                             param="session_id")
        return sid

    # -- the generation endpoints ---------------------------------------------------------------
    async def completions(self, request: Request):
        return await self._generate(request, chat=False)

    async def chat(self, request: Request):
        return await self._generate(request, chat=True)

    async def _generate(self, request: Request, chat: bool):
        endpoint = "chat" if chat else "completions"
        try:
            body = await self._body(request)
            # the request has arrived (its time from here is the server's: how fast the
            # client sends its body is not)
            t0 = time.perf_counter()
            self._check_model(body)
            prompt = chat_prompt(body.get("messages")) if chat else \
                completion_prompt(body.get("prompt"))
            params = self._params(body, len(prompt.tokens), chat)
            stream, include_usage = self._stream_flags(body)
            session = self._session(body)
        except RingKVError as e:
            self.metrics.requests.labels(endpoint, str(e.http_status)).inc()
            return _error_response(e)
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def sink(kind, value):
            loop.call_soon_threadsafe(events.put_nowait, (kind, value))

        tenant = request.scope.get("ringkv.tenant")
        job = Job(prompt, params, sink, chat=chat, session=session, received=t0,
                  tenant=self.tenant if tenant is None else tenant)
        try:
            worker = self.engine.submit(job)
        except RingKVError as e:
            self.metrics.requests.labels(endpoint, str(e.http_status)).inc()
            return _error_response(e)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        head = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": self.model_name,
                "system_fingerprint": self.fingerprint}
        if stream:
            return StreamingResponse(
                self._sse(job, events, head, chat, include_usage, endpoint, t0),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no",
                         "X-RingKV-Device": worker.name})
        try:
            while True:
                kind, value = await events.get()
                if kind == "done":
                    break
                if kind == "error":
                    raise value
        except RingKVError as e:
            self.metrics.requests.labels(endpoint, str(e.http_status)).inc()
            return _error_response(e)
        except BaseException:
            job.cancelled.set()
            raise
        result = value
        self._finish(endpoint, result, t0)
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": result.text},
                      "logprobs": None, "finish_reason": result.finish_reason}
        else:
            choice = {"index": 0, "text": result.text, "logprobs": None,
                      "finish_reason": result.finish_reason}
        body = dict(head, object="chat.completion" if chat else "text_completion",
                    choices=[choice], usage=self._usage(result))
        return JSONResponse(body, headers={"X-RingKV-Device": result.device})

    def _usage(self, result) -> dict:
        return {"prompt_tokens": result.prompt_tokens,
                "completion_tokens": len(result.tokens),
                "total_tokens": result.prompt_tokens + len(result.tokens),
                "prompt_tokens_details": {"cached_tokens": result.cached_tokens}}

    def _finish(self, endpoint, result, t0):
        m = self.metrics
        total = time.perf_counter() - t0
        m.requests.labels(endpoint, "200").inc()
        m.prompt_tokens.inc(result.prompt_tokens)
        m.generation_tokens.inc(len(result.tokens))
        m.duration.observe(total)
        m.overhead.observe(max(0.0, total - result.scheduler_s - result.queue_s))
        if log.isEnabledFor(logging.DEBUG) and result.times.get("started") is not None:
            t = dict(result.times, finished=t0 + total)
            steps = ("received", "routed", "picked", "got", "started", "ended", "answered",
                     "finished")
            log.debug("%s: %s", result.device, ", ".join(
                f"{a}->{b} {(t[b] - t[a]) * 1e3:.2f} ms" for a, b in zip(steps, steps[1:])))

    async def _sse(self, job, events, head, chat, include_usage, endpoint, t0):
        def chunk(delta_or_text, finish=None):
            if chat:
                choice = {"index": 0, "delta": delta_or_text, "logprobs": None,
                          "finish_reason": finish}
            else:
                choice = {"index": 0, "text": delta_or_text, "logprobs": None,
                          "finish_reason": finish}
            obj = dict(head, choices=[choice])
            if include_usage:
                obj["usage"] = None
            return f"data: {_dumps(obj)}\n\n"

        done = False
        try:
            if chat:
                yield chunk({"role": "assistant", "content": ""})
            while True:
                kind, value = await events.get()
                if kind == "token":
                    if value:
                        yield chunk({"content": value} if chat else value)
                elif kind == "done":
                    result = value
                    yield chunk({} if chat else "", result.finish_reason)
                    if include_usage:
                        last = dict(head, choices=[], usage=self._usage(result))
                        yield f"data: {_dumps(last)}\n\n"
                    self._finish(endpoint, result, t0)
                    break
                else:
                    exc = value
                    if isinstance(exc, Cancelled):
                        break
                    status = getattr(exc, "http_status", 500)
                    self.metrics.requests.labels(endpoint, str(status)).inc()
                    body = error_body(exc.one_line() if isinstance(exc, RingKVError)
                                      else "internal error", type_=getattr(
                                          exc, "api_type", "server_error"),
                                      param=getattr(exc, "param", None),
                                      code=getattr(exc, "api_code", None))
                    yield f"data: {_dumps(body)}\n\n"
                    break
            yield "data: [DONE]\n\n"
            done = True
        finally:
            if not done:
                job.cancelled.set()        # the client went away: stop generating

    # -- the rest -------------------------------------------------------------------------------
    async def models(self, request: Request):
        return JSONResponse({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": self.created,
             "owned_by": "ringkv", "max_model_len": self.max_context}]})

    async def health(self, request: Request):
        devices = [{"name": w.name, "kind": w.handle.kind, "sealed": w.handle.sealed,
                    "state": w.state, "queue_depth": w.load, "records": len(w.index),
                    "recoveries": w.recoveries,
                    # continuous batching: how many requests it runs at once (1: one at a
                    # time, as a board holding one conversation), how many it holds resident
                    "batching": w.batch > 1, "max_batch": w.batch,
                    "resident_limit": w.info.get("resident", 1),
                    "resident": len(w.hot)} for w in self.engine.workers]
        ok = any(d["state"] == "ready" for d in devices)
        return JSONResponse({"status": "ok" if ok else "unavailable", "devices": devices},
                            status_code=200 if ok else 503)

    async def metrics_text(self, request: Request):
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
        return Response(generate_latest(self.metrics.registry),
                        media_type=CONTENT_TYPE_LATEST)


async def _http_error(request, exc: HTTPException):
    type_ = "invalid_request_error" if exc.status_code < 500 else "server_error"
    return JSONResponse(error_body(f"{exc.detail}: {request.method} {request.url.path}",
                                   type_=type_), status_code=exc.status_code)


async def _internal_error(request, exc: Exception):
    log.exception("internal error serving %s %s", request.method, request.url.path)
    return JSONResponse(error_body("internal server error (see the server's log)",
                                   type_="server_error"), status_code=500)


def create_app(engine, *, model_name: str, fingerprint: str = "", manage_engine=True,
               api_keys=(), tenant=None):
    """The ASGI application over ``engine`` (started and stopped with the application when
    ``manage_engine``); with ``api_keys`` (keys, or key -> tenant), ``/v1`` needs one of them
    (:class:`ApiKeyGate`). A request's tenant is its key's, else ``tenant``."""
    api = _Api(engine, model_name, fingerprint, tenant)
    import contextlib

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if manage_engine:
            engine.start()
        try:
            yield
        finally:
            if manage_engine:
                await asyncio.get_running_loop().run_in_executor(None, engine.stop)

    routes = [Route("/v1/completions", api.completions, methods=["POST"]),
              Route("/v1/chat/completions", api.chat, methods=["POST"]),
              Route("/v1/models", api.models, methods=["GET"]),
              Route("/health", api.health, methods=["GET"]),
              Route("/metrics", api.metrics_text, methods=["GET"])]
    middleware = [Middleware(ApiKeyGate, keys=api_keys, metrics=engine.metrics)] \
        if api_keys else []
    return Starlette(routes=routes, lifespan=lifespan, middleware=middleware,
                     exception_handlers={HTTPException: _http_error, Exception: _internal_error})

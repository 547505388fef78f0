"""The HTTP API: the OpenAI API's completions and chat completions, streamed or not, as vLLM's
and llama.cpp's servers implement them; vLLM's tokenizer routes; ``/v1/models``, ``/health``,
``/metrics``.

Starlette (the ASGI toolkit FastAPI and vLLM's OpenAI server are built on; small, typed,
maintained, with streaming responses) served by uvicorn. The request bodies are checked here
by hand against the API's shapes, each bad field a 400 naming it (``param``), so that the
error bodies are the API's own and no schema library is needed.

* ``POST /v1/completions``: ``prompt`` (a string, token ids, or a list of either: a choice
  each), ``max_tokens`` (default 16, as the OpenAI API's; 0 with ``echo``), ``temperature``,
  ``top_p``, ``top_k``, ``seed``, ``stop``, ``min_tokens``, ``ignore_eos``, ``n``,
  ``logprobs`` (0..20, the legacy shape), ``echo``, ``stream``, ``stream_options``
  (``include_usage``, ``continuous_usage_stats``).
* ``POST /v1/chat/completions``: ``messages`` through the chat template
  (:mod:`ringkv.serve.template`), ``max_tokens`` or ``max_completion_tokens`` (default
  :data:`~ringkv.serve.request.CHAT_MAX_TOKENS`, within the token memory), the same sampling
  fields, ``n``, ``logprobs`` and ``top_logprobs`` (the ``content`` shape).
* Every other field of the OpenAI API or vLLM's server is accepted at its neutral value only,
  or refused: a 400 naming it (:mod:`ringkv.serve.request`); the ``logprobs`` shapes are
  :mod:`ringkv.serve.response`'s.
* Several choices (``n``, a list of prompts): a :class:`~ringkv.serve.engine.Job` each, through
  the router like any request; choice ``i * n + j`` is prompt ``i``'s sample ``j`` (seeded
  ``seed + j``); a stream interleaves their chunks, each naming its ``index``.
* ``POST /tokenize``, ``POST /detokenize``, ``GET /tokenizer_info``: vLLM's tokenizer routes
  over the byte vocabulary (:mod:`ringkv.serve.tokenize`).
* Both accept ``session_id`` (a string, an extension: ``extra_body`` in the ``openai``
  client) to pin a conversation (:mod:`ringkv.serve.engine`).
* Streaming: server-sent events ``data: {json}`` (``text_completion`` /
  ``chat.completion.chunk`` objects; a chat stream begins with the ``role`` delta of each
  choice and ends each with an empty delta carrying ``finish_reason``), then with
  ``include_usage`` a last chunk with ``"choices": []`` and the ``usage`` (with
  ``continuous_usage_stats`` every chunk carries its choice's usage so far), then ``data:
  [DONE]``. An error after the stream began is one ``data: {"error": {...}}`` event before
  ``[DONE]`` (what vLLM sends; the ``openai`` client raises it as an ``APIError``).
* ``usage``: ``prompt_tokens`` (each prompt once, whatever ``n``), ``completion_tokens``,
  ``total_tokens`` and ``prompt_tokens_details.cached_tokens``: the prompt tokens this request
  did not compute: imported from the device's store, or still in its rings from the
  conversation's previous turn.
* The response header ``X-RingKV-Device`` names the devices that served the request's choices
  (for a stream: those they were sent to first).
* API keys (``ringkv serve --api-key``): with keys given, every route under ``/v1`` and the
  tokenizer's routes (which vLLM leaves open) need ``Authorization: Bearer KEY`` with one of
  them (what the ``openai`` client sends from its ``api_key``), else 401 ``invalid_api_key``
  with ``WWW-Authenticate: Bearer``; ``/health`` and ``/metrics`` stay open (for load
  balancers and Prometheus), as vLLM's do. The check is an ASGI middleware ahead of the
  routes, so that no route can forget it, and it compares in constant time
  (``hmac.compare_digest``) against every key.
* Many instances (``--valkey``, :mod:`ringkv.serve.cluster`): a request of one prompt whose
  prefix another live instance holds much more of (``Engine.remote``) is forwarded there as
  it came and its answer streamed through (``X-RingKV-Instance`` names that instance); one
  that arrives forwarded (``X-RingKV-Forwarded``) is never forwarded again; an instance that
  does not answer, or answers 429/503, leaves the request to be served here. When that
  instance is full (or ``--cluster-move copy``) its record is copied here instead (``GET
  /v1/ringkv/record``: the card format, a sealed record only to its own tenant).
* Errors: ``{"error": {"message", "type", "param", "code"}}`` with the status of the
  :class:`~ringkv.host.errors.RingKVError` (400 bad request, 401 no or another API key, 404
  unknown model, 429 every device's queue full, 503 no device ready or the device failed);
  anything else is a 500 with a one-line body (the traceback goes to the log only).
"""

import asyncio
import collections
import hmac
import json
import logging
import threading
import time
import uuid
import weakref

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ringkv.host.errors import NotFound, RingKVError, Unauthorized, UsageError
from ringkv.host.model.vocab import text_offsets, tokenizer_config

from .engine import Cancelled, Job
from .request import CHAT_MAX_TOKENS, COMPLETION_MAX_TOKENS, choice_params, parse
from .response import LegacyOffsets, chat_entry, chat_logprobs, legacy_logprobs
from .tokenize import detokenize_body, tokenize_body

__all__ = ["create_app", "error_body", "ApiKeyGate", "CHAT_MAX_TOKENS",
           "COMPLETION_MAX_TOKENS"]

log = logging.getLogger(__name__)

#: the header of a request one instance forwards to another (``--valkey``): its value is the
#: sender's epoch, and a forwarded request is served where it arrives, never forwarded again
FORWARDED = "x-ringkv-forwarded"


def _devices(names) -> str:
    """The ``X-RingKV-Device`` header: the devices that served the choices, in order."""
    return ",".join(dict.fromkeys(names))


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
                 "/v1/models": "models", "/tokenize": "tokenize", "/detokenize": "detokenize",
                 "/tokenizer_info": "tokenizer_info"}
    #: guarded paths besides ``/v1``: the tokenizer's (vLLM leaves them open; here they run
    #: on the server's CPU for anyone, so they are the key holders')
    TOKENIZER = ("/tokenize", "/detokenize", "/tokenizer_info")

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
                                           or scope["path"].startswith("/v1/")
                                           or scope["path"] in self.TOKENIZER):
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


class _LoopWaker:
    """The wake-ups of one event loop's inboxes, coalesced: the first inbox that needs the loop
    schedules one callback (``call_soon_threadsafe``: a write to the loop's self-pipe and, on
    the loop's side, a read of it), and every inbox that needs it before that callback runs
    rides with it. A device's step ends 32 streams' tokens in one burst of messages: one
    wake-up of the loop for all of them, not one per request."""

    def __init__(self, loop):
        self._loop = loop
        self._lock = threading.Lock()
        self._due: list = []

    def wake(self, inbox) -> None:
        with self._lock:
            self._due.append(inbox)
            if len(self._due) > 1:
                return
        self._loop.call_soon_threadsafe(self._run)

    def _run(self) -> None:
        with self._lock:
            due, self._due = self._due, []
        for inbox in due:
            inbox._wake()


#: one :class:`_LoopWaker` per event loop (a server has one; tests may start several)
_wakers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_wakers_lock = threading.Lock()


def _waker(loop) -> _LoopWaker:
    with _wakers_lock:
        waker = _wakers.get(loop)
        if waker is None:
            waker = _wakers[loop] = _LoopWaker(loop)
        return waker


class Inbox:
    """A request's events from the devices' threads to the event loop: ``put`` from any
    thread, ``await get()`` / ``await get_burst()`` in the loop. One wake-up of the loop per
    burst, not per event: a token put while a wake-up is pending rides with it, so a loop
    that falls behind (32 streams, a token each per step) takes the backlog in one go; and
    the inboxes of one loop share their wake-ups (:class:`_LoopWaker`)."""

    def __init__(self, loop):
        self._waker = _waker(loop)
        self._items: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._pending = False
        self._ready = asyncio.Event()

    def put(self, item) -> None:
        with self._lock:
            self._items.append(item)
            if self._pending:
                return
            self._pending = True
        self._waker.wake(self)

    def _wake(self) -> None:
        with self._lock:
            self._pending = False
        self._ready.set()

    async def get_burst(self) -> list:
        """Every event there is, waiting for the first."""
        while True:
            with self._lock:
                if self._items:
                    out = list(self._items)
                    self._items.clear()
                    return out
                self._ready.clear()
            await self._ready.wait()

    async def get(self):
        """The next event."""
        while True:
            with self._lock:
                if self._items:
                    return self._items.popleft()
                self._ready.clear()
            await self._ready.wait()


def _dumps(obj) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


class _Api:
    def __init__(self, engine, model_name: str, fingerprint: str, tenant=None):
        self.engine, self.model_name, self.fingerprint = engine, model_name, fingerprint
        self.tenant = tenant
        self.metrics = engine.metrics
        self.created = int(time.time())
        self.max_context = engine.config.max_tokens
        self._http = None                   # the client of forwarded requests (--valkey)

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
            req = parse(body, chat, self.max_context)
            capacity = sum(w.batch + self.engine.max_queue for w in self.engine.workers)
            if req.choices > capacity:
                raise UsageError(f"this request has {req.choices} choices (prompts × n), each "
                                 f"a request on a device, which run and queue {capacity} at "
                                 f"most (each device's batch and --max-queue)",
                                 param="n" if req.n > 1 else "prompt")
        except RingKVError as e:
            self.metrics.requests.labels(endpoint, str(e.http_status)).inc()
            return _error_response(e)
        events = Inbox(asyncio.get_running_loop())
        tenant = request.scope.get("ringkv.tenant")
        tenant = self.tenant if tenant is None else tenant
        copied = None                       # (record, its tokens) from another instance
        if self.engine.cluster is not None and len(req.prompts) == 1 \
                and FORWARDED not in request.headers:
            peer, count = self.engine.remote(req.prompts[0], tenant)
            how = self.engine.cluster.move
            if peer is not None and (how == "forward" or how == "auto" and peer.room > 0):
                forwarded = await self._forward(request, peer)
                if forwarded is not None:
                    return forwarded
            elif peer is not None:
                record = await self._copy(request, peer, req.prompts[0], count, tenant)
                copied = (record, count) if record is not None else None

        def sink_of(index):
            def sink(kind, value):
                events.put((index, kind, value))
            return sink

        jobs = []
        # one job per choice, indexed as vLLM's: prompt i's sample j is choice i * n + j
        for prompt in req.prompts:
            for j in range(req.n):
                jobs.append(Job(prompt, choice_params(req.params, j), sink_of(len(jobs)),
                                chat=chat, session=req.session, received=t0, tenant=tenant,
                                logprobs=req.logprobs,
                                prompt_logprobs=req.logprobs if req.echo else None))
                if copied is not None and not req.echo:
                    jobs[-1].record, jobs[-1].remote = copied
        workers = []
        try:
            for job in jobs:
                workers.append(self.engine.submit(job))
        except RingKVError as e:
            for job in jobs:
                job.cancelled.set()
            self.metrics.requests.labels(endpoint, str(e.http_status)).inc()
            return _error_response(e)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        head = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": self.model_name,
                "system_fingerprint": self.fingerprint}
        if req.stream:
            return StreamingResponse(
                self._sse(req, jobs, events, head, endpoint, t0),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no",
                         "X-RingKV-Device": _devices(w.name for w in workers)})
        results, infos = [None] * len(jobs), [[] for _ in jobs]
        try:
            waiting = len(jobs)
            while waiting:
                index, kind, value = await events.get()
                if kind == "token":
                    if value[1] is not None:
                        infos[index].append(value[1])
                elif kind == "done":
                    results[index] = value
                    waiting -= 1
                elif kind == "error":
                    raise value
        except RingKVError as e:
            for job in jobs:
                job.cancelled.set()
            self.metrics.requests.labels(endpoint, str(e.http_status)).inc()
            return _error_response(e)
        except BaseException:
            for job in jobs:
                job.cancelled.set()
            raise
        self._finish(endpoint, results, t0)
        choices = [self._choice(req, index, result, infos[index])
                   for index, result in enumerate(results)]
        body = dict(head, object="chat.completion" if chat else "text_completion",
                    choices=choices, usage=self._usage(req, results))
        return JSONResponse(body, headers={"X-RingKV-Device": _devices(
            r.device for r in results)})

    def _choice(self, req, index: int, result, infos) -> dict:
        """Choice ``index`` of a whole answer."""
        if req.chat:
            return {"index": index,
                    "message": {"role": "assistant", "content": result.text},
                    "logprobs": None if req.logprobs is None else chat_logprobs(
                        infos, req.token_ids),
                    "finish_reason": result.finish_reason}
        echo = req.texts[index // req.n] if req.echo else ""
        logprobs = None
        if req.logprobs is not None:
            tokens, start = list(result.tokens), len(echo)
            offsets = text_offsets(tokens, start)
            if req.echo:
                prompt = list(req.prompts[index // req.n].tokens)
                offsets = text_offsets(prompt) + offsets
                tokens, infos = prompt + tokens, list(result.prompt_logprobs) + list(infos)
            logprobs = legacy_logprobs(tokens, infos, offsets=offsets, token_ids=req.token_ids)
        return {"index": index, "text": echo + result.text, "logprobs": logprobs,
                "finish_reason": result.finish_reason}

    def _usage(self, req, results) -> dict:
        """The request's usage: each prompt's tokens once (as vLLM counts them, whatever
        ``n``), every choice's generated tokens; a prompt's cached tokens are those that none
        of its samples computed (the least over them)."""
        prompt = cached = 0
        for i in range(len(req.prompts)):
            mine = results[i * req.n:(i + 1) * req.n]
            prompt += mine[0].prompt_tokens
            cached += min(r.cached_tokens for r in mine)
        completion = sum(len(r.tokens) for r in results)
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached}}

    def _finish(self, endpoint, results, t0):
        m = self.metrics
        total = time.perf_counter() - t0
        m.requests.labels(endpoint, "200").inc()
        m.duration.observe(total)
        for result in results:
            m.prompt_tokens.inc(result.prompt_tokens)
            m.generation_tokens.inc(len(result.tokens))
            m.overhead.observe(max(0.0, total - result.scheduler_s - result.queue_s))
            if log.isEnabledFor(logging.DEBUG) and result.times.get("started") is not None:
                t = dict(result.times, finished=t0 + total)
                steps = ("received", "routed", "picked", "got", "started", "ended", "answered",
                         "finished")
                log.debug("%s: %s", result.device, ", ".join(
                    f"{a}->{b} {(t[b] - t[a]) * 1e3:.2f} ms" for a, b in zip(steps, steps[1:])))

    async def _sse(self, req, jobs, events, head, endpoint, t0):
        chat = req.chat
        counts = [0] * len(jobs)            # tokens generated so far, per choice
        offsets = [LegacyOffsets(len(req.texts[i // req.n]) if req.echo else 0)
                   for i in range(len(jobs))]
        results = [None] * len(jobs)
        usage_field = req.include_usage

        def chunk(index, delta_or_text, finish=None, logprobs=None):
            if chat:
                choice = {"index": index, "delta": delta_or_text, "logprobs": logprobs,
                          "finish_reason": finish}
            else:
                choice = {"index": index, "text": delta_or_text, "logprobs": logprobs,
                          "finish_reason": finish}
            obj = dict(head, choices=[choice])
            if req.continuous_usage:        # vLLM's: this choice's usage so far
                p = req.prompts[index // req.n]
                obj["usage"] = {"prompt_tokens": len(p.tokens),
                                "completion_tokens": counts[index],
                                "total_tokens": len(p.tokens) + counts[index]}
            elif usage_field:
                obj["usage"] = None
            return f"data: {_dumps(obj)}\n\n"

        def token_logprobs(index, info):
            if info is None:
                return None
            if chat:
                return {"content": [chat_entry(info, req.token_ids)]}
            return legacy_logprobs([info.token], [info], token_ids=req.token_ids,
                                   offsets=[offsets[index].next(info.token)])

        done = False
        try:
            for index in range(len(jobs)):
                if chat:
                    yield chunk(index, {"role": "assistant", "content": ""})
                elif req.echo and req.texts[index // req.n]:
                    yield chunk(index, req.texts[index // req.n])
            waiting, ended = len(jobs), False
            while waiting and not ended:
                # every event that arrived meanwhile, written in one piece (one write to the
                # socket for the tokens of several steps or choices, when the loop is behind)
                out = []
                for index, kind, value in await events.get_burst():
                    if kind in ("token", "tail"):
                        text, info = value if kind == "token" else (value, None)
                        counts[index] += kind == "token"
                        if text or info is not None:
                            out.append(chunk(index, {"content": text} if chat else text,
                                             logprobs=token_logprobs(index, info)))
                    elif kind == "done":
                        results[index] = value
                        waiting -= 1
                        out.append(chunk(index, {} if chat else "", value.finish_reason))
                    else:
                        exc, ended = value, True
                        if isinstance(exc, Cancelled):
                            break
                        status = getattr(exc, "http_status", 500)
                        self.metrics.requests.labels(endpoint, str(status)).inc()
                        body = error_body(exc.one_line() if isinstance(exc, RingKVError)
                                          else "internal error", type_=getattr(
                                              exc, "api_type", "server_error"),
                                          param=getattr(exc, "param", None),
                                          code=getattr(exc, "api_code", None))
                        out.append(f"data: {_dumps(body)}\n\n")
                        break
                    if not waiting:
                        break
                if out:
                    yield "".join(out)
                if ended and isinstance(exc, Cancelled):
                    break
            if not waiting:
                if usage_field:
                    last = dict(head, choices=[], usage=self._usage(req, results))
                    yield f"data: {_dumps(last)}\n\n"
                self._finish(endpoint, results, t0)
            yield "data: [DONE]\n\n"
            done = not waiting
        finally:
            if not done:
                for job in jobs:            # the client went away, or one choice failed
                    job.cancelled.set()

    # -- many instances (--valkey) ------------------------------------------------------------
    async def _forward(self, request: Request, peer):
        """The request sent as it came to ``peer``, the instance holding its prefix, and its
        answer passed through as it streams (status, body, the headers a client reads); None
        when the peer cannot be reached or has no room (429, 503): the request is then served
        here (the one retry), and the peer is not used again before its next heartbeat."""
        import httpx
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=2.0))
        headers = {"content-type": "application/json",
                   FORWARDED: self.engine.cluster.epoch}
        if "authorization" in request.headers:
            headers["authorization"] = request.headers["authorization"]
        outgoing = self._http.build_request("POST", peer.url + request.url.path,
                                            content=await request.body(), headers=headers)
        try:
            response = await self._http.send(outgoing, stream=True)
        except httpx.HTTPError as e:
            log.warning("cluster: instance %s unreachable (%s); serving here", peer.url,
                        type(e).__name__)
            self.engine.cluster.forget(peer)
            self.metrics.cluster_forwards.labels("unreachable").inc()
            return None
        if response.status_code in (429, 503):
            await response.aclose()
            self.metrics.cluster_forwards.labels("busy").inc()
            return None
        self.metrics.cluster_forwards.labels("forwarded").inc()
        passed = {k: v for k, v in response.headers.items()
                  if k.lower() in ("content-type", "cache-control", "x-ringkv-device",
                                   "retry-after", "www-authenticate", "x-accel-buffering")}
        passed["X-RingKV-Instance"] = peer.url

        async def relay():
            # closed however the stream ends: a client that goes away closes the connection
            # to the holder too, which then cancels the request (as it would its own client's)
            try:
                async for chunk in response.aiter_raw():
                    yield chunk
            finally:
                await response.aclose()
        return StreamingResponse(relay(), status_code=response.status_code, headers=passed)

    async def _copy(self, request: Request, peer, prompt, count: int, tenant):
        """The record of ``prompt``'s first ``count`` tokens that ``peer`` holds, read from
        it (``GET /v1/ringkv/record``), or None (evicted there meanwhile, unreachable): the
        request then computes here what it does not hold."""
        import httpx
        hashes = self.engine.hashers[tenant].hashes(prompt.tokens, count, prompt.checkpoints)
        key = (count, hashes[count - 1])
        device = peer.keys.get((self.engine.cluster.label(tenant), *key))
        if device is None:
            return None
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=2.0))
        headers = {FORWARDED: self.engine.cluster.epoch}
        if "authorization" in request.headers:
            headers["authorization"] = request.headers["authorization"]
        try:
            response = await self._http.get(
                peer.url + "/v1/ringkv/record", headers=headers, timeout=30.0,
                params={"device": device, "count": count, "hash": f"{key[1]:016x}"})
        except httpx.HTTPError as e:
            log.warning("cluster: instance %s unreachable (%s); computing here", peer.url,
                        type(e).__name__)
            self.engine.cluster.forget(peer)
            self.metrics.cluster_copies.labels("unreachable").inc()
            return None
        if response.status_code != 200:
            self.metrics.cluster_copies.labels("missing").inc()
            return None
        return response.content

    async def record(self, request: Request):
        """``GET /v1/ringkv/record?device=NAME&count=N&hash=HEX``: a record this instance's
        device holds, in the card format (self-describing; sealed ones verified by the device
        that stores them), for another instance of the cluster. A sealed record only to its
        own tenant (the request's API key's)."""
        from ringkv.host.record.codec import decode_fields
        q = request.query_params
        try:
            name, key = q["device"], (int(q["count"]), int(q["hash"], 16))
        except (KeyError, ValueError):
            return _error_response(UsageError("device, count and hash (hex) are needed"))
        worker = next((w for w in self.engine.workers if w.name == name), None)
        data = None
        if worker is not None:
            data = await asyncio.get_running_loop().run_in_executor(
                None, worker.read_record, key)
        tenant = request.scope.get("ringkv.tenant")
        tenant = self.tenant if tenant is None else tenant
        if data is not None and decode_fields(data[:512]).key_id != (tenant or 0):
            data = None                     # another tenant's: as if it were not here
        if data is None:
            return _error_response(NotFound(f"no record {key} on device {name!r}"))
        return Response(data, media_type="application/octet-stream")

    # -- the tokenizer ---------------------------------------------------------------------------
    async def tokenize(self, request: Request):
        try:
            body = await self._body(request)
            self._check_model(body)
            out = tokenize_body(body, self.max_context)
        except RingKVError as e:
            self.metrics.requests.labels("tokenize", str(e.http_status)).inc()
            return _error_response(e)
        self.metrics.requests.labels("tokenize", "200").inc()
        return JSONResponse(out)

    async def detokenize(self, request: Request):
        try:
            body = await self._body(request)
            self._check_model(body)
            out = detokenize_body(body)
        except RingKVError as e:
            self.metrics.requests.labels("detokenize", str(e.http_status)).inc()
            return _error_response(e)
        self.metrics.requests.labels("detokenize", "200").inc()
        return JSONResponse(out)

    async def tokenizer_info(self, request: Request):
        self.metrics.requests.labels("tokenizer_info", "200").inc()
        return JSONResponse(dict(tokenizer_config(), model_max_length=self.max_context))

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
        # the first streamed answer would import anyio's asyncio backend (starlette's task
        # group around a streaming response): some 40 ms in that request; taken here instead
        import anyio
        async with anyio.create_task_group():
            pass
        try:
            yield
        finally:
            if manage_engine:
                await asyncio.get_running_loop().run_in_executor(None, engine.stop)
            if api._http is not None:
                await api._http.aclose()

    routes = [Route("/v1/completions", api.completions, methods=["POST"]),
              Route("/v1/chat/completions", api.chat, methods=["POST"]),
              Route("/v1/models", api.models, methods=["GET"]),
              Route("/v1/ringkv/record", api.record, methods=["GET"]),
              Route("/tokenize", api.tokenize, methods=["POST"]),
              Route("/detokenize", api.detokenize, methods=["POST"]),
              Route("/tokenizer_info", api.tokenizer_info, methods=["GET"]),
              Route("/health", api.health, methods=["GET"]),
              Route("/metrics", api.metrics_text, methods=["GET"])]
    middleware = [Middleware(ApiKeyGate, keys=api_keys, metrics=engine.metrics)] \
        if api_keys else []
    return Starlette(routes=routes, lifespan=lifespan, middleware=middleware,
                     exception_handlers={HTTPException: _http_error, Exception: _internal_error})

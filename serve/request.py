"""A generation request's body checked against the API's shapes: every field the OpenAI API or
vLLM's server accepts on ``/v1/completions`` and ``/v1/chat/completions`` is either served,
accepted at the value that changes nothing, or refused with a 400 naming it; a field neither
knows is refused too. Nothing is silently ignored.

:func:`parse` returns a :class:`GenerateRequest`: the prompts (a completion may give a list),
the :class:`~ringkv.host.model.sampling.SamplingParams`, ``n``, ``logprobs`` (the top tokens
per token, ``None`` for none), ``echo``, the stream flags and the session. Pure functions: the
HTTP layer (:mod:`ringkv.serve.app`) and any engine can call them.

Served fields (besides ``model``, ``prompt``/``messages``, the sampling fields of
:class:`SamplingParams`, ``stream`` and ``session_id``):

* completions: ``n``, ``best_of`` (only ``= n``), ``logprobs`` (0..20), ``echo``,
  ``max_tokens`` 0 with ``echo`` (the prompt's logprobs only), ``add_special_tokens``
  (false: a string prompt without the BOS in front), ``return_tokens_as_token_ids``;
* chat: ``n``, ``logprobs`` (boolean), ``top_logprobs`` (0..20, with ``logprobs``),
  ``max_completion_tokens``, ``return_tokens_as_token_ids``;
* both: ``ignore_eos``, ``min_tokens``, ``stop`` (up to
  :data:`~ringkv.host.model.sampling.MAX_STOP`), ``stop_token_ids`` (only BOS, the one that
  already stops), ``stream_options`` (``include_usage``, ``continuous_usage_stats``), ``user``
  (an end user's id: no effect here, as on a server that keeps no per-user records).

Accepted only at their neutral value (what the request means without them): ``suffix``
(null), ``presence_penalty``, ``frequency_penalty`` (0), ``repetition_penalty`` (1),
``min_p`` (0), ``logit_bias`` (empty), ``tools``/``functions`` (empty),
``tool_choice``/``function_call`` (``none``), ``parallel_tool_calls``, ``response_format``
(text), ``include_stop_str_in_output`` (false), ``skip_special_tokens`` (true),
``spaces_between_special_tokens`` (true), ``use_beam_search`` (false), ``length_penalty`` (1),
``prompt_logprobs``, ``truncate_prompt_tokens``, ``allowed_token_ids``, ``bad_words``,
``guided_*``, ``structured_outputs`` (null), ``priority`` (0), ``store`` (false),
``metadata``, ``service_tier`` (``auto``/``default``), ``modalities`` (text); chat:
``add_generation_prompt`` (true), ``continue_final_message`` (false), ``echo`` (false),
``chat_template``, ``chat_template_kwargs``, ``documents`` (null), ``add_special_tokens``
(false), ``reasoning_effort`` (null).
"""

import dataclasses
from dataclasses import dataclass

from ringkv.host.errors import UsageError
from ringkv.host.model.logprobs import MAX_LOGPROBS
from ringkv.host.model.sampling import SamplingParams
from ringkv.host.model.transformer import BOS
from ringkv.host.model.vocab import decode

from .template import Prompt, chat_prompt, completion_prompts

__all__ = ["GenerateRequest", "parse", "choice_params", "COMPLETION_MAX_TOKENS",
           "CHAT_MAX_TOKENS", "MAX_CHOICES"]

#: ``max_tokens`` when a request gives none (the OpenAI API's 16 for completions; a chat reply
#: stops at the end of its message, this bounds one that does not)
COMPLETION_MAX_TOKENS = 16
CHAT_MAX_TOKENS = 256
#: choices in one request (prompts × ``n``): each is a request in a device's queue
MAX_CHOICES = 128


def _empty(v):
    return v in (None, {}, [])


#: field -> whether its value changes nothing (the fields accepted only so)
_NEUTRAL = {
    "suffix": lambda v: v is None,
    "presence_penalty": lambda v: v in (None, 0),
    "frequency_penalty": lambda v: v in (None, 0),
    "repetition_penalty": lambda v: v in (None, 1),
    "min_p": lambda v: v in (None, 0),
    "logit_bias": _empty,
    "tools": _empty,
    "functions": _empty,
    "tool_choice": lambda v: v in (None, "none"),
    "function_call": lambda v: v in (None, "none"),
    "parallel_tool_calls": lambda v: v in (None, True, False),
    "response_format": lambda v: v is None or v == {"type": "text"},
    "include_stop_str_in_output": lambda v: v in (None, False),
    "skip_special_tokens": lambda v: v in (None, True),
    "spaces_between_special_tokens": lambda v: v in (None, True),
    "use_beam_search": lambda v: v in (None, False),
    "length_penalty": lambda v: v in (None, 1),
    "prompt_logprobs": lambda v: v is None,
    "truncate_prompt_tokens": lambda v: v is None,
    "allowed_token_ids": lambda v: v is None,
    "bad_words": _empty,
    "guided_json": lambda v: v is None,
    "guided_regex": lambda v: v is None,
    "guided_choice": lambda v: v is None,
    "guided_grammar": lambda v: v is None,
    "guided_decoding_backend": lambda v: v is None,
    "guided_whitespace_pattern": lambda v: v is None,
    "structured_outputs": lambda v: v is None,
    "priority": lambda v: v in (None, 0),
    "store": lambda v: v in (None, False),
    "metadata": lambda v: v is None or isinstance(v, dict),
    "service_tier": lambda v: v in (None, "auto", "default"),
    "modalities": lambda v: v is None or v == ["text"],
}
_NEUTRAL_CHAT = {
    "add_generation_prompt": lambda v: v in (None, True),
    "continue_final_message": lambda v: v in (None, False),
    "echo": lambda v: v in (None, False),
    "chat_template": lambda v: v is None,
    "chat_template_kwargs": _empty,
    "documents": lambda v: v is None,
    "add_special_tokens": lambda v: v in (None, False),
    "reasoning_effort": lambda v: v is None,
}
_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop",
           "stop_token_ids", "stream", "stream_options", "n", "ignore_eos", "min_tokens",
           "session_id", "user"}
_SERVED = {
    False: _COMMON | {"prompt", "best_of", "logprobs", "echo", "add_special_tokens",
                      "return_tokens_as_token_ids"},
    True: _COMMON | {"messages", "max_completion_tokens", "logprobs", "top_logprobs",
                     "return_tokens_as_token_ids"},
}
_STREAM_OPTIONS = {"include_usage", "continuous_usage_stats"}


@dataclass(frozen=True)
class GenerateRequest:
    """A checked generation request (module docstring). ``logprobs``: the top tokens to give
    with each token (completions' ``logprobs``, chat's ``top_logprobs``), ``None`` for no
    logprobs; ``echo``: the prompt first in each choice (completions)."""
    chat: bool
    prompts: tuple                  # of Prompt
    texts: tuple                    # each prompt's echo text (completions)
    params: SamplingParams
    n: int = 1
    logprobs: int | None = None
    echo: bool = False
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    session: str | None = None
    token_ids: bool = False         # return_tokens_as_token_ids

    @property
    def choices(self) -> int:
        return len(self.prompts) * self.n


def _flag(body, name, default=False) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise UsageError(f"{name} must be a boolean, not {v!r}", param=name)
    return v


def _count(body, name, lo, hi, default=None):
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise UsageError(f"{name} must be an integer {lo}..{hi}, not {v!r}", param=name)
    return v


def _check_fields(body, chat: bool):
    neutral = _NEUTRAL | (_NEUTRAL_CHAT if chat else {})
    for name, value in body.items():
        if name in _SERVED[chat]:
            continue
        if name in neutral:
            if not neutral[name](value):
                raise UsageError(f"{name} is not supported by this server (only its default "
                                 f"value, which changes nothing)", param=name)
            continue
        raise UsageError(f"unknown field {name!r} (not a field of the OpenAI API or vLLM's "
                         f"server that this server serves)", param=name)


def _stream_flags(body):
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False, False
    if not stream:
        raise UsageError("stream_options is only allowed with stream: true",
                         param="stream_options")
    if not isinstance(options, dict):
        raise UsageError("stream_options must be an object", param="stream_options")
    for key in options:
        if key not in _STREAM_OPTIONS:
            raise UsageError(f"stream_options.{key} is not supported (only "
                             f"{', '.join(sorted(_STREAM_OPTIONS))})",
                             param=f"stream_options.{key}")
    usage = _flag(options, "include_usage")
    continuous = _flag(options, "continuous_usage_stats")
    if continuous and not usage:
        raise UsageError("stream_options.continuous_usage_stats needs include_usage: true "
                         "(as vLLM's)", param="stream_options.continuous_usage_stats")
    return stream, usage, continuous


def parse(body: dict, chat: bool, max_context: int) -> GenerateRequest:
    """``body`` of a completions (``chat=False``) or chat completions request, checked; a
    bad field is a :class:`UsageError` naming it (``param``). ``max_context``: the token
    memory (prompt plus generated tokens)."""
    _check_fields(body, chat)
    if not isinstance(body.get("user", ""), str):
        raise UsageError("user must be a string", param="user")
    if chat:
        prompts = (chat_prompt(body.get("messages")),)
        texts = ("",)
    else:
        add_special = _flag(body, "add_special_tokens", True)
        prompts = tuple(completion_prompts(body.get("prompt")))
        if not add_special and isinstance(body.get("prompt"), (str, list)):
            prompts = tuple(_without_bos(p, body["prompt"]) for p in prompts)
        texts = tuple(decode(p.tokens, skip_special_tokens=True) for p in prompts)
    n = _count(body, "n", 1, MAX_CHOICES, 1)
    if not chat and body.get("best_of") not in (None, n):
        raise UsageError(f"best_of must equal n ({n}): this server returns every sample",
                         param="best_of")
    if len(prompts) * n > MAX_CHOICES:
        raise UsageError(f"{len(prompts)} prompts × n {n} is more than {MAX_CHOICES} choices "
                         f"in one request", param="n")
    if chat:
        want = _flag(body, "logprobs")
        top = _count(body, "top_logprobs", 0, MAX_LOGPROBS)
        if top is not None and not want:
            raise UsageError("top_logprobs needs logprobs: true", param="top_logprobs")
        logprobs = (top or 0) if want else None
        echo = False
    else:
        logprobs = _count(body, "logprobs", 0, MAX_LOGPROBS)
        echo = _flag(body, "echo")
    ids = body.get("stop_token_ids")
    if ids not in (None, [], [BOS]):
        raise UsageError(f"stop_token_ids may only name BOS ({BOS}), the end of text, which "
                         f"stops a generation already", param="stop_token_ids")
    stream, include_usage, continuous = _stream_flags(body)
    if stream and echo and logprobs is not None:
        raise UsageError("echo with logprobs is not supported in a stream (the prompt's "
                         "logprobs come with the answer): send it with stream: false",
                         param="echo")
    params = _params(body, max(len(p.tokens) for p in prompts), chat, echo, max_context)
    sid = body.get("session_id")
    if sid is not None and (not isinstance(sid, str) or not sid or len(sid) > 256):
        raise UsageError("session_id must be a non-empty string (at most 256 characters)",
                         param="session_id")
    if sid is not None and (len(prompts) * n > 1 or (echo and logprobs is not None)):
        raise UsageError("session_id is one conversation: not with several choices (n, a "
                         "list of prompts) nor with echo and logprobs (computed afresh)",
                         param="session_id")
    return GenerateRequest(chat, prompts, texts, params, n, logprobs, echo, stream,
                           include_usage, continuous, sid,
                           _flag(body, "return_tokens_as_token_ids"))


def _without_bos(prompt: Prompt, given) -> Prompt:
    """A string prompt without the BOS put in front (``add_special_tokens: false``)."""
    if isinstance(given, list) and given and not isinstance(given[0], str):
        return prompt                         # token ids: taken as they are anyway
    if len(prompt.tokens) < 2:
        raise UsageError("prompt must not be empty without its BOS", param="prompt")
    tokens = prompt.tokens[1:]
    return Prompt(tokens, (len(tokens) - 1,) if len(tokens) > 1 else ())


def _params(body, prompt_len: int, chat: bool, echo: bool, max_context: int) -> SamplingParams:
    limit = max_context - prompt_len + 1
    where = "messages" if chat else "prompt"
    if limit < 1:
        raise UsageError(f"This model's maximum context length is {max_context} "
                         f"tokens (the device's token memory); the {where} has "
                         f"{prompt_len}", param=where)
    key = "max_tokens"
    if chat and body.get("max_completion_tokens") is not None:
        key = "max_completion_tokens"
    max_tokens = body.get(key)
    if max_tokens is None:
        max_tokens = min(CHAT_MAX_TOKENS if chat else COMPLETION_MAX_TOKENS, limit)
    values = {}
    for name, default in (("temperature", 1.0), ("top_p", 1.0), ("top_k", 0),
                          ("seed", None), ("stop", ()), ("min_tokens", 0),
                          ("ignore_eos", False)):
        value = body.get(name)
        values[name] = default if value is None else value
    try:
        out = SamplingParams(max_tokens=max_tokens, **values)
    except UsageError as e:
        if e.param == "max_tokens":
            e.param = key
        raise
    if out.max_tokens == 0 and not echo:
        raise UsageError(f"{key} must be at least 1 (0 only with echo: the prompt's "
                         f"logprobs alone)", param=key)
    if out.max_tokens > limit:
        raise UsageError(f"This model's maximum context length is {max_context} "
                         f"tokens; the {where} has {prompt_len} and {key} asks for "
                         f"{out.max_tokens} more (at most {limit})", param=key)
    return out


def choice_params(params: SamplingParams, j: int) -> SamplingParams:
    """The parameters of a prompt's ``j``-th sample: with a seed, sample ``j`` draws from
    ``seed + j`` (vLLM's rule for ``n`` > 1: each sample its own seed, the first the
    request's), so the samples differ and each is reproducible."""
    if params.seed is None or j == 0:
        return params
    return dataclasses.replace(params, seed=params.seed + j)

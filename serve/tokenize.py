"""``/tokenize``, ``/detokenize`` and ``/tokenizer_info`` in the shapes of vLLM's server (which
llama.cpp's and SGLang's resemble; lm-evaluation-harness' remote tokenizer and guidellm use
them): the byte vocabulary of :mod:`ringkv.host.model.vocab`.

* ``POST /tokenize`` ``{"prompt", "add_special_tokens": true, "return_token_strs": false}``
  (BOS in front unless ``add_special_tokens`` is false; the text ``<BOS>`` is a BOS) or
  ``{"messages", "add_generation_prompt": true, "add_special_tokens": false}`` (the chat
  template; ``add_special_tokens`` puts one more BOS in front, as vLLM's) ->
  ``{"count", "max_model_len", "tokens", "token_strs"}``; ``token_strs`` (with
  ``return_token_strs``) are the tokenizer's own token strings: the ``ByteLevel`` character of
  each byte (``Ġ`` for a space, as ``convert_ids_to_tokens`` gives them), ``<BOS>``.
* ``POST /detokenize`` ``{"tokens"}`` -> ``{"prompt"}``: the text, BOS written ``<BOS>``
  (special tokens kept, as vLLM's), so that ``/tokenize`` gives the tokens back.
* ``GET /tokenizer_info``: ``tokenizer_config.json`` (the class, ``bos_token``,
  ``eos_token``, the chat template) and ``model_max_length``.

Both POST routes take ``model`` (this server's) and refuse any other field, as the generation
routes do.
"""

from ringkv.host.errors import UsageError
from ringkv.host.model.transformer import BOS, VOCAB
from ringkv.host.model.vocab import byte_chars, decode, encode

from .template import GENERATION_PROMPT, chat_prompt

__all__ = ["tokenize_body", "detokenize_body", "token_strs"]

_CHARS = byte_chars()


def _flag(body, name, default):
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise UsageError(f"{name} must be a boolean, not {v!r}", param=name)
    return v


def _only(body, allowed):
    for name in body:
        if name not in allowed:
            raise UsageError(f"unknown field {name!r} for this route (it takes "
                             f"{', '.join(sorted(allowed))})", param=name)


def token_strs(tokens) -> list[str]:
    """The tokenizer's strings of ``tokens`` (module docstring)."""
    return ["<BOS>" if t == BOS else _CHARS[t] for t in tokens]


def tokenize_body(body: dict, max_model_len: int) -> dict:
    """The answer of ``/tokenize`` to ``body`` (a :class:`UsageError` naming a bad field)."""
    if "messages" in body:
        _only(body, {"model", "messages", "add_generation_prompt", "add_special_tokens",
                     "return_token_strs", "continue_final_message"})
        if _flag(body, "continue_final_message", False):
            raise UsageError("continue_final_message is not supported (the template always "
                             "ends each message)", param="continue_final_message")
        tokens = list(chat_prompt(body["messages"]).tokens)
        if not _flag(body, "add_generation_prompt", True):
            tokens = tokens[:len(tokens) - len(GENERATION_PROMPT.encode("utf-8"))]
        if _flag(body, "add_special_tokens", False):
            tokens = [BOS, *tokens]
    else:
        _only(body, {"model", "prompt", "add_special_tokens", "return_token_strs"})
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise UsageError("prompt must be a string (or give messages)", param="prompt")
        tokens = encode(prompt, add_special_tokens=_flag(body, "add_special_tokens", True))
    strs = token_strs(tokens) if _flag(body, "return_token_strs", False) else None
    return {"count": len(tokens), "max_model_len": max_model_len, "tokens": tokens,
            "token_strs": strs}


def detokenize_body(body: dict) -> dict:
    """The answer of ``/detokenize`` to ``body``."""
    _only(body, {"model", "tokens"})
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise UsageError("tokens must be a list of token ids", param="tokens")
    bad = [t for t in tokens if not 0 <= t < VOCAB]
    if bad:
        raise UsageError(f"token ids are 0..{VOCAB - 1} (bytes, {BOS} = BOS), not {bad[0]}",
                         param="tokens")
    return {"prompt": decode(tokens)}

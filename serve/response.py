"""The ``logprobs`` objects of the API's answers, in the shapes vLLM and the OpenAI API use.

* completions (the legacy shape): ``{"tokens", "token_logprobs", "top_logprobs",
  "text_offset"}``, one entry per token: its string (:func:`ringkv.host.model.vocab.token_str`,
  or ``token_id:N`` with ``return_tokens_as_token_ids``), its logprob (``None`` for a prompt's
  first token, which has no context), a dict of token string -> logprob holding the token
  itself first and the ``logprobs`` most likely tokens (so ``logprobs`` or ``logprobs + 1``
  entries, as vLLM), and its offset in characters in the choice's ``text``;
* chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
  "bytes"}, ...]}]}`` with exactly ``top_logprobs`` entries, most likely first (``bytes``:
  the token's bytes, ``None`` for BOS).

Logprobs below -9999 are written as -9999.0 (vLLM's clamp: JSON has no infinity). The tokens
are every token generated, as vLLM's: a stop sequence's tokens and a final BOS are in
``logprobs`` though not in the text.
"""

from ringkv.host.model.logprobs import TokenLogprob
from ringkv.host.model.vocab import text_offsets, token_bytes, token_str

__all__ = ["legacy_logprobs", "chat_logprobs", "chat_entry", "LegacyOffsets"]

FLOOR = -9999.0


def _lp(x: float) -> float:
    return max(float(x), FLOOR)


def _name(token: int, token_ids: bool) -> str:
    return f"token_id:{token}" if token_ids else token_str(token)


def _top_dict(info: TokenLogprob, token_ids: bool) -> dict:
    out = {_name(info.token, token_ids): _lp(info.logprob)}
    for t, lp in info.top:
        out.setdefault(_name(t, token_ids), _lp(lp))
    return out


def legacy_logprobs(tokens, infos, *, start: int = 0, token_ids: bool = False,
                    offsets=None) -> dict:
    """The legacy object of ``tokens`` with their :class:`TokenLogprob` ``infos`` (``None``
    where there is none); text offsets from ``start`` (or ``offsets`` as given)."""
    tokens = [int(t) for t in tokens]
    if offsets is None:
        offsets = text_offsets(tokens, start)
    return {"tokens": [_name(t, token_ids) for t in tokens],
            "token_logprobs": [None if i is None else _lp(i.logprob) for i in infos],
            "top_logprobs": [None if i is None else _top_dict(i, token_ids) for i in infos],
            "text_offset": list(offsets)}


class LegacyOffsets:
    """Text offsets of a stream's tokens as they come (one :func:`text_offsets` over them)."""

    def __init__(self, start: int = 0):
        import codecs
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.at = start

    def next(self, token: int) -> int:
        at = self.at
        if token < 256:
            self.at += len(self.decoder.decode(bytes((token,))))
        return at


def _bytes(token: int):
    return list(token_bytes(token)) if token < 256 else None


def chat_entry(info: TokenLogprob, token_ids: bool = False) -> dict:
    """One token of the chat shape."""
    return {"token": _name(info.token, token_ids), "logprob": _lp(info.logprob),
            "bytes": _bytes(info.token),
            "top_logprobs": [{"token": _name(t, token_ids), "logprob": _lp(lp),
                              "bytes": _bytes(t)} for t, lp in info.top]}


def chat_logprobs(infos, token_ids: bool = False) -> dict:
    return {"content": [chat_entry(i, token_ids) for i in infos]}

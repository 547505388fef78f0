"""Log probabilities of tokens from the model's logits: what the OpenAI API's ``logprobs``
(completions: the chosen token's logprob and the ``logprobs`` most likely; chat: ``logprobs``
and ``top_logprobs``) and ``echo`` (the prompt's own tokens) return.

* :func:`log_softmax` in float64: ``z - max(z) - log(sum(exp(z - max(z))))``, the model's
  raw distribution: the logprob of a token does not depend on the request's ``temperature``,
  ``top_p`` or ``top_k`` (what vLLM returns by default, ``logprobs_mode`` ``raw_logprobs``,
  and the OpenAI API).
* :func:`token_logprob` gives a token's :class:`TokenLogprob`: its logprob, its rank among the
  vocabulary (1: the most likely), and the ``top_n`` most likely tokens, equal logprobs
  ordered by the lower token id first (deterministic; the greedy sampler's ``argmax`` picks
  the same first one).
* :func:`prompt_logprobs`: the prompt's tokens from the logits at every prompt position (the
  logits at position ``i`` give token ``i + 1``); the first token has none (``None``, as
  vLLM's and the OpenAI API's echo).

The numbers depend only on the logits, so a token's logprob is the same whatever the device
reused: on the bit-exact backend the logits are (an import restores the rings exactly).

How a token is shown (its string, its bytes) is :mod:`ringkv.host.model.vocab`'s.
"""

from dataclasses import dataclass

import numpy as np

__all__ = ["TokenLogprob", "log_softmax", "token_logprob", "prompt_logprobs", "MAX_LOGPROBS"]

#: the most top tokens a request may ask for (the OpenAI API's and vLLM's default limit)
MAX_LOGPROBS = 20


@dataclass(frozen=True)
class TokenLogprob:
    """One token's log probability under the model: ``rank`` 1 is the most likely token;
    ``top`` holds ``(token, logprob)`` of the most likely tokens, most likely first."""
    token: int
    logprob: float
    rank: int
    top: tuple = ()


def log_softmax(logits) -> np.ndarray:
    """``log(softmax(logits))`` in float64, along the last axis."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - np.max(z, axis=-1, keepdims=True)
    return z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))


def _ranked(lp) -> np.ndarray:
    """Token ids by decreasing logprob, equal ones by increasing id (a stable sort)."""
    return np.argsort(-lp, kind="stable")


def token_logprob(logits, token: int, top_n: int = 0) -> TokenLogprob:
    """``token``'s :class:`TokenLogprob` under ``logits`` with the ``top_n`` most likely."""
    if not 0 <= top_n <= len(logits):
        raise ValueError(f"top_n must be 0..{len(logits)}, not {top_n!r}")
    lp = log_softmax(logits)
    order = _ranked(lp)
    token = int(token)
    rank = int(np.flatnonzero(order == token)[0]) + 1
    top = tuple((int(t), float(lp[t])) for t in order[:top_n])
    return TokenLogprob(token, float(lp[token]), rank, top)


def prompt_logprobs(logits, tokens, top_n: int = 0) -> list:
    """``[None, TokenLogprob(tokens[1]), ...]``: each prompt token's logprob given the tokens
    before it, from ``logits`` (``len(tokens)`` rows, or one fewer: row ``i`` are the logits
    after ``tokens[:i + 1]``)."""
    tokens = [int(t) for t in tokens]
    logits = np.asarray(logits, dtype=np.float64)
    if len(logits) < len(tokens) - 1:
        raise ValueError(f"{len(tokens)} tokens need at least {len(tokens) - 1} rows of "
                         f"logits, not {len(logits)}")
    out = [None] * min(1, len(tokens))
    for i in range(1, len(tokens)):
        out.append(token_logprob(logits[i - 1], tokens[i], top_n))
    return out


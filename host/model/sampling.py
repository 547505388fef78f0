"""Choosing the next token from the model's logits: greedy or sampled, with the parameters of
the OpenAI API (``temperature``, ``top_p``, ``top_k``, ``seed``) and a request's length and
stop conditions (``max_tokens``, ``stop``, and vLLM's ``min_tokens`` and ``ignore_eos``).

:class:`SamplingParams` holds and checks a request's values (a bad one is a
:class:`~ringkv.host.errors.UsageError` naming the field); :class:`Sampler` is the callable the
scheduler asks for each token (``Scheduler.request(..., sample=)``).

* ``temperature == 0`` is greedy: ``argmax`` of the logits, the first of equal maxima, exactly
  what :func:`~ringkv.host.scheduler.plain_run` and :meth:`Model.generate` pick.
* Otherwise the logits are divided by the temperature, cut to the ``top_k`` most likely tokens
  (ties broken by the lower token id), turned into probabilities, cut to the smallest set of
  the most likely tokens whose probability reaches ``top_p`` (the nucleus), and one token is
  drawn with **one** uniform number from the request's own generator
  (``numpy.random.default_rng(seed)``). A generator per request, one draw per token: the
  tokens drawn depend only on the seed and the logits, so a seeded request gives the same text
  whichever stored prefix the device resumed it from (the logits are the same bit for bit:
  an import restores the rings exactly). Without a seed the generator is seeded from the
  operating system.

* ``min_tokens``: while fewer tokens than that have been generated, BOS (the model's end of
  text) cannot be drawn: its logit is set to minus infinity before the choice (vLLM's
  ``MinTokensLogitsProcessor``); the stop sequences are not looked for before the
  ``min_tokens``-th token either (:class:`~ringkv.serve.template.TextStream`).
  ``ignore_eos``: a generated BOS does not end the generation (nor, in a chat, the end of the
  message); only ``max_tokens`` and the request's own ``stop`` sequences do.

numpy only (the host layer): the vocabulary is 257 entries, so a sort per token costs
microseconds next to the model's milliseconds.
"""

import math
from dataclasses import dataclass

import numpy as np

from ..errors import UsageError
from .transformer import BOS

__all__ = ["SamplingParams", "Sampler", "MAX_STOP", "TEMPERATURE_MAX"]

#: stop sequences a request may give: the OpenAI API allows 4, vLLM sets no limit (lm-eval and
#: other tools send more than 4); bounded here because every generated token is checked
#: against every sequence
MAX_STOP = 64
#: the OpenAI API's range of ``temperature`` is 0..2
TEMPERATURE_MAX = 2.0


def _number(name, value, *, integer=False):
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or (not integer and not math.isfinite(value)):
        kind = "an integer" if integer else "a number"
        raise UsageError(f"{name} must be {kind}, not {value!r}", param=name)
    return value


@dataclass(frozen=True)
class SamplingParams:
    """A request's sampling and stopping values, checked (:meth:`checked`).

    ``top_k`` 0 or -1 means no cut (vLLM's convention); ``stop`` is a tuple of non-empty
    strings (at most :data:`MAX_STOP`); ``max_tokens`` at least 0 (0: only with ``echo``, the
    server checks); ``min_tokens`` 0..``max_tokens``."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_tokens: int = 16
    stop: tuple = ()
    min_tokens: int = 0
    ignore_eos: bool = False

    def __post_init__(self):
        t = _number("temperature", self.temperature)
        if not 0 <= t <= TEMPERATURE_MAX:
            raise UsageError(f"temperature must be between 0 and {TEMPERATURE_MAX:g}, not {t!r}",
                             param="temperature")
        p = _number("top_p", self.top_p)
        if not 0 < p <= 1:
            raise UsageError(f"top_p must be in (0, 1], not {p!r}", param="top_p")
        k = _number("top_k", self.top_k, integer=True)
        if k < -1:
            raise UsageError(f"top_k must be -1, 0 (no cut) or a positive number of tokens, "
                             f"not {k!r}", param="top_k")
        if self.seed is not None:
            _number("seed", self.seed, integer=True)
        n = _number("max_tokens", self.max_tokens, integer=True)
        if n < 0:
            raise UsageError(f"max_tokens must be at least 0, not {n!r}", param="max_tokens")
        m = _number("min_tokens", self.min_tokens, integer=True)
        if not 0 <= m <= n:
            raise UsageError(f"min_tokens must be 0..max_tokens ({n}), not {m!r}",
                             param="min_tokens")
        if not isinstance(self.ignore_eos, bool):
            raise UsageError(f"ignore_eos must be a boolean, not {self.ignore_eos!r}",
                             param="ignore_eos")
        stop = self.stop
        if isinstance(stop, str):
            stop = (stop,)
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
            raise UsageError(f"stop must be a string or a list of strings, not {self.stop!r}",
                             param="stop")
        if len(stop) > MAX_STOP:
            raise UsageError(f"stop takes at most {MAX_STOP} sequences, not {len(stop)}",
                             param="stop")
        if any(s == "" for s in stop):
            raise UsageError("stop sequences must not be empty", param="stop")
        object.__setattr__(self, "stop", tuple(stop))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class Sampler:
    """``sampler(logits) -> token``: one token per call by :class:`SamplingParams` (see the
    module docstring). ``draws`` counts the uniform numbers taken (one per sampled token),
    ``calls`` the tokens chosen (for ``min_tokens``)."""

    def __init__(self, params: SamplingParams):
        self.params = params
        seed = None if params.seed is None else params.seed % 2 ** 64
        self.rng = np.random.default_rng(seed)
        self.draws = 0
        self.calls = 0

    def __call__(self, logits) -> int:
        p = self.params
        logits = np.asarray(logits, dtype=np.float64)
        if self.calls < p.min_tokens and len(logits) > BOS:
            logits = logits.copy()
            logits[BOS] = -np.inf
        self.calls += 1
        if p.greedy:
            return int(np.argmax(logits))
        # most likely first; equal logits keep the lower token id first (stable sort)
        order = np.argsort(-logits, kind="stable")
        if p.top_k > 0:
            order = order[:p.top_k]
        z = logits[order] / p.temperature
        w = np.exp(z - z[0])
        probs = w / w.sum()
        if p.top_p < 1:
            cum = np.cumsum(probs)
            keep = int(np.searchsorted(cum, p.top_p)) + 1     # the first set reaching top_p
            order, probs = order[:keep], probs[:keep] / cum[min(keep, len(cum)) - 1]
        u = self.rng.random()
        self.draws += 1
        i = int(np.searchsorted(np.cumsum(probs), u, side="right"))
        return int(order[min(i, len(order) - 1)])

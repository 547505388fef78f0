"""llama.cpp's server on our weights (``make peer``) gives our float model's greedy tokens
while prompt and generation stay within the window (``bench/bench_peer.py``). Slow, and
skipped without the built llama-server or the ``gguf`` package: never part of ``make test``."""

import pytest

from bench.bench_peer import PROMPTS, _greedy, missing

pytestmark = [pytest.mark.slow, pytest.mark.skipif(missing() is not None, reason=str(missing()))]


def test_greedy_tokens_equal_within_the_window():
    rows = [r for r in _greedy("demo", PROMPTS) if r["span"] == "within"]
    assert rows
    for r in rows:
        assert r["ours"] == r["theirs"], r["prompt"]

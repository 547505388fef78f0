"""Every benchmark group runs at its smallest configuration (``run(smoke=True)``) and renders
its section of ``docs/BENCHMARKS.md``: a broken benchmark fails ``make test``, not the next
``make bench``. The figures themselves are checked by each group as in the full run (outputs
against the golden models); here only their shape."""

import numbers

import pytest

from bench.run import groups, load, run_group

#: groups whose smallest configuration still builds a whole top (Verilator at the default
#: shape, a bitstream, the gate-level board, yosys on the board top): ``make test-all``
HEAVY = {"board", "board_bram", "model", "system"}
#: groups whose smallest configuration starts many server processes (serve_cluster: seven
#: `ringkv serve` instances and a Valkey, about 70 s on 2 cores; the cluster itself is tested
#: in `make test` by tests/serve/test_cluster.py): `make test-all`
SLOW_GROUPS = {"serve_cluster"}


def test_groups_found():
    assert {"attention", "directory", "hash", "link", "storage", "system_prefix"} | HEAVY \
        <= set(groups())


def _marks(group):
    if group in HEAVY | SLOW_GROUPS:
        return [pytest.mark.slow]
    if group in ("peer", "guidellm"):
        # llama.cpp's server (`make peer`) and guidellm's own environment (`make guidellm`),
        # built only on request: never part of `make test`
        missing = load(group).missing()
        return [pytest.mark.slow,
                pytest.mark.skipif(missing is not None,
                                   reason=f"{missing}: built only on request, never by make "
                                          f"test (the issue keeps llama.cpp and guidellm's "
                                          f"torch out of it)")]
    return []


@pytest.mark.parametrize("group", [pytest.param(g, marks=_marks(g)) for g in groups()])
def test_bench_group_smoke(group):
    results = run_group(group, smoke=True)
    assert results, f"bench group {group} returned no results"
    for r in results:
        assert r["group"] == group
        assert isinstance(r["name"], str) and r["name"]
        assert isinstance(r["value"], numbers.Real), r
        assert isinstance(r["params"], dict), r
    text = load(group).markdown(results)
    assert isinstance(text, str) and text.strip()

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


def test_board_markdown_quotes_each_figure_with_its_clocks():
    """The board group's section names the build's system clock, constraint, seed and SDRAM
    capture, and the gate-level smoke's own clock (saying so when it is not the build's)."""
    from bench.bench_board import markdown
    util = {k: {"used": 1, "available": 2} for k in ("TRELLIS_COMB", "TRELLIS_FF")}
    build = {"board": "ulx3s-85f", "target_mhz": 60.0, "constrained_mhz": 69.0, "seed": 2,
             "utilization": util, "config": {"layers": 4}, "regions": 4096,
             "uart_baud": 3000000, "sd_mode": "sd4", "sd_mhz": 15.0,
             "sdram": {"part": "32MB", "cl": 2, "read_delay": 1, "phase_deg": 310.5}}
    gate = {"sys_mhz": 60.0, "sys_hz": 60e6, "sdram_read_delay": 1, "config": {"layers": 2},
            "top": {"regions": 4}, "cycles": 10, "build_s": 60}
    results = [{"name": "board.fmax", "value": 67.97, "unit": "MHz", "params": build},
               {"name": "board.slack_pct", "value": 11.73, "unit": "%", "params": {}},
               {"name": "board.gatesim_cycles_per_s", "value": 5, "unit": "cycles/s",
                "params": gate},
               {"name": "board.gatesim_scenario_s", "value": 2, "unit": "s", "params": gate}]
    text = markdown(results)
    assert "**67.97 MHz achieved for 60.0 MHz** (nextpnr report, placement seed 2; placed " \
           "and routed against 69.0 MHz" in text, text
    assert "SDRAM (32MB, CL 2, read delay 1, its clock 310.5° behind the system clock)" in text
    assert "native 4-bit mode at 15.0 MHz" in text
    assert "{'regions': 4}; system clock 60 MHz, SDRAM read delay 1) on Verilator" in text
    results[2]["params"] = results[3]["params"] = dict(gate, sys_hz=40e6, sdram_read_delay=0)
    assert "system clock 40 MHz, SDRAM read delay 0, not the 60 MHz of the build above" \
        in markdown(results)

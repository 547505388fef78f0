"""The full top on the ULX3S-85F: bitstream build, Fmax and utilisation (about 20 minutes).

Set ``RINGKV_BENCH_BOARD_REPORT=1`` to read the figures of the last ``ringkv build`` (its
nextpnr ``report.json``) instead of building again.
"""

import os

from bench.run import table

TITLE = "Whole device on the ULX3S-85F (board build)"


def run():
    from ringkv.boards.build import build, report_figures
    from ringkv.boards.ulx3s import ULX3STop
    if os.environ.get("RINGKV_BENCH_BOARD_REPORT"):
        from ringkv.boards.build import _REPO
        r = report_figures(_REPO / "build" / "ulx3s-85f", ULX3STop())
    else:
        r = build("ulx3s-85f")
    params = {k: r[k] for k in ("board", "target_mhz", "utilization", "config", "regions",
                                "uart_baud", "sd_spi_mhz")}
    return [{"name": "board.fmax", "value": r["fmax_mhz"], "unit": "MHz", "params": params}]


def markdown(results):
    r = results[0]
    p = r["params"]
    u = p["utilization"]
    cfg = ", ".join(f"{k}={v}" for k, v in p["config"].items())
    rows = [[k, u[k]["used"], u[k]["available"], f"{100 * u[k]['used'] / u[k]['available']:.1f} %"]
            for k in ("TRELLIS_COMB", "TRELLIS_FF", "DP16KD", "MULT18X18D", "EHXPLLL",
                      "TRELLIS_IO") if k in u]
    return (f"`make bitstream BOARD=ulx3s-85f`: `RingKVTop` ({cfg}; {p['regions']} storage "
            f"regions) + UART at {p['uart_baud']} baud + SD card in SPI mode at "
            f"{p['sd_spi_mhz']} MHz, PLL from the 25 MHz oscillator. Placed and routed, not "
            f"out of context. System clock: **{r['value']:.2f} MHz achieved for "
            f"{p['target_mhz']} MHz** (nextpnr report).\n\n"
            + table(["cell", "used", "available", "share"], rows))

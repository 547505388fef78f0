"""The switch to a resident conversation (issue #35, item 5): the DMA engine's import of one
record from its SDRAM slot, exact clocks, on a storage path of bytes and on the four-byte
import.

``ringkv.sim.tiered_sim.switch_clocks`` in the Amaranth simulator: the DMA engine, the tiered
storage, the SDRAM sector store and the SDRAM controller at half rate (the system clock at
60 MHz, the SDRAM at 120, CL 3, BL 8, the MT48LC16M16A2-6A on the strict pin-level model; the
card side the sector model at a byte a clock, which the import never reads). The record is
exported first (to the card and the slot); the import must hit the slot and restore the rings
(checked). Clocks from the DMA command's transfer to its response's; the time at the board's
60 MHz. ``width`` 1: a byte a clock end to end (today's board at either SDRAM rate); 4: the
engine, the tier and the store on four-byte words (``RingKVTop(storage_width=4)``, the board
at ``--sdram-rate 2``). The smoke run: a small record.
"""

from ringkv.defs.config import DEFAULT_CONFIG, RingKVConfig
from ringkv.defs.record import RecordLayout

from .run import table

TITLE = "The switch to a resident conversation (an import from the SDRAM hot tier)"

MHZ = 60.0
#: (name, config, tokens): the default shape with a full window, and the smoke run's record
SHAPES = (("default_n128", DEFAULT_CONFIG, 128),)
SMOKE = (("l1_w8_n8", RingKVConfig(layers=1, q_heads=2, kv_heads=2, head_dim=16, window=8,
                                   max_tokens=64), 8),)


def run(smoke: bool = False):
    from ringkv.defs.sdram import DEFAULT_CHIP
    from ringkv.sim.tiered_sim import switch_clocks

    out = []
    for name, config, count in SMOKE if smoke else SHAPES:
        lay = RecordLayout(config)
        for width in (1, 4):
            r = switch_clocks(config, count, mhz=MHZ, width=width)
            params = {"layers": config.layers, "kv_heads": config.kv_heads,
                      "head_dim": config.head_dim, "window": config.window,
                      "numerics": config.numerics, "tokens": count,
                      "record_bytes": lay.record_bytes(count), "sectors": r["sectors"],
                      "kv_sectors": r["kv_sectors"], "width": width, "mhz": MHZ,
                      "sdram": f"{DEFAULT_CHIP.name}, half rate (120 MHz), CL 3, BL 8",
                      "export_clocks": r["export"]}
            out.append({"name": f"switch.{name}.w{width}_clocks", "unit": "clocks",
                        "value": r["import_sdram"], "params": params})
            out.append({"name": f"switch.{name}.w{width}_ms", "unit": "ms",
                        "value": round(r["import_sdram"] / (MHZ * 1e3), 4),
                        "params": params})
    return out


def markdown(results):
    rows = []
    clocks = {r["name"]: r for r in results if r["name"].endswith("_clocks")}
    for name in sorted({n.rsplit(".", 1)[0] for n in clocks}):
        for width in (1, 4):
            r = clocks.get(f"{name}.w{width}_clocks")
            if r is None:
                continue
            p = r["params"]
            rows.append([f"{p['layers']} layers x {p['kv_heads']} KV heads x {p['head_dim']}, "
                         f"W {p['window']}, {p['numerics']}, n = {p['tokens']}",
                         p["record_bytes"], p["sectors"],
                         "4 bytes" if width == 4 else "1 byte", r["value"],
                         f"{r['value'] / (p['mhz'] * 1e3):.3f}"])
    text = ("The DMA engine's import of one record from its SDRAM slot (`ringkv.sim.tiered_sim."
            "switch_clocks`, Amaranth simulator; the SDRAM controller at half rate: the system "
            "clock at 60 MHz, the SDRAM at 120, CL 3, BL 8, MT48LC16M16A2-6A on the strict "
            "pin-level model), exact clocks from the DMA command to its response, the rings "
            "checked; on a path of bytes and on four-byte words (`RingKVTop(storage_width=4)`, "
            "the board's `--sdram-rate 2`). Issue #35's target: under 1 ms.\n\n")
    return text + table(["record", "bytes", "sectors read", "transfer", "clocks",
                         "ms at 60 MHz"], rows)

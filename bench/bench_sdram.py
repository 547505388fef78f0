"""SDRAM controller: data-bus efficiency on sequential bursts and on random 32-byte accesses
(exact clocks, Amaranth simulator on the pin-level model), and synthesis on the LFE5U-85F;
the SDRAM sector store (``hw/storage/sdram_store.py``, the DMA's storage port over one SDRAM
port): exact clocks of a write and a read of 1, 8 and 256 sectors (256 sectors = 128 KB, the
K/V of one conversation at the default shape: what a switch to a conversation resident in
SDRAM moves through the port), against the issue's 1 ms switch target; the tiered storage
(``hw/storage/tiered.py``): exact clocks of the DMA's import of a record from the SDRAM slot
against one from the SD card (and its export to both), and the conversations resident in 32 and
64 MB of SDRAM at the default shape, whole slots against the board's compact slots."""

import random

from bench.run import SYNTH_HEADER, synth_or_elaborate, synth_result, synth_rows, table
from ringkv.defs.config import RingKVConfig
from ringkv.defs.hot_tier import BOARD_SLOT_TOKEN_SECTORS, residents, slot_sectors
from ringkv.defs.record import RecordLayout
from ringkv.defs.sdram import DEFAULT_CHIP
from ringkv.host.golden.sdram import SdramGolden, refresh_ceiling, refresh_interval
from ringkv.hw.sdram.controller import SdramController
from ringkv.sim.sdram_model import SdramModel
from ringkv.sim.sdram_store_sim import transfer_clocks
from ringkv.sim.sdram_traffic import run_traffic

TITLE = "SDRAM controller"


def _script(kind: str, rng, chip, bl: int, words: int):
    """``seq_read``/``seq_write``: one stream of ``words`` from word 0 in commands of 64
    bursts; ``rand_read``/``rand_write``/``rand_mixed``: 32-byte accesses (16 words) at
    random 32-byte-aligned addresses over the whole chip."""
    out = []
    if kind.startswith("seq"):
        step = 64 * bl
        for addr in range(0, words, step):
            if kind == "seq_write":
                data = [rng.randrange(1 << 16) for _ in range(step)]
                out.append(("w", addr, data, [0] * step))
            else:
                out.append(("r", addr, step))
        return out
    for _ in range(words // 16):
        addr = rng.randrange(chip.words // 16) * 16
        write = kind == "rand_write" or (kind == "rand_mixed" and rng.random() < 0.5)
        if write:
            data = [rng.randrange(1 << 16) for _ in range(16)]
            out.append(("w", addr, data, [0] * 16))
        else:
            out.append(("r", addr, 16))
    return out


def measure(kind: str, *, mhz: float, cl: int, bl: int = 8, words: int, ports: int = 1,
            seed: int = 0, rate: int = 1) -> dict:
    """Run the traffic; efficiency = words moved / SDRAM clocks from the first to the last
    word on DQ (refreshes, row misses and turnarounds inside count against it). ``mhz`` is the
    controller's clock; at ``rate`` 2 the SDRAM's is twice it."""
    chip = DEFAULT_CHIP.scaled(power_up_ns=1000)     # a short power-up: not measured
    tck = 1000 / mhz
    ctrl = SdramController(chip, tck_ns=tck, cl=cl, bl=bl, ports=ports,
                           fifo_depth=max(64, 4 * bl), rate=rate)
    rng = random.Random(seed)
    scripts = [_script(kind, rng, chip, bl, words // ports) for _ in range(ports)]
    if kind.startswith("seq") and ports > 1:
        raise ValueError("sequential runs use one port")
    model = SdramModel(chip, tck / rate, seed=seed)
    # the tail lets the last write bursts leave their FIFO after the port's last transfer
    result = run_traffic(ctrl, scripts, model=model, seed=seed, tail=300)
    for p, script in enumerate(scripts):   # every read checked against the golden model
        golden, reads = SdramGolden(), iter(result.reads[p])
        for op in script:
            if op[0] == "w":
                golden.write(op[1], op[2], op[3])
            else:
                addr, got = next(reads)
                assert golden.matches(addr, got), f"{kind}: read at {addr} differs"
    assert model.violations == []
    moved = sum(len(op[2]) if op[0] == "w" else op[2] for script in scripts for op in script)
    assert len(model.data_clocks) == moved, (kind, len(model.data_clocks), moved)
    clocks = model.data_clocks[-1] - model.data_clocks[0] + 1
    # the refresher's bus time, tRP + tRFC in controller clocks, against its interval, in
    # SDRAM clocks
    interval = refresh_interval(chip, tck)
    busy = chip.timing(tck / rate).at_rate(rate)
    return {"words": len(model.data_clocks), "clocks": clocks,
            "efficiency": len(model.data_clocks) / clocks,
            "us": round(clocks * tck / rate / 1000, 3),
            "refresh_interval": interval,
            "ceiling": refresh_ceiling(busy, interval)}


#: (controller MHz, CL, rate): at rate 2 the SDRAM runs at twice the MHz
CASES = [(60, 2, 1), (60, 3, 1), (100, 2, 1), (100, 3, 1), (60, 2, 2), (60, 3, 2)]
KINDS = ("seq_read", "seq_write", "rand_read", "rand_write", "rand_mixed")
#: the K/V of one conversation at the default shape, in 16-bit words (128 KB)
SWITCH_WORDS = 65536


def run(smoke: bool = False):
    results = []
    cases = [CASES[0], CASES[-1]] if smoke else CASES
    for mhz, cl, rate in cases:
        # (the smoke run: every kind at rate 1, two at half rate)
        for kind in KINDS if not smoke or rate == 1 else ("seq_read", "rand_mixed"):
            words = (1024 if kind.startswith("seq") else 256) if smoke else (
                8192 if kind.startswith("seq") else 2048)
            r = measure(kind, mhz=mhz, cl=cl, words=words, rate=rate)
            results.append({"name": f"sdram.efficiency.{kind}", "unit": "fraction",
                            "value": round(r["efficiency"], 4),
                            "params": {"chip": DEFAULT_CHIP.name, "mhz": mhz, "cl": cl, "bl": 8,
                                       "rate": rate, "sdram_mhz": mhz * rate,
                                       "ports": 1, "words": r["words"], "clocks": r["clocks"],
                                       "refresh_interval_clocks": r["refresh_interval"],
                                       "refresh_ceiling": round(r["ceiling"], 4)}})
    if not smoke:
        # the switch's raw transfer at half rate: 128 KB read in one stream, 60 MHz controller,
        # the SDRAM at 120 MHz
        for cl in (2, 3):
            r = measure("seq_read", mhz=60, cl=cl, words=SWITCH_WORDS, rate=2)
            results.append({"name": f"sdram.half_rate.read_128kb_cl{cl}_us", "unit": "us",
                            "value": r["us"],
                            "params": {"chip": DEFAULT_CHIP.name, "mhz": 60, "sdram_mhz": 120,
                                       "rate": 2, "cl": cl, "bl": 8, "ports": 1,
                                       "words": r["words"], "sdram_clocks": r["clocks"],
                                       "efficiency": round(r["efficiency"], 4),
                                       "from": "first word on DQ", "to": "last word on DQ"}})
    if not smoke:
        r = measure("rand_mixed", mhz=60, cl=2, words=2048, ports=2)
        results.append({"name": "sdram.efficiency.rand_mixed", "unit": "fraction",
                        "value": round(r["efficiency"], 4),
                        "params": {"chip": DEFAULT_CHIP.name, "mhz": 60, "cl": 2, "bl": 8,
                                   "ports": 2, "words": r["words"], "clocks": r["clocks"],
                                   "refresh_interval_clocks": r["refresh_interval"],
                                   "refresh_ceiling": round(r["ceiling"], 4)}})
    results += _store(smoke)
    results += _tier(smoke)
    ctrl = SdramController(DEFAULT_CHIP, tck_ns=1000 / 60, cl=2, bl=8, ports=2)
    synth = synth_or_elaborate(ctrl, "sdram_controller", smoke=smoke, freq_mhz=60)
    if synth is not None:
        results.append(synth_result("sdram_controller",
                                    {"chip": DEFAULT_CHIP.name, "cl": 2, "bl": 8, "ports": 2},
                                    synth))
    # half rate: the controller at 60 MHz, the PHY's registers at 120 MHz
    half = SdramController(DEFAULT_CHIP, tck_ns=1000 / 60, cl=3, bl=8, ports=2, rate=2)
    synth = synth_or_elaborate(half, "sdram_controller_half", smoke=smoke, freq_mhz=60,
                               clocks={"sync2x_clk": 120})
    if synth is not None:
        entry = synth_result("sdram_controller_half",
                             {"chip": DEFAULT_CHIP.name, "cl": 3, "bl": 8, "ports": 2,
                              "rate": 2}, synth)
        entry["params"].update(fast_clock=synth["clocks"]["sync2x_clk"],
                               cross_domain_ns=synth["cross_domain_ns"])
        results.append(entry)
    return results


STORE_COUNTS = (1, 8, 256)


def _store(smoke: bool) -> list:
    """The sector store's exact clocks at 60 MHz, CL 2, BL 8 (a short power-up, not measured)."""
    mhz, counts = 60, (1, 8) if smoke else STORE_COUNTS
    chip = DEFAULT_CHIP.scaled(power_up_ns=1000)
    clocks = transfer_clocks(dict(chip=chip, tck_ns=1000 / mhz, cl=2, bl=8), counts)
    out = []
    for (op, count), n in sorted(clocks.items(), key=lambda kv: (kv[0][1], kv[0][0] != "w")):
        out.append({"name": f"sdram.store.{'write' if op == 'w' else 'read'}{count}_clocks",
                    "unit": "clocks", "value": n,
                    "params": {"chip": DEFAULT_CHIP.name, "mhz": mhz, "cl": 2, "bl": 8,
                               "sectors": count, "bytes": 512 * count,
                               "ms": round(n / (mhz * 1e3), 4),
                               "port_efficiency": round(512 * count / n, 5)}})
    return out


#: the small records of ``docs/blocks/tiered_storage.md``'s measured imports: (name, config,
#: tokens)
TIER_SHAPES = (
    ("l1_w8_n8", RingKVConfig(layers=1, q_heads=2, kv_heads=2, head_dim=16, window=8,
                              max_tokens=64), 8),
    ("l2_w32_n32", RingKVConfig(layers=2, q_heads=2, kv_heads=2, head_dim=16, window=32,
                                max_tokens=64), 32),
)
#: slot_token_sectors of the residents' figures: the board's compact slots, and every token
#: sector (64 at the default shape: the whole region)
TIER_T = (BOARD_SLOT_TOKEN_SECTORS, RecordLayout().token_sectors_max)


def _tier(smoke: bool) -> list:
    """The tiered storage: residents per 32/64 MB at the default shape (computed), and the
    exact clocks of ``ringkv.sim.tiered_sim.import_clocks`` (40 MHz; the smoke run: the
    smaller record only)."""
    from ringkv.sim.tiered_sim import import_clocks

    lay = RecordLayout()
    out = []
    for t in TIER_T:
        for mb in (32, 64):
            out.append({"name": f"sdram.tier.residents_{mb}mb_t{t}", "unit": "conversations",
                        "value": residents(mb << 20, lay, t),
                        "params": {"shape": "default", "sdram_mb": mb, "slot_token_sectors": t,
                                   "slot_sectors": slot_sectors(lay, t),
                                   "sectors_per_region": lay.sectors_per_region,
                                   "kv_sector": lay.kv_sector,
                                   "tokens_in_slot": t * 512 // lay.token_bytes,
                                   "max_tokens": lay.config.max_tokens}})
    for name, config, count in TIER_SHAPES[:1] if smoke else TIER_SHAPES:
        r = import_clocks(config, count)
        params = {"layers": config.layers, "kv_heads": config.kv_heads,
                  "head_dim": config.head_dim, "window": config.window,
                  "max_tokens": config.max_tokens, "tokens": count, "sectors": r["sectors"],
                  "mhz": 40, "card": "SD native, SD CLK = clk/2, 4-bit bus",
                  "sdram": f"{DEFAULT_CHIP.name}, CL 2, BL 8"}
        for key in ("import_card", "import_sdram"):
            out.append({"name": f"sdram.tier.{name}.{key}_clocks", "unit": "clocks",
                        "value": r[key], "params": params})
        out.append({"name": f"sdram.tier.{name}.export_clocks", "unit": "clocks",
                    "value": r["export"][0], "params": {**params, "exports": r["export"]}})
    return out


def _tier_markdown(results) -> str:
    res = [r for r in results if r["name"].startswith("sdram.tier.residents_")]
    clk = {r["name"]: r for r in results if r["name"].startswith("sdram.tier.")
           and r["name"].endswith("_clocks")}
    if not res and not clk:
        return ""
    text = ("\n\nThe tiered storage (`hw/storage/tiered.py`: the SD card behind the SDRAM hot "
            "tier). Conversations resident at the default shape (321 sectors a region: the "
            "header, 64 token sectors, 256 K/V sectors; `ringkv.defs.hot_tier.residents`): a "
            "slot holds the header, `slot_token_sectors` token sectors and the K/V; a longer "
            "conversation's tokens are read from the card.\n\n")
    text += table(["slot_token_sectors", "tokens in the slot", "slot sectors", "SDRAM MB",
                   "resident"],
                  [[r["params"]["slot_token_sectors"], r["params"]["tokens_in_slot"],
                    r["params"]["slot_sectors"], r["params"]["sdram_mb"], r["value"]]
                   for r in res])
    rows = []
    for name, _, _ in TIER_SHAPES:
        keys = [f"sdram.tier.{name}.{k}_clocks" for k in ("import_card", "import_sdram",
                                                          "export")]
        if not all(k in clk for k in keys):
            continue
        card, sd, exp = (clk[k] for k in keys)
        p = card["params"]
        layers = f"{p['layers']} layer" + ("s" if p["layers"] > 1 else "")
        rows.append([f"{layers}, {p['kv_heads']} KV heads x {p['head_dim']}, "
                     f"W {p['window']}, n = {p['tokens']}", p["sectors"], card["value"],
                     sd["value"], f"{card['value'] / sd['value']:.1f}x", exp["value"]])
    if rows:
        text += ("\n\nExact clocks of the DMA engine's import of one record through the tier "
                 "(`ringkv.sim.tiered_sim.import_clocks`, 40 MHz, Amaranth simulator), from the "
                 "DMA command to its response: from the card (the SD native controller, SD CLK "
                 "= clk/2, on the bit-level 4-bit card model) against from the SDRAM slot (the "
                 "sector store on the SDRAM controller and the pin-level model), and the "
                 "export, written to both tiers (paced by the card).\n\n")
        text += table(["record", "sectors read", "import from the card", "import from SDRAM",
                       "ratio", "export (both tiers)"], rows)
    return text


def markdown(results):
    eff = [r for r in results if r["name"].startswith("sdram.efficiency")]
    rows = [[r["name"].split(".")[-1], r["params"]["mhz"],
             r["params"].get("sdram_mhz", r["params"]["mhz"]), r["params"]["cl"],
             r["params"]["ports"], r["params"]["words"], r["params"]["clocks"],
             f"{100 * r['value']:.1f} %", f"{100 * r['params']['refresh_ceiling']:.1f} %"]
            for r in eff]
    text = ("Data-bus efficiency: 16-bit words moved per SDRAM clock, from the first word on DQ "
            "to the last (refreshes, row misses, bus turnarounds included), "
            "MT48LC16M16A2-6A timings, "
            "burst length 8, one command of 64 bursts at a time for the sequential runs "
            "(`seq_*`, from word 0 over 16 rows) and 32-byte accesses (16 words) at random "
            "aligned addresses for the random ones. Exact clocks from the Amaranth simulator on "
            "the pin-level model (no violation; every read equal to the golden model). "
            "`ceiling`: every clock a word but the clocks the refresher holds the bus "
            "(tRP + tRFC per refresh interval; `ringkv.host.golden.sdram.refresh_ceiling`). "
            "Where the SDRAM's MHz is twice the controller's, the controller runs at half rate "
            "(`SdramController(rate=2)`: the PHY's registers at the SDRAM clock, two words a "
            "controller clock; `docs/blocks/sdram.md`, \"Half rate\").\n\n")
    text += table(["traffic", "controller MHz", "SDRAM MHz", "CL", "ports", "words",
                   "SDRAM clocks", "efficiency", "ceiling"], rows)
    switch = [r for r in results if r["name"].startswith("sdram.half_rate.read_128kb")]
    if switch:
        text += ("\n\nThe switch's raw transfer at half rate: 128 KB (65,536 words, the K/V of "
                 "one conversation at the default shape) read in one stream, the controller at "
                 "60 MHz and the SDRAM at 120 MHz, from the first word on DQ to the last "
                 "(exact clocks, pin-level model). The whole switch, the DMA's import from a "
                 "slot through the sector store's wide port and the four-byte path into the "
                 "rings, is the `switch` group's.\n\n")
        text += table(["CL", "SDRAM clocks", "efficiency", "us"],
                      [[r["params"]["cl"], r["params"]["sdram_clocks"],
                        f"{100 * r['params']['efficiency']:.1f} %", r["value"]]
                       for r in switch])
    store = [r for r in results if r["name"].startswith("sdram.store.")]
    if store:
        text += ("\n\nThe SDRAM sector store (`hw/storage/sdram_store.py`: the DMA's storage "
                 "port over one SDRAM port; 1 byte a clock on the byte port, half of what the "
                 "16-bit SDRAM moves; the wide port at half rate is in `sdram_store.md`): "
                 "exact clocks from the command offered to the status taken, a "
                 "write then a read of the same sectors, the controller on the pin-level model "
                 "(every read equal to what was written). 256 sectors (128 KB) are the K/V of "
                 "one conversation at the default shape: issue #35's switch target is under "
                 "1 ms.\n\n")
        text += table(["transfer", "sectors", "clocks", "ms at 60 MHz", "bytes per clock"],
                      [["write" if ".write" in r["name"] else "read",
                        r["params"]["sectors"], r["value"], r["params"]["ms"],
                        r["params"]["port_efficiency"]] for r in store])
    text += _tier_markdown(results)
    text += ("\n\nSynthesis (out of context, 2 ports, BL 8, target 60 MHz; CL 2 at rate 1, CL 3 "
             "at half rate):\n\n")
    text += table(SYNTH_HEADER, synth_rows(results))
    for r in results:
        fast = r["params"].get("fast_clock") if r["unit"] == "MHz" else None
        if fast:
            cross = "; ".join(f"{k}: {v} ns" for k, v in r["params"]["cross_domain_ns"].items())
            text += (f"\n\n{r['params']['core']}: the PHY's fast domain (`sync2x`) reaches "
                     f"{fast['fmax_mhz']} MHz against {fast['target_mhz']}; the longest paths "
                     f"between the domains (nextpnr times them as unrelated clocks; each has "
                     f"one fast period, {1000 / fast['target_mhz']:.2f} ns, as the domains "
                     f"share their edges): {cross}.")
    return text

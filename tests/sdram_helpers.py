"""Shared by the SDRAM controller's tests (``tests/hw/sdram``): scaled chips, traffic scripts,
and a run on the pin-level model checked against the golden model."""

from ringkv.defs.sdram import CHIPS
from ringkv.host.golden.sdram import SdramGolden
from ringkv.sim.sdram_model import SdramModel
from ringkv.sim.sdram_traffic import run_traffic


def small(name="MT48LC16M16A2-7E", **changes):
    return CHIPS[name].scaled(**{"power_up_ns": 500, **changes})


def overlapping_script(rng, chip, bl, n, base, region=8):
    """Writes and reads on a small region with many rows: overwrites, masks, row misses."""
    out = []
    for _ in range(n):
        count = rng.randrange(1, 4)
        addr = (base + rng.randrange(region) * rng.choice((1, chip.cols, 2 * chip.cols,
                                                           chip.cols * chip.banks))) % chip.words
        addr &= ~(bl - 1)
        addr = min(addr, chip.words - count * bl)
        if rng.random() < 0.55:
            data = [rng.randrange(1 << 16) for _ in range(count * bl)]
            out.append(("w", addr, data, [rng.choice((0, 0, 1, 2, 3)) for _ in data]))
        else:
            out.append(("r", addr, count * bl))
    return out


def thrash_script(rng, chip, bl, n, base):
    """Single bursts on three rows of one bank (the first twice as often): a row miss most of
    the time (ACTIVE, PRECHARGE, ACTIVE at the tRAS/tRP/tRC limits) and a hit now and then,
    also after a refresh closed the row."""
    out = []
    for _ in range(n):
        addr = (base + rng.choice((0, 0, 1, 2)) * chip.cols * chip.banks
                + rng.randrange(0, 32, bl)) % chip.words
        if rng.random() < 0.5:
            data = [rng.randrange(1 << 16) for _ in range(bl)]
            out.append(("w", addr, data, [0] * bl))
        else:
            out.append(("r", addr, bl))
    return out


def check_reads(scripts, result) -> int:
    """Mismatched reads against the golden model (each port has its own region)."""
    bad = 0
    for p, script in enumerate(scripts):
        golden = SdramGolden()
        reads = iter(result.reads[p])
        for op in script:
            if op[0] == "w":
                golden.write(op[1], op[2], op[3])
            else:
                addr, got = next(reads)
                assert addr == op[1] and len(got) == op[2]
                bad += not golden.matches(addr, got)
    return bad


def run(ctrl, scripts, *, strict=True, seed=0, idle=0.3, stall=0.3, **kw):
    model = SdramModel(ctrl.chip, ctrl.sdram_tck_ns, strict=strict, seed=seed)
    result = run_traffic(ctrl, scripts, model=model, seed=seed, idle=idle, stall=stall, **kw)
    return result, check_reads(scripts, result)


def port_scripts(rng, chip, bl, ports, n):
    # each port in its own quarter of the chip, so that the golden model of a port is exact
    quarter = chip.words // 4
    return [overlapping_script(rng, chip, bl, n, base=p * quarter + rng.randrange(quarter))
            for p in range(ports)]

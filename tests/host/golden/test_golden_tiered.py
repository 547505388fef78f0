"""The tiered storage's golden model (``host/golden/tiered.py``) on its own, pure Python: its
rules keep the SDRAM copies equal to the card over long random traffic with failures and power
cuts (the gateware is compared with this model in ``tests/hw/storage/test_tiered.py``; here
the model's rules themselves are checked, at a volume the simulator cannot reach).

Both media are dictionaries of sector contents. A write's sectors land on each medium in order
until that medium's failure point (a failed sector is torn: neither old nor new), a power cut
leaves the card as it is and the SDRAM as noise; every read the model sends to SDRAM must find
there exactly what the card holds."""

import random

import pytest

from ringkv.host.golden.tiered import OK, READ, WRITE, GoldenTieredStorage

FAILED = 3      # any error code


def _random_op(rng, params, card_sectors, shapes):
    spr, base, regions = params["sectors_per_region"], params["base_lba"], params["regions"]
    roll = rng.random()
    r = rng.randrange(regions)
    kv = params.get("kv_sector") or max(2, spr // 2)
    if roll < 0.4:
        t, k = rng.randint(1, kv - 1), rng.randint(1, spr - kv)
        shapes[r] = (t, k)
        ops = [(WRITE, base + r * spr + 1, t), (WRITE, base + r * spr + kv, k),
               (WRITE, base + r * spr, 1)]
        return ops[:rng.randint(1, 3)] if rng.random() < 0.1 else ops
    if roll < 0.7 and shapes:
        r = rng.choice(sorted(shapes))
        t, k = shapes[r]
        return [(READ, base + r * spr, 1), (READ, base + r * spr + 1, t),
                (READ, base + r * spr + kv, k)]
    lba = rng.randrange(card_sectors)
    count = rng.choice([0, 1, 1, 2, spr])
    return [(rng.choice([READ, WRITE]), lba, count)]


@pytest.mark.parametrize("params", [
    dict(regions=4, sectors_per_region=4, base_lba=2, slots=2),
    dict(regions=8, sectors_per_region=7, base_lba=0, slots=3, sdram_base=3),
    dict(regions=16, sectors_per_region=5, base_lba=9, slots=5, stamp_width=3),
    # compact slots: sectors 3..4 of each region (the gap) are never in SDRAM
    dict(regions=8, sectors_per_region=9, base_lba=1, slots=3, sdram_base=2, kv_sector=5,
         slot_token_sectors=1),
    dict(regions=4, sectors_per_region=6, base_lba=0, slots=2, kv_sector=3,
         slot_token_sectors=0),
], ids=["4x4-2", "8x7-3", "16x5-5", "8x9-3-gap", "4x6-2-gap"])
def test_sdram_serves_only_the_cards_bytes(params):
    rng = random.Random(str(params))
    g = GoldenTieredStorage(**params)
    card_sectors = params["base_lba"] + params["regions"] * params["sectors_per_region"] + 2
    sdram_sectors = params.get("sdram_base", 0) + params["slots"] * g.slot_sectors
    card = {lba: ("init", lba) for lba in range(card_sectors)}
    sdram = {lba: ("noise", rng.random()) for lba in range(sdram_sectors)}
    shapes, served, commits, n = {}, 0, 0, 0
    while n < 20_000:
        if rng.random() < 0.002:                             # power cut
            g.power_cut()
            sdram = {lba: ("noise", rng.random()) for lba in range(sdram_sectors)}
            continue
        for op, lba, count in _random_op(rng, params, card_sectors, shapes):
            n += 1
            route = g.command(op, lba, count)
            if route.tier != "card":       # inside the (compact) slots, never in the gap
                assert route.sdram_lba + count <= sdram_sectors, (n, lba, count)
                assert not g.in_gap((lba - params["base_lba"]) % params["sectors_per_region"],
                                    count)
            in_card = count > 0 and lba + count <= card_sectors
            if op == READ:
                if route.tier == "sdram":
                    served += 1
                    got = [sdram[route.sdram_lba + i] for i in range(count)]
                    assert got == [card[lba + i] for i in range(count)], (n, lba, count)
                continue
            value = ("write", n)
            # each medium takes the sectors up to its failure point (the failing one torn)
            fail = {m: (rng.randrange(count) if count and rng.random() < 0.05 else None)
                    for m in ("card", "sdram")}
            errors = {}
            for medium, store, at in (("card", card, lba), ("sdram", sdram, route.sdram_lba)):
                if medium == "sdram" and route.tier != "both":
                    continue
                ok = in_card or medium == "sdram"
                if not ok:
                    errors[medium] = FAILED
                    continue
                stop = fail[medium]
                for i in range(count if stop is None else stop + 1):
                    store[at + i] = value if i != stop else ("torn", n)
                errors[medium] = OK if stop is None else FAILED
            if route.tier == "both":
                before = len(g.resident())
                status, _ = g.finish(errors["card"], errors["sdram"])
                assert status == errors["card"]
                commits += len(g.resident()) > before
    assert served > 1000 and commits > 100

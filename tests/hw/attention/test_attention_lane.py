"""The attention core's lanes (``hw/attention/lane.py``): after phase B of every token, each
lane's online-softmax state ``(m, l, acc)`` equals the golden model's ``lane_state`` over the
lane's valid slots, in every numerics. The lanes run inside the core, driven by its sequencer
(the schedule is the core's), and are sampled when the merge begins."""

import numpy as np
import pytest

from ringkv.host.golden.fixed import FixedRingCore, lane_state
from ringkv.hw.attention.core import AttentionCore
from ringkv.hw.attention.lane import PH_M, AttentionLane, LaneParams
from ringkv.sim.attention_sim import core_params, rtl_run

CONFIGS = [
    dict(layers=1, q_heads=4, kv_heads=2, head_dim=8, window=8, lanes=2, macs=2),
    dict(layers=1, q_heads=3, kv_heads=1, head_dim=4, window=8, lanes=4, macs=1,
         numerics="ringkv-fx2"),
    dict(layers=2, q_heads=2, kv_heads=1, head_dim=8, window=4, lanes=1, macs=8,
         numerics="ringkv-fx1c", qkv_fracs=((4, 5, 6), (7, 8, 3))),
]


def expected_states(core, ops):
    """Per accepted ATTEND token, the golden ``lane_state`` of every lane (None: empty)."""
    p = core_params(core)
    model = FixedRingCore(**p["model"])
    W, P = core.window, core.lanes
    S = W // P
    states = []
    for op in ops:
        _, _, layer, kvh, count, q, k, v = op
        for t in range(count):
            model.attend(layer, kvh, q[t:t + 1], k[t:t + 1], v[t:t + 1])
            valid = min(int(model.count[layer * core.kv_heads + kvh]), W)
            ring = model.rings[layer, kvh]
            states.append([
                lane_state(q[t], ring[0, j * S:min((j + 1) * S, valid)],
                           ring[1, j * S:min((j + 1) * S, valid)], model.cs_layers[layer],
                           core.numerics)
                if valid > j * S else None
                for j in range(P)])
    return states


@pytest.mark.parametrize("config", CONFIGS,
                         ids=lambda c: c.get("numerics", "ringkv-fx1") + f"-P{c['lanes']}")
def test_lane_state_matches_golden(config):
    core = AttentionCore(**config)
    G, d, M, W = core.group, core.head_dim, core.macs, core.window
    CH = d // M
    rng = np.random.default_rng(core.lanes)
    lo, hi = core.numerics.qkv_min, core.numerics.qkv_max + 1
    ops = []
    for layer, count in ((0, W // 2 + 1), (core.layers - 1, W + 2), (0, 2)):
        q = rng.integers(lo, hi, (count, G, d))
        k = rng.integers(lo, hi, (count, d))
        v = rng.integers(lo, hi, (count, d))
        if count == 2:                  # the format's extremes: largest scores and sums
            q[:], k[:], v[:] = hi - 1, hi - 1, lo
        ops.append(("cmd", 0, layer, 0, count, q, k, v))
    got = []

    async def watch(ctx):
        was_merging = False
        while True:
            await ctx.tick()
            merging = ctx.get(core._phase) == PH_M
            if merging and not was_merging:
                token = []
                for ln in core._lanes:
                    st = ln._state
                    acc = [[ctx.get(st["acc"].data[g * CH + c])[k] for c in range(CH)
                            for k in range(M)] for g in range(G)]
                    token.append((ctx.get(ln.live), [ctx.get(x) for x in st["m"]],
                                  [ctx.get(x) for x in st["l"]], acc))
                got.append(token)
            was_merging = merging

    p = core_params(core)
    rtl_run(core, ops, checker=FixedRingCore(**p["model"]), watch=watch)
    want = expected_states(core, ops)
    assert len(got) == len(want) == sum(op[4] for op in ops)
    for n, (rtl, gold) in enumerate(zip(got, want)):
        for j, ((live, m, lsum, acc), state) in enumerate(zip(rtl, gold)):
            assert live == (state is not None), f"token {n} lane {j}"
            if state is None:
                continue
            assert m == list(state[0]), f"token {n} lane {j}: m"
            assert lsum == list(state[1]), f"token {n} lane {j}: l"
            assert acc == state[2].tolist(), f"token {n} lane {j}: acc"


def test_lane_parameter_errors():
    core = AttentionCore(layers=1, q_heads=2, kv_heads=1, head_dim=4, window=4, lanes=2,
                         macs=2)
    params = LaneParams.of(layers=1, kv_heads=1, head_dim=4, window=4, lanes=2, macs=2,
                           group=2, numerics=core.numerics, score_consts=core.score_consts)
    with pytest.raises(ValueError, match="index must be between 0 and 1, not 2"):
        AttentionLane(params, 2)
    with pytest.raises(TypeError, match="params must be a LaneParams"):
        AttentionLane({"lanes": 2}, 0)

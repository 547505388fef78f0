"""ringkv-fx1c's calibration: the rule, its reproducibility on the shipped trained models, the
fractions stored with the weights, and the trained model run in fx1c (golden; the Verilator
slice is the bench's ``model.rtl_identical``)."""

import dataclasses
import shutil

import numpy as np
import pytest

from ringkv.defs.config import (
    DEFAULT_CONFIG,
    DEMO_CONFIG,
    TRAINED_CONFIG,
    TRAINED_DEMO_CONFIG,
)
from ringkv.host.model.calibrate import (
    calibrate_fracs,
    calibrated_config,
    choose_fracs,
    write_fracs,
)
from ringkv.host.model.transformer import (
    BOS,
    FixedBackend,
    Float64Backend,
    Model,
    encode_text,
    weights_path,
)


def test_choose_fracs_rule():
    """Per layer and kind the largest F whose int8 range 127 * 2**-F clips at most the share;
    q/k refined (the coarser first) when the layer's score constant would be too large for the
    core, coarsened (the finer first) when it would be below 1."""
    a = np.linspace(0, 1, 100_001)
    acts = [[a * 7.9, a * 7.9, a * 1.9],           # ranges +-7.94 (F=4) and +-1.98 (F=6)
            [a * 8.1, a * 2.0, a * 0.1]]           # 8.1 > 127/16 on 2.0 % of q: F=3
    assert choose_fracs(acts, 64, 1e-4) == ((4, 4, 6), (3, 5, 10))
    # share 0.03: 8.1 clips 2 % at F=4 and 2.0 1 % at F=6, allowed
    assert choose_fracs(acts, 64, 0.03)[1] == (4, 6, 10)
    # d=8 (CS = 33428): Fq + Fk >= 9, the coarser of q, k (ties: q) is refined
    assert choose_fracs([[a * 7.9, a * 7.9, a]], 8, 1e-4) == ((5, 4, 6),)
    assert choose_fracs([[a * 15, a * 15, a]], 8, 1e-4) == ((5, 4, 6),)
    # all zero: 2**-15 everywhere would give a constant below 1 at d=64; Fq + Fk <= 24
    assert choose_fracs([[a * 0, a * 0, a * 0]], 64, 1e-4) == ((12, 12, 15),)


@pytest.mark.parametrize("config,trained", [(DEFAULT_CONFIG, TRAINED_CONFIG),
                                            (DEMO_CONFIG, TRAINED_DEMO_CONFIG)])
def test_shipped_fractions_are_the_calibrations(config, trained):
    """The calibration is deterministic: it gives the fractions stored with the weights again,
    and those are the configuration the board build (and demo/chat) use."""
    model = Model.trained(config)
    assert model.qkv_fracs == trained.qkv_fracs
    assert calibrated_config(config, model.qkv_fracs) == trained
    assert calibrate_fracs(model) == trained.qkv_fracs
    assert weights_path(config).stat().st_size < 2_000_000


def test_with_numerics():
    """The CLI's and simulators' --numerics: fx1c takes the shipped fractions of the shape."""
    from ringkv.defs.config import with_numerics
    assert with_numerics(DEFAULT_CONFIG, "ringkv-fx1c") == TRAINED_CONFIG
    assert with_numerics(DEMO_CONFIG, "ringkv-fx1c") == TRAINED_DEMO_CONFIG
    assert with_numerics(TRAINED_CONFIG, "ringkv-fx1") == DEFAULT_CONFIG
    assert with_numerics(TRAINED_CONFIG, None) is TRAINED_CONFIG
    with pytest.raises(ValueError, match="none ship for this shape"):
        with_numerics(dataclasses.replace(DEMO_CONFIG, window=64), "ringkv-fx1c")


def test_write_fracs_keeps_everything_else(tmp_path):
    path = tmp_path / "w.npz"
    shutil.copy(weights_path(DEMO_CONFIG), path)
    write_fracs(path, ((1, 2, 3), (4, 5, 6)))
    with np.load(weights_path(DEMO_CONFIG)) as a, np.load(path) as b:
        assert set(a.files) == set(b.files)
        for k in a.files:
            if k != "qkv_fracs":
                assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k
    assert Model.load(path, DEMO_CONFIG).qkv_fracs == ((1, 2, 3), (4, 5, 6))


def test_fx1c_follows_float64_on_the_trained_model():
    """fx1c of the trained demo model: the same greedy tokens as float64 on a prompt that
    wraps the ring (the bench measures the agreement on held-out text at the default shape);
    the per-layer fractions matter: the core at fx1's scales on these layers differs."""
    model = Model.trained(DEMO_CONFIG)
    prompt = [BOS] + encode_text("Then Jesus answered and said unto them, Verily, verily, "
                                 "I say unto you")
    a = model.generate(prompt, 0, Float64Backend(DEMO_CONFIG), 16, chunk=32)
    b = model.generate(prompt, 0, FixedBackend(TRAINED_DEMO_CONFIG), 16, chunk=32)
    assert a == b
    q = np.random.default_rng(0).standard_normal((3, 4, 16)) * 3
    kv = np.random.default_rng(1).standard_normal((2, 3, 2, 16)) * 3
    fx1 = dataclasses.replace(DEMO_CONFIG, numerics="ringkv-fx1")
    outs = [FixedBackend(c).prefill(0, q, kv[0], kv[1] / 4) for c in (TRAINED_DEMO_CONFIG, fx1)]
    assert not np.array_equal(*outs)

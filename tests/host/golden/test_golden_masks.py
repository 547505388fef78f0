"""Sliding-window masks: full masks, the compressed 512x512 mask and its block-tiled use."""

import numpy as np
import pytest

from ringkv.host.golden.masks import (
    COMPRESSED_MASK_SIZE,
    MASK_VALUE,
    compressed_block_size,
    compressed_mask_true_size,
    masked_attention,
    swa_mask_additive,
    swa_mask_bool,
    swa_mask_compressed,
    tiled_mask_assemble,
    tiled_mask_block,
    tiled_swa_attention,
)
from ringkv.host.golden.swa import positions_mask, swa_attention


def cpp_mask(size, window, masked):
    """The reference generator's C++ loop (``create_attention_mask``), row index fixed to the
    mask's size."""
    m = np.full((size, size), masked)
    for i in range(size):
        offset = i - window + 1 if i >= window else 0
        m[i, offset:i + 1] = 0.0
    return m


def cpp_true_size(window, head_size):
    """The reference generator's C++ ``blockSize``/``compressWindow``."""
    b = (16384 // head_size // 16 * 16) if head_size > 128 else 128
    return 2 * b + window % b if window > 3 * b else window


# ---- full masks ------------------------------------------------------------------------------

def test_seed_example_5x5_window3():
    want = np.array([[0, 1, 1, 1, 1],
                     [0, 0, 1, 1, 1],
                     [0, 0, 0, 1, 1],
                     [1, 0, 0, 0, 1],
                     [1, 1, 0, 0, 0]], dtype=np.uint8)
    assert np.array_equal(swa_mask_bool(5, 3), want)
    assert np.array_equal(swa_mask_additive(5, 3), want * MASK_VALUE)
    assert swa_mask_bool(5, 3).dtype == np.uint8


@pytest.mark.parametrize("max_seq", [1, 2, 5, 17, 64])
@pytest.mark.parametrize("window", [1, 2, 3, 4, 16, 64, 100])
def test_full_masks_match_cpp_and_spec_window(max_seq, window):
    add, boo = swa_mask_additive(max_seq, window), swa_mask_bool(max_seq, window)
    assert np.array_equal(add, cpp_mask(max_seq, window, MASK_VALUE))
    assert np.array_equal(boo, cpp_mask(max_seq, window, 1.0))
    pos = np.arange(max_seq)
    keep = positions_mask(pos, pos, window, True)  # docs/CONVENTIONS.md#window: i - W < j <= i
    assert np.array_equal(boo == 0, keep) and np.array_equal(add == 0, keep)
    assert list((boo == 0).sum(axis=1)) == [min(i + 1, window) for i in pos]  # W keys incl. self
    if window >= max_seq:  # the reference: then the mask is the plain causal (upper-triangle) mask
        assert np.array_equal(boo, np.triu(np.ones((max_seq, max_seq)), 1))


def test_window_prose_is_off_by_one():
    """"Skip when m - n > windowLen" keeps W + 1 keys; the reference's code (and RingKV's
    window) keeps W."""
    W, S = 3, 10
    m, n = np.arange(S)[:, None], np.arange(S)[None, :]
    prose_masked = (n > m) | (m - n > W)
    code_masked = swa_mask_bool(S, W).astype(bool)
    assert not np.array_equal(prose_masked, code_masked)
    assert np.array_equal(prose_masked, swa_mask_bool(S, W + 1).astype(bool))
    assert (~prose_masked).sum(axis=1).max() == W + 1


def test_mask_argument_checks():
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError):
            swa_mask_additive(4, bad)
    with pytest.raises(ValueError):
        swa_mask_compressed(4, 64, form="float")
    with pytest.raises(ValueError):
        compressed_block_size(64, variant="rust")


# ---- compressed mask -------------------------------------------------------------------------

def test_block_size_and_true_size_table():
    assert [compressed_block_size(h) for h in (32, 64, 128, 129, 256, 512)] == \
        [128, 128, 128, 64, 64, 64]
    assert [compressed_block_size(h, "cpp") for h in (64, 128, 192, 256, 512)] == \
        [128, 128, 80, 64, 32]
    cases = {  # (window, head_size): true_size per the reference's Python
        (1, 128): 1, (100, 128): 100, (384, 128): 384, (385, 128): 257, (500, 128): 372,
        (512, 128): 384, (640, 64): 384, (641, 64): 257, (1000, 128): 360,
        (192, 256): 192, (193, 256): 129, (256, 256): 192, (300, 256): 172, (4096, 256): 192,
    }
    for (w, h), t in cases.items():
        assert compressed_mask_true_size(w, h) == t, (w, h)


@pytest.mark.parametrize("head_size", [64, 128, 192, 256])
def test_python_and_cpp_true_size_differ_only_on_exact_multiples(head_size):
    b = compressed_block_size(head_size, "cpp")
    for w in range(1, 9 * b):
        py = compressed_mask_true_size(w, head_size, "cpp")
        assert py == cpp_true_size(w, head_size)
        if head_size != 192:  # same block size in both variants
            seed_py = compressed_mask_true_size(w, head_size)
            assert (seed_py != py) == (w > 3 * b and w % b == 0), w


@pytest.mark.parametrize("window,head_size", [(1, 64), (200, 128), (384, 128), (385, 128),
                                              (512, 128), (700, 256), (192, 256)])
def test_compressed_mask_is_the_seed_band(window, head_size):
    t = compressed_mask_true_size(window, head_size)
    c = swa_mask_compressed(window, head_size)
    assert c.shape == (COMPRESSED_MASK_SIZE, COMPRESSED_MASK_SIZE)
    assert np.array_equal(c, cpp_mask(512, t, MASK_VALUE))
    assert np.array_equal(swa_mask_compressed(window, head_size, form="bool"),
                          cpp_mask(512, t, 1.0).astype(np.uint8))
    # Toeplitz: the mask entry depends only on r - c
    assert all(np.all(np.diagonal(c, off) == np.diagonal(c, off)[0]) for off in range(-511, 512))


# ---- tiled use of the compressed mask ----------------------------------------------------------

WINDOWS = {  # windows below, at and above 3 * pp_n, multiples and not
    128: [1, 2, 100, 127, 128, 129, 255, 256, 257, 300, 383, 384, 385, 450, 511, 512, 513, 640,
          769, 1000],
    64: [1, 5, 63, 64, 65, 128, 150, 191, 192, 193, 200, 256, 257, 300, 384, 449, 1000],
}


def seq_lengths(b):
    return [1, b - 1, 2 * b + 1, 5 * b + 17, 9 * b]


@pytest.mark.parametrize("head_size", [128, 256])
def test_tiled_mask_equals_full_mask(head_size):
    """Absolute tiling: always exact. Query-start tiling: exact whenever the 512x512 mask has
    room, refused (ValueError) otherwise -- only for 128-tiles with true_size > 258."""
    b = compressed_block_size(head_size)
    refused = 0
    for w in WINDOWS[b]:
        t = compressed_mask_true_size(w, head_size)
        for sk in seq_lengths(b):
            full = swa_mask_additive(sk, w)
            for sq in sorted({1, min(3, sk), sk // 3 or 1, sk}):
                want = full[sk - sq:]
                got = tiled_mask_assemble(sq, sk, w, head_size, align="absolute")
                assert np.array_equal(got, want), (w, sq, sk)
                try:
                    got = tiled_mask_assemble(sq, sk, w, head_size, align="query")
                except ValueError:
                    assert b == 128 and t > 258 and (sk - sq) % b, (w, sq, sk)
                    refused += 1
                    continue
                assert np.array_equal(got, want), (w, sq, sk)
    assert (refused > 0) == (b == 128)


def test_head_size_64_uses_the_128_mask():
    for w in WINDOWS[128]:
        assert np.array_equal(swa_mask_compressed(w, 64), swa_mask_compressed(w, 128))
    assert np.array_equal(tiled_mask_assemble(700, 700, 450, 64), swa_mask_additive(700, 450))


def test_unaligned_128_tiles_fail_exactly_when_true_size_exceeds_258():
    cmask = np.zeros((512, 512))
    b = 128
    for w in list(range(1, 250, 7)) + list(range(250, 270)) + list(range(270, 800, 11)):
        fails = False
        for delta in range(-(b - 1), w + b - 1):
            try:
                blk = tiled_mask_block(delta, 0, w, 128, cmask=cmask)
            except ValueError:
                fails = True
                continue
            assert blk is None or blk.shape == (b, b)
        assert fails == (compressed_mask_true_size(w, 128) > 258), w


def test_tiled_mask_block_classification():
    # fully visible tile: no mask read; never-visited tiles refused
    assert tiled_mask_block(512, 128, 1000, 128) is None
    with pytest.raises(ValueError):
        tiled_mask_block(0, 128, 1000, 128)  # entirely above the diagonal
    with pytest.raises(ValueError):
        tiled_mask_block(1024, 0, 500, 128)  # entirely outside the window
    # the diagonal tile is the causal triangle
    diag = tiled_mask_block(256, 256, 1000, 128)
    assert np.array_equal(diag == 0, np.tril(np.ones((128, 128), bool)))


@pytest.mark.parametrize("head_size", [64, 192, 256])
def test_cpp_variant_also_tiles_correctly(head_size):
    b = compressed_block_size(head_size, "cpp")
    for w in [1, b - 1, b, 3 * b, 3 * b + 1, 4 * b, 5 * b, 5 * b + 7]:
        for sq, sk in [(sk, sk) for sk in (b + 3, 7 * b + 5)] + [(5, 7 * b + 5)]:
            got = tiled_mask_assemble(sq, sk, w, head_size, variant="cpp")
            assert np.array_equal(got, swa_mask_additive(sk, w)[sk - sq:]), (w, sq, sk)


def assemble_square(s, w, hs, cmask, offsets_variant):
    """Absolute tiling of an s x s prefill, mask tiles read from ``cmask`` at the offsets that
    ``offsets_variant`` computes (a mismatch models mixing the reference's Python and C++ code)."""
    b = 128 if hs <= 128 else 64
    out = np.full((s, s), MASK_VALUE)
    for qs in range(0, s, b):
        for ks in range(max(qs - w + 1, 0) // b * b, qs + 1, b):
            blk = tiled_mask_block(qs, ks, w, hs, cmask=cmask, variant=offsets_variant)
            r, c = min(b, s - qs), min(b, s - ks)
            out[qs:qs + r, ks:ks + c] = 0.0 if blk is None else blk[:r, :c]
    return out


@pytest.mark.parametrize("w,hs", [(512, 128), (640, 128), (256, 256), (320, 256)])
def test_mixing_python_mask_with_cpp_offsets_is_caught(w, hs):
    """The reference's Python (3B) and C++ (2B) true_size differ for exact multiples above 3B:
    reading the Python mask at the C++ offsets gives a wrong mask; each at its own offsets is
    right."""
    s = 1100
    full = swa_mask_additive(s, w)
    py, cpp = swa_mask_compressed(w, hs), swa_mask_compressed(w, hs, variant="cpp")
    assert np.array_equal(assemble_square(s, w, hs, py, "python"), full)
    assert np.array_equal(assemble_square(s, w, hs, cpp, "cpp"), full)
    assert not np.array_equal(assemble_square(s, w, hs, py, "cpp"), full)
    assert not np.array_equal(assemble_square(s, w, hs, cpp, "python"), full)
    # for a window that is not a multiple both variants are the same mask
    py3, cpp3 = swa_mask_compressed(w + 3, hs), swa_mask_compressed(w + 3, hs, variant="cpp")
    assert np.array_equal(py3, cpp3)


# ---- tiled attention equals full-mask attention ------------------------------------------------

ATT_CASES = [  # (head_size, window, Sq, Sk)
    (128, 1, 130, 130), (128, 127, 300, 300), (128, 128, 257, 257), (128, 200, 400, 400),
    (128, 383, 700, 700), (128, 384, 800, 800), (128, 385, 800, 800), (128, 500, 1000, 1000),
    (128, 512, 900, 900), (128, 640, 1030, 1030), (128, 300, 5, 900), (128, 450, 1, 1000),
    (128, 500, 333, 1000), (64, 1, 70, 70), (64, 100, 300, 300), (64, 192, 400, 400),
    (64, 193, 500, 500), (64, 256, 600, 600), (64, 300, 650, 650), (256, 130, 1, 650),
    (256, 449, 200, 777), (256, 1000, 300, 300),
]


@pytest.mark.parametrize("head_size,window,sq,sk", ATT_CASES)
def test_tiled_attention_equals_full_mask_attention(head_size, window, sq, sk):
    rng = np.random.default_rng(window * 1000 + sk)
    q = rng.standard_normal((sq, 2, 4))
    k = rng.standard_normal((sk, 1, 4))
    v = rng.standard_normal((sk, 1, 4))
    full = masked_attention(q, k, v, swa_mask_additive(sk, window)[sk - sq:])
    ref = swa_attention(q, k, v, window)
    np.testing.assert_allclose(full, ref, rtol=0, atol=1e-12)
    aligns = ["absolute"]
    if compressed_block_size(head_size) == 64 or compressed_mask_true_size(window, 128) <= 258:
        aligns.append("query")
    for align in aligns:
        tiled = tiled_swa_attention(q, k, v, window, head_size, align=align)
        np.testing.assert_allclose(tiled, full, rtol=0, atol=1e-12)


@pytest.mark.parametrize("head_size", [64, 128, 256])
def test_tiled_attention_real_head_size(head_size):
    rng = np.random.default_rng(head_size)
    s, w = 300, 7 * compressed_block_size(head_size) // 3
    q = rng.standard_normal((s, 2, head_size))
    k = rng.standard_normal((s, 1, head_size))
    v = rng.standard_normal((s, 1, head_size))
    np.testing.assert_allclose(tiled_swa_attention(q, k, v, w), swa_attention(q, k, v, w),
                               rtol=0, atol=1e-12)


def test_tiled_attention_catches_wrong_window():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((600, 2, 4)) for _ in range(3))
    tiled = tiled_swa_attention(q, k, v, 400, 128)
    for w in (399, 401):
        assert np.abs(tiled - swa_attention(q, k, v, w)).max() > 1e-3

"""Golden model of ``hw/storage/kv_words.py``'s :class:`KvWordWriter`: the ring-port writes
of a record's K/V area moved four bytes a clock, in the order the gateware makes them.

K: each four record bytes are four consecutive ring-port bytes, written as they come. V: the
area's column order is gathered a chunk (``4 / EB`` dimensions of every valid slot) at a time
and written one slot a write, oldest slot first (``docs/blocks/dma.md``). Written from the
record format's definition with numpy, independently of the gateware's counters.
"""

import numpy as np

from ringkv.defs.config import RingKVConfig
from ringkv.defs.record import RecordLayout

__all__ = ["kv_word_writes", "kv_word_clocks"]


def _ring_addr(config, eb, lh, kind, slot, byte):
    return (((lh * 2 + kind) * config.window + slot) * config.head_dim * eb) + byte


def kv_word_writes(config: RingKVConfig, valid_slots: int, first_slot: int,
                   kv: bytes) -> list[tuple[int, int]]:
    """``[(ring byte address, 32-bit little-endian data)]`` for the K/V area ``kv`` (record
    order, unpadded) of a record with ``valid_slots`` slots, the oldest ``first_slot``."""
    eb = RecordLayout(config).elem_bytes
    W, D, LH = config.window, config.head_dim, config.layers * config.kv_heads
    v = valid_slots
    if not 1 <= v <= W or not 0 <= first_slot < W:
        raise ValueError(f"valid_slots {v} / first_slot {first_slot} outside the window {W}")
    if (D * eb) % 4:
        raise ValueError(f"a K row of {D * eb} bytes is not whole four-byte words")
    half = LH * v * D * eb
    if len(kv) != 2 * half:
        raise ValueError(f"the K/V area is {2 * half} bytes, not {len(kv)}")
    slots = [(first_slot + t) % W for t in range(v)]
    writes = []
    k = np.frombuffer(kv[:half], np.uint8).reshape(LH, v, D * eb)
    for lh in range(LH):
        for t in range(v):
            for o in range(0, D * eb, 4):
                writes.append((_ring_addr(config, eb, lh, 0, slots[t], o),
                               int.from_bytes(k[lh, t, o:o + 4].tobytes(), "little")))
    # V: (ring, dim, t, byte) -> rows (ring, t, dim, byte); a write is 4 / EB dims of a slot
    vv = np.frombuffer(kv[half:], np.uint8).reshape(LH, D, v, eb).transpose(0, 2, 1, 3)
    c = 4 // eb
    for lh in range(LH):
        for chunk in range(D // c):
            for t in range(v):
                data = vv[lh, t, chunk * c:(chunk + 1) * c, :].tobytes()
                writes.append((_ring_addr(config, eb, lh, 1, slots[t], chunk * 4),
                               int.from_bytes(data, "little")))
    return writes


def kv_word_clocks(config: RingKVConfig, valid_slots: int) -> int:
    """Clocks from the area's first word taken to its last write shown, with every word
    offered at once and every write taken at once: one word a clock, each a register behind
    its transfer (the writer's input register), the last V chunk drained ``v`` clocks after
    its last word, the output a register behind."""
    eb = RecordLayout(config).elem_bytes
    words = 2 * config.layers * config.kv_heads * valid_slots * config.head_dim * eb // 4
    return words + valid_slots + 1

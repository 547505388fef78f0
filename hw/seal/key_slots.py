"""Key slots: volatile 32-byte MAC keys, written bytewise, read only by the MAC core.

Each slot holds a key id (:data:`~ringkv.defs.mac.KEY_ID_BYTES` bytes, not secret: records
carry it so that keys can rotate), a 32-byte key and a ``set`` bit. Keys are write-only: the
only path from a key's storage to anything outside this block is the :class:`KeyReadSignature`
port, which :class:`ringkv.hw.seal.mac.MacCore` owns; its ``data`` feeds the MAC's message buffer
and nothing else, and the MAC's only output is a BLAKE2s tag, from which the key cannot be
recovered (a preimage problem on the compression function). The ``set`` bits and key ids are
status, readable by the dispatcher.
"""

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ringkv.defs.checks import check_int
from ringkv.defs.mac import KEY_BYTES, KEY_ID_BYTES, KEY_ID_NONE, KEY_WORDS, SLOT_BITS

__all__ = ["KeyReadSignature", "KeyWrite", "KeySlots"]

#: Last byte index of a slot write (the key id's bytes, then the key's).
_LAST_INDEX = KEY_ID_BYTES + KEY_BYTES - 1

#: One byte of a slot write, or (``clear``) the erasure of a slot.
KeyWrite = data.StructLayout({"slot": SLOT_BITS, "index": 6, "data": 8, "clear": 1})


class KeyReadSignature(wiring.Signature):
    """The MAC's read port into the key slots (from the reader's side): ``slot`` and ``word``
    (0..7) out, the key's 32-bit word ``data`` in, little-endian (key byte ``4 * word`` in
    bits 0..7), combinational. ``data`` is 0 while the slot holds no complete key."""

    def __init__(self, slots: int):
        check_int("slots", slots, low=1, high=1 << SLOT_BITS)
        self._slots = slots
        super().__init__({
            "slot": Out(range(slots)),
            "word": Out(range(KEY_WORDS)),
            "data": In(32),
        })

    slots = property(lambda self: self._slots)

    def __eq__(self, other):
        return isinstance(other, KeyReadSignature) and other.slots == self.slots

    def __hash__(self):
        return hash((KeyReadSignature, self._slots))

    def __repr__(self):
        return f"KeyReadSignature({self._slots})"


class KeySlots(wiring.Component):
    """``slots`` key slots in LUT RAM, a ``set`` bit and a key id per slot.

    Ports
    -----
    write : ``In(stream.Signature(KeyWrite))``, always ready
        A slot is written in order: byte ``index`` 0 and 1 are the key id (little-endian),
        2..33 the key. Index 0 starts a write: it clears the slot's ``set`` bit at once (a half
        written key is never used), and only the write of byte 33, after every byte in order
        without another slot's write between, sets it, provided the key id is not
        :data:`~ringkv.defs.mac.KEY_ID_NONE`. ``clear`` erases a slot (``set`` and key id to
        0). A write to a slot number ``>= slots``, a byte out of order, or a byte with no write
        in progress is refused: ``refused`` pulses for a clock and nothing changes (an out of
        order byte also abandons the write in progress, whose slot is already unset).
    read : ``In(KeyReadSignature(slots))``
        The MAC core's port. ``data`` is gated by ``set``: an unset slot reads as zeros, so a
        key left in the RAM after a reset (LUT RAM has no reset) is unreachable.
    set : ``Out(slots)``
        Which slots hold a complete key; all 0 after reset.
    key_ids : ``Out(data.ArrayLayout(16, slots))``
        Each slot's key id (0 when unset).
    refused : ``Out(1)``
        One clock after a refused write byte.

    Latency: a write takes effect at the next clock edge; ``read`` is combinational.
    Cost: ``slots * 8`` 32-bit words of distributed RAM (16 DPR16X4 cells for 4 slots), the key
    id and ``set`` registers.
    """

    def __init__(self, slots: int = 4):
        check_int("slots", slots, low=1, high=1 << SLOT_BITS)
        self._slots = slots
        super().__init__({
            "write": In(stream.Signature(KeyWrite)),
            "read": In(KeyReadSignature(slots)),
            "set": Out(slots),
            "key_ids": Out(data.ArrayLayout(8 * KEY_ID_BYTES, slots)),
            "refused": Out(1),
        })

    slots = property(lambda self: self._slots)

    def elaborate(self, platform):
        m = Module()
        slots = self._slots
        word_bits = ceil_log2(KEY_WORDS)
        m.submodules.keys = keys = memory.Memory(shape=32, depth=slots * KEY_WORDS, init=[])
        wp = keys.write_port(granularity=8)
        rp = keys.read_port(domain="comb")

        w = self.write.payload
        busy = Signal()                     # a write in order is in progress
        cur = Signal(range(slots))          # its slot
        nxt = Signal(6)                     # the index it expects next
        ids = [Signal(8 * KEY_ID_BYTES, name=f"key_id{k}") for k in range(slots)]
        set_ = Signal(slots)

        slot_bits = max(1, ceil_log2(slots))
        slot = w.slot[:slot_bits]
        key_index = Signal(6)
        m.d.comb += [
            self.write.ready.eq(1),
            key_index.eq(w.index - KEY_ID_BYTES),
            wp.addr.eq(Cat(key_index[2:2 + word_bits], slot) if slots > 1
                       else key_index[2:2 + word_bits]),
            wp.data.eq(w.data.replicate(4)),
            rp.addr.eq(Cat(self.read.word, self.read.slot) if slots > 1 else self.read.word),
            self.read.data.eq(Mux(set_.bit_select(self.read.slot, 1), rp.data, 0)),
            self.set.eq(set_),
            self.key_ids.eq(Cat(*ids)),
        ]
        m.d.sync += self.refused.eq(0)
        in_range = w.slot < slots
        in_order = busy & (slot == cur) & (w.index == nxt)
        with m.If(self.write.valid):
            with m.If(~in_range):
                m.d.sync += self.refused.eq(1)
            with m.Elif(w.clear):
                for k in range(slots):
                    with m.If(slot == k):
                        m.d.sync += [set_[k].eq(0), ids[k].eq(0)]
                with m.If(slot == cur):
                    m.d.sync += busy.eq(0)
            with m.Elif(w.index == 0):
                for k in range(slots):
                    with m.If(slot == k):
                        m.d.sync += [set_[k].eq(0), ids[k].eq(w.data)]
                m.d.sync += [busy.eq(1), cur.eq(slot), nxt.eq(1)]
            with m.Elif(in_order):
                m.d.sync += nxt.eq(nxt + 1)
                with m.If(w.index < KEY_ID_BYTES):
                    for k in range(slots):
                        with m.If(slot == k):
                            for b in range(1, KEY_ID_BYTES):
                                with m.If(w.index == b):
                                    m.d.sync += ids[k][8 * b:8 * b + 8].eq(w.data)
                with m.Else():
                    m.d.comb += wp.en.eq(Const(1, 4) << key_index[:2])
                with m.If(w.index == _LAST_INDEX):
                    m.d.sync += busy.eq(0)
                    for k in range(slots):
                        with m.If(slot == k):
                            m.d.sync += set_[k].eq(ids[k] != KEY_ID_NONE)
            with m.Else():
                m.d.sync += [self.refused.eq(1), busy.eq(0)]
        return m

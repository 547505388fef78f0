"""Keyed BLAKE2s (RFC 7693) over a byte stream: the record MAC core.

The function, its parameters and why it was chosen: :mod:`ringkv.defs.mac` and
``docs/blocks/mac.md``; the golden model is :func:`ringkv.host.golden.mac.mac` (``hashlib``).
"""

from amaranth import Array, Cat, Const, Module, Mux, ResetInserter, Signal
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ringkv.defs.checks import check_int
from ringkv.defs.mac import (
    BLOCK_BYTES,
    IV,
    KEY_BYTES,
    KEY_SLOTS,
    KEY_WORDS,
    PERSON_BYTES,
    PERSONS,
    ROUNDS,
    SIGMA,
    TAG_BYTES,
    param_word0,
)

from .key_slots import KeyReadSignature, KeySlots, KeyWrite

__all__ = ["MacCore", "MacUnit", "MacPortSignature", "BUGS", "mac_cmd_layout",
           "mac_byte_layout", "STEPS", "BLOCK_CLOCKS"]

#: G half-steps per compression: 4 per round (column then diagonal, each in two halves).
STEPS = 4 * ROUNDS
#: Clocks per compression: the state load, ``STEPS`` half-steps, the chaining-value update.
BLOCK_CLOCKS = STEPS + 2
_MASK = 0xFFFFFFFF
#: Deliberately broken variants for the formal tests (private knob ``_bug``): one message
#: buffer instead of two (a block waits for the previous one's compression: ``i.ready`` falls
#: inside a message); a tag after every block, not only the final one.
BUGS = ("one_buffer", "tag_every_block")


def mac_cmd_layout(persons: int, slots: int) -> data.StructLayout:
    return data.StructLayout({"person": range(persons), "slot": range(slots), "empty": 1})


def mac_byte_layout() -> data.StructLayout:
    return data.StructLayout({"data": 8, "last": 1})


class MacPortSignature(wiring.Signature):
    """A user's port to a MAC core (from the user's side): ``cmd`` (Out stream of
    :func:`mac_cmd_layout`: open a message under a key slot and a person), ``i`` (Out stream
    of :func:`mac_byte_layout`: the message bytes, ``last`` on the final one), ``o`` (In stream
    of the ``8 * digest_bytes``-bit tag) and ``abort`` (Out 1: drop the open message and any
    tag not yet taken; the core is idle at the next clock)."""

    def __init__(self, *, digest_bytes: int = TAG_BYTES, persons: int = len(PERSONS),
                 slots: int = KEY_SLOTS):
        check_int("digest_bytes", digest_bytes, low=1, high=32)
        check_int("persons", persons, low=1)
        check_int("slots", slots, low=1)
        self._params = (digest_bytes, persons, slots)
        super().__init__({
            "cmd": Out(stream.Signature(mac_cmd_layout(persons, slots))),
            "i": Out(stream.Signature(mac_byte_layout())),
            "o": In(stream.Signature(8 * digest_bytes)),
            "abort": Out(1),
        })

    def __eq__(self, other):
        return isinstance(other, MacPortSignature) and other._params == self._params

    def __hash__(self):
        return hash((MacPortSignature, self._params))

    def __repr__(self):
        d, p, s = self._params
        return f"MacPortSignature(digest_bytes={d}, persons={p}, slots={s})"


def _word_schedule() -> list[int]:
    """Per half-step ``s``: the message word index each of the 4 G units reads, 4 bits each.
    Step ``4r + 0/1``: column G ``u`` (``x``/``y`` of RFC 7693's G), ``4r + 2/3``: diagonal."""
    rom = []
    for s in range(STEPS):
        r, phase = divmod(s, 4)
        word = 0
        for u in range(4):
            index = (8 if phase >= 2 else 0) + 2 * u + (phase & 1)
            word |= SIGMA[r][index] << (4 * u)
        rom.append(word)
    return rom


class MacCore(wiring.Component):
    """Keyed BLAKE2s of a byte stream, one byte per clock, never stalling inside a message.

    Parameters
    ----------
    digest_bytes : int
        Tag length, 1 to 32 (BLAKE2s ``digest_size``); the record MAC uses 16.
    persons : tuple of bytes
        The personalisations ``cmd.person`` selects between (at most 8 bytes each); by default
        :data:`ringkv.defs.mac.PERSONS` (record tags, tenant seeds).
    slots : int
        Key slots addressable through ``key``.

    Ports
    -----
    cmd : ``In(stream.Signature({person, slot, empty}))``
        Opens a message under the key of ``slot`` and ``persons[person]``; ``empty`` asks for
        the tag of the empty message (no bytes follow). Accepted only when the core is idle:
        the previous message's tag has been taken.
    i : ``In(stream.Signature({data, last}))``
        The message bytes, ``last`` on the final one.
    o : ``Out(stream.Signature(8 * digest_bytes))``
        The tag, byte ``k`` in bits ``8k..8k+7`` (``hashlib``'s ``digest()`` order).
    key : ``Out(KeyReadSignature(slots))``
        Read port into :class:`ringkv.hw.seal.key_slots.KeySlots` (combinational ``data``).

    Latency, throughput, backpressure
    ---------------------------------
    ``i.ready`` rises the clock after ``cmd``'s transfer and stays high until the transfer of
    the byte with ``last``: a message is absorbed at one byte per clock, or at the source's
    pace, with no stall. ``i.ready`` is low only between messages (before ``cmd``, and from
    the ``last`` byte until the next ``cmd``). ``o`` holds the tag until taken; ``cmd`` waits
    for that.

    A compression takes :data:`BLOCK_CLOCKS` = 42 clocks (load, 40 half-G steps, chaining-value
    update), fewer than the 64 a block takes to arrive, so the engine is always free when a
    block fills. The key block is loaded from ``key`` (8 clocks) and compressed while the first
    data block arrives, so the start costs no clock either. Overhead, in clock edges from the
    one that transfers the ``last`` byte to ``o.valid`` high (exact, ``tests/hw/seal/test_mac.py``):
    ``BLOCK_CLOCKS`` = 42 when the engine is idle as the final block fills (a final block of
    at least 42 bytes after a full block, or a message of 50 to 64 bytes); otherwise the final
    block waits for the previous compression: ``2 * BLOCK_CLOCKS - tail`` after a full block
    (``tail`` bytes in the final block; at most 83), and for a message of ``n`` < 50 bytes the
    tag comes 92 edges after ``cmd``'s transfer (at most 91 after the last byte). The empty
    message's tag: 50 edges after ``cmd``.

    How
    ---
    Two 64-byte message buffers in distributed RAM: bytes fill one while the engine compresses
    the other. The key block goes into buffer 0 and data starts in buffer 1. Bytes past the end
    of a block (the key block's upper 32 bytes, a final block's padding) are not cleared but
    masked to zero when the engine reads them. The engine has four G units; each does half of
    RFC 7693's G per clock (one three-input add, one add, two XORs with rotations), so a round
    is four clocks: the column step in two halves, then the diagonal step in two halves. The
    state is kept as four rows; writing rows b, c, d back rotated by 1, 2, 3 words after the
    column step turns the diagonals into columns, and the inverse rotation after the diagonal
    step restores them, so each G unit always works on one fixed column. Each unit's message
    word is read a clock ahead (address from a 40-entry schedule ROM of SIGMA) into a register,
    keeping the RAM read and the masking off the adder path.

    The byte counter is BLAKE2s' ``t0`` (``t1 = 0``): a message is at most
    :data:`~ringkv.defs.mac.MAX_MESSAGE_BYTES` bytes.
    """

    def __init__(self, *, digest_bytes: int = TAG_BYTES, persons=PERSONS, slots: int = KEY_SLOTS,
                 _bug=None):
        if _bug is not None and _bug not in BUGS:
            raise ValueError(f"Unknown bug {_bug!r}; known: {BUGS}")
        self._bug = _bug
        check_int("digest_bytes", digest_bytes, low=1, high=32)
        check_int("slots", slots, low=1, high=256)
        if not isinstance(persons, tuple) or not persons:
            raise TypeError(f"persons must be a non-empty tuple of bytes, not {persons!r}")
        for person in persons:
            if not isinstance(person, bytes) or len(person) > PERSON_BYTES:
                raise ValueError(f"each person must be at most {PERSON_BYTES} bytes, "
                                 f"not {person!r}")
        self._digest_bytes = digest_bytes
        self._persons = persons
        self._slots = slots
        super().__init__({
            "cmd": In(stream.Signature(mac_cmd_layout(len(persons), slots))),
            "i": In(stream.Signature(mac_byte_layout())),
            "o": Out(stream.Signature(8 * digest_bytes)),
            "key": Out(KeyReadSignature(slots)),
        })

    digest_bytes = property(lambda self: self._digest_bytes)
    persons = property(lambda self: self._persons)
    slots = property(lambda self: self._slots)

    def _initial_state(self, person: bytes) -> list[int]:
        person = person.ljust(PERSON_BYTES, b"\0")
        h = list(IV)
        h[0] ^= param_word0(self._digest_bytes, KEY_BYTES)
        h[6] ^= int.from_bytes(person[:4], "little")
        h[7] ^= int.from_bytes(person[4:], "little")
        return h

    def elaborate(self, platform):
        m = Module()

        # --- message buffers: 2 x 16 words, bytewise writes, 4 read ports each ---------------
        bufs = []
        for b in range(2):
            mem = memory.Memory(shape=32, depth=16, init=[])
            m.submodules[f"buf{b}"] = mem
            bufs.append((mem.write_port(granularity=8),
                         [mem.read_port(domain="comb") for _ in range(4)]))

        # --- control state -------------------------------------------------------------------
        msg = Signal()                       # a message is open: bytes are accepted
        key_load = Signal()                  # the key is being copied into buffer 0
        key_word = Signal(range(KEY_WORDS))
        fill_buf = Signal()                  # the buffer bytes go to
        fill_cnt = Signal(6)                 # bytes in it so far
        t = Signal(32)                       # BLAKE2s t0: bytes so far, the key block's 64 too
        full = Signal(2)                     # buffer holds a block to compress (or being so)
        nbytes = [Signal(range(BLOCK_BYTES + 1), name=f"nbytes{b}") for b in range(2)]
        final = [Signal(name=f"final{b}") for b in range(2)]
        blk_t = [Signal(32, name=f"t{b}") for b in range(2)]
        comp_buf = Signal()                  # the buffer the engine takes next / works on
        busy = Signal()                      # the engine runs: half-steps, then the update
        step = Signal(range(STEPS + 1))      # 0..STEPS-1: half-G steps; STEPS: update h

        slot = Signal(range(self._slots))
        m.d.comb += [self.key.slot.eq(slot), self.key.word.eq(key_word)]

        idle = ~msg & ~key_load & ~busy & (full == 0) & ~self.o.valid
        m.d.comb += [
            self.cmd.ready.eq(idle),
            self.i.ready.eq(msg & ~full.bit_select(fill_buf, 1)),
        ]

        # --- buffer writes: the key into buffer 0, bytes into the fill buffer ---------------
        accept = self.i.valid & self.i.ready
        for b, (wp, _) in enumerate(bufs):
            if b == 0:
                m.d.comb += [
                    wp.addr.eq(Mux(key_load, key_word, fill_cnt[2:])),
                    wp.data.eq(Mux(key_load, self.key.data, self.i.payload.data.replicate(4))),
                ]
                with m.If(key_load):
                    m.d.comb += wp.en.eq(0b1111)
                with m.Elif(accept & (fill_buf == 0)):
                    m.d.comb += wp.en.eq(Const(1, 4) << fill_cnt[:2])
            else:
                m.d.comb += [wp.addr.eq(fill_cnt[2:]),
                             wp.data.eq(self.i.payload.data.replicate(4))]
                with m.If(accept & (fill_buf == 1)):
                    m.d.comb += wp.en.eq(Const(1, 4) << fill_cnt[:2])

        h = [Signal(32, name=f"h{i}") for i in range(8)]
        inits = [self._initial_state(p) for p in self._persons]

        with m.If(self.cmd.valid & self.cmd.ready):
            m.d.sync += [
                msg.eq(~self.cmd.payload.empty),
                key_load.eq(1),
                key_word.eq(0),
                slot.eq(self.cmd.payload.slot),
                fill_buf.eq(1),
                fill_cnt.eq(0),
                t.eq(BLOCK_BYTES),
                comp_buf.eq(0),
                nbytes[0].eq(KEY_BYTES),
                final[0].eq(self.cmd.payload.empty),
                blk_t[0].eq(BLOCK_BYTES),
            ]
            for i in range(8):
                m.d.sync += h[i].eq(Array(Const(init[i], 32) for init in inits)
                                    [self.cmd.payload.person])
        with m.If(key_load):
            m.d.sync += key_word.eq(key_word + 1)
            with m.If(key_word == KEY_WORDS - 1):
                m.d.sync += [key_load.eq(0), full[0].eq(1)]

        with m.If(accept):
            block_end = self.i.payload.last | (fill_cnt == BLOCK_BYTES - 1)
            m.d.sync += [fill_cnt.eq(fill_cnt + 1), t.eq(t + 1)]
            with m.If(block_end):
                m.d.sync += fill_cnt.eq(0)
                if self._bug != "one_buffer":
                    m.d.sync += fill_buf.eq(~fill_buf)
                for b in range(2):
                    with m.If(fill_buf == b):
                        m.d.sync += [full[b].eq(1), nbytes[b].eq(fill_cnt + 1),
                                     final[b].eq(self.i.payload.last), blk_t[b].eq(t + 1)]
            with m.If(self.i.payload.last):
                m.d.sync += msg.eq(0)

        # --- the engine ------------------------------------------------------------------------
        v = [Signal(32, name=f"v{i}") for i in range(16)]
        mw = [Signal(32, name=f"m{u}") for u in range(4)]
        start = ~busy & full.bit_select(comp_buf, 1)

        cur_nbytes = Mux(comp_buf, nbytes[1], nbytes[0])
        cur_final = Mux(comp_buf, final[1], final[0])
        cur_t = Mux(comp_buf, blk_t[1], blk_t[0])

        # message words of the next half-step, masked past the block's end
        rom = Array(Const(w, 16) for w in _word_schedule() + [0] * (2 ** ceil_log2(STEPS)
                                                                     - STEPS))
        fetch_step = Mux(busy, step + 1, 0)
        schedule = Signal(16)
        m.d.comb += schedule.eq(rom[fetch_step[:ceil_log2(STEPS)]])
        fetched = []
        for u in range(4):
            addr = schedule[4 * u:4 * u + 4]
            word = Signal(32, name=f"fetch{u}")
            lanes = []
            for lane in range(4):
                live = Cat(Const(lane, 2), addr) < cur_nbytes
                raw = Mux(comp_buf, bufs[1][1][u].data, bufs[0][1][u].data)
                lanes.append(Mux(live, raw[8 * lane:8 * lane + 8], 0))
            for b in range(2):
                m.d.comb += bufs[b][1][u].addr.eq(addr)
            m.d.comb += word.eq(Cat(*lanes))
            fetched.append(word)

        # four half-G units on the columns of the state
        odd = step[0]
        phase = step[:2]
        outs = []
        for u in range(4):
            a, b, c, d = v[u], v[4 + u], v[8 + u], v[12 + u]
            a1 = Signal(32, name=f"g{u}_a")
            d1 = Signal(32, name=f"g{u}_d")
            c1 = Signal(32, name=f"g{u}_c")
            b1 = Signal(32, name=f"g{u}_b")
            dx = Signal(32, name=f"g{u}_dx")
            bx = Signal(32, name=f"g{u}_bx")
            m.d.comb += [
                a1.eq(a + b + mw[u]),
                dx.eq(d ^ a1),
                d1.eq(Mux(odd, dx.rotate_right(8), dx.rotate_right(16))),
                c1.eq(c + d1),
                bx.eq(b ^ c1),
                b1.eq(Mux(odd, bx.rotate_right(7), bx.rotate_right(12))),
            ]
            outs.append((a1, b1, c1, d1))

        with m.If(start):
            m.d.sync += [busy.eq(1), step.eq(0)]
            m.d.sync += [v[i].eq(h[i]) for i in range(8)]
            m.d.sync += [v[8 + i].eq(IV[i]) for i in range(4)]
            m.d.sync += [
                v[12].eq(cur_t ^ IV[4]),
                v[13].eq(IV[5]),
                v[14].eq(Mux(cur_final, IV[6] ^ _MASK, IV[6])),
                v[15].eq(IV[7]),
            ]
            m.d.sync += [mw[u].eq(fetched[u]) for u in range(4)]
        with m.Elif(busy & (step < STEPS)):
            m.d.sync += step.eq(step + 1)
            m.d.sync += [mw[u].eq(fetched[u]) for u in range(4)]
            for u in range(4):
                a1, b1, c1, d1 = outs[u]
                m.d.sync += v[u].eq(a1)
                with m.Switch(phase):
                    with m.Case(1):      # after the column step: diagonals become columns
                        m.d.sync += [v[4 + u].eq(outs[(u + 1) % 4][1]),
                                     v[8 + u].eq(outs[(u + 2) % 4][2]),
                                     v[12 + u].eq(outs[(u + 3) % 4][3])]
                    with m.Case(3):      # after the diagonal step: back to columns
                        m.d.sync += [v[4 + u].eq(outs[(u + 3) % 4][1]),
                                     v[8 + u].eq(outs[(u + 2) % 4][2]),
                                     v[12 + u].eq(outs[(u + 1) % 4][3])]
                    with m.Default():
                        m.d.sync += [v[4 + u].eq(b1), v[8 + u].eq(c1), v[12 + u].eq(d1)]
        with m.Elif(busy):
            # the chaining-value update; the block's buffer is free again
            m.d.sync += [h[i].eq(h[i] ^ v[i] ^ v[i + 8]) for i in range(8)]
            m.d.sync += [busy.eq(0), comp_buf.eq(1 if self._bug == "one_buffer" else ~comp_buf)]
            for b in range(2):
                with m.If(comp_buf == b):
                    m.d.sync += full[b].eq(0)
            with m.If(cur_final | (self._bug == "tag_every_block")):
                m.d.sync += self.o.valid.eq(1)

        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        m.d.comb += self.o.payload.eq(Cat(*h)[:8 * self._digest_bytes])
        return m


class MacUnit(wiring.Component):
    """:class:`MacCore` with its :class:`~ringkv.hw.seal.key_slots.KeySlots`: the MAC as the device
    holds it. Ports: the core's ``cmd``, ``i``, ``o``; ``abort`` (In 1); the slots'
    ``key_write`` (their ``write``), ``set``, ``key_ids`` and ``refused``. The key read port
    stays inside.

    ``abort`` (:class:`MacPortSignature`'s): the core's registers return to their reset
    values at the next edge, so the open message and any tag not yet taken are dropped and the
    core is idle (``cmd.ready`` high) the clock after; ``cmd`` and ``i`` are ignored in the
    clock of ``abort``. The key slots are not affected. A user that gives up a message half way
    (a failed transfer) frees the core in one clock this way."""

    def __init__(self, *, digest_bytes: int = TAG_BYTES, persons=PERSONS, slots: int = KEY_SLOTS):
        self._core = MacCore(digest_bytes=digest_bytes, persons=persons, slots=slots)
        self._slots = KeySlots(slots)
        super().__init__({
            "cmd": In(self._core.cmd.signature.flip()),
            "i": In(self._core.i.signature.flip()),
            "o": Out(self._core.o.signature),
            "abort": In(1),
            "key_write": In(stream.Signature(KeyWrite)),
            "set": Out(slots),
            "key_ids": Out(self._slots.key_ids.shape()),
            "refused": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        core = self._core
        # the message buffers are memories and keep their bytes: a block's byte count (a
        # register) masks what the next message has not written
        m.submodules.core = ResetInserter(self.abort)(core)
        m.submodules.slots = slots = self._slots
        wiring.connect(m, wiring.flipped(self.cmd), core.cmd)
        wiring.connect(m, wiring.flipped(self.i), core.i)
        wiring.connect(m, core.o, wiring.flipped(self.o))
        wiring.connect(m, wiring.flipped(self.key_write), slots.write)
        wiring.connect(m, core.key, slots.read)
        m.d.comb += [self.set.eq(slots.set), self.key_ids.eq(slots.key_ids),
                     self.refused.eq(slots.refused)]
        return m

"""Dispatcher unit: record keys (KEY_SET, KEY_CLEAR) of a sealed build, and the MAC's arbiter.

A :class:`~ringkv.hw.commands.dispatch.CommandUnit` of :class:`ringkv.hw.top.RingKVTop` that only a
sealed build has (``RingKVTop(sealed=True)``; an open build answers both opcodes
``UNKNOWN_OP``, like any opcode it does not execute).

* ``KEY_SET slot key_id`` + 32 key bytes: the payload must be exactly the fixed part and the
  key (else ``BAD_LENGTH``), ``slot < KEY_SLOTS`` and ``key_id != KEY_ID_NONE`` (else
  ``BAD_ARG``); a refused frame is drained and writes nothing (every check is decided before
  the first byte goes to the slots). Then the unit writes the slot bytewise
  (:data:`~ringkv.hw.seal.key_slots.KeyWrite`: the key id's two bytes from the argument record, the
  32 key bytes **straight from the frame decoder**, one per clock: the key never sits in a
  dispatcher register), and derives the slot's prefix-hash seed through the MAC core: one
  message, the 32-byte configuration digest under the new key with ``person`` 1
  (:data:`~ringkv.defs.mac.PERSON_SEED`), the tag's first 8 bytes little-endian into the
  slot's seed register: :func:`ringkv.host.golden.mac.tenant_seed`. The answer (``OK``, no
  payload) comes after the seed is stored, so the next request already hashes with it.
* ``KEY_CLEAR slot``: ``slot < KEY_SLOTS`` (else ``BAD_ARG``); erases the slot (its ``set`` bit
  and key id; the key RAM is unreachable while ``set`` is 0). Its seed register keeps its
  value but is never used: a tenant op naming the slot is refused ``NO_KEY``.

Latency: KEY_SET writes the slot at one byte per clock (34 bytes), then waits for the tag of a
32-byte message (:class:`~ringkv.hw.seal.mac.MacCore`: 92 clocks after its ``cmd``); measured
(``python -m bench.run --only sealed``), 144 clocks from the request's last byte to the
answer's last, against 15 for KEY_CLEAR, which answers at once.

**Why no response carries key material.** The key's only storage is
:class:`~ringkv.hw.seal.key_slots.KeySlots`, whose only read port goes to the MAC core, whose only
output is a BLAKE2s tag; the dispatcher never holds the key (the bytes go from the frame
decoder's data stream into the slots' write port) and both key opcodes answer with a status
only. The frame decoder's payload buffer keeps a KEY_SET frame's bytes until later frames
overwrite them, but it releases only a checked frame's own bytes (``0 .. length - 1``, all
written by that frame), so no request can read another's payload. The tags reach the dispatcher only
here (the tenant seed, a keyed hash of a public digest: the key cannot be recovered from it)
and in the DMA (a record's tag, written to storage, which holds it anyway).

:class:`MacArbiter` shares the one MAC core between the DMA (``dma.mac``: sealed transfers) and
this unit's seed derivation.
"""

from amaranth import Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ringkv.defs.mac import KEY_ID_BYTES, KEY_ID_NONE, KEY_SLOTS, PERSON_SEED, PERSONS, SEED_BYTES
from ringkv.defs.protocol import KEY_SET_TAIL, Op

from ..protocol import Status
from ..seal.mac import MacPortSignature
from .dispatch import CommandUnit

__all__ = ["KeyUnit", "MacArbiter", "SEED_PERSON", "ARBITER_BUGS"]

#: ``cmd.person`` of the seed derivation (the index of :data:`PERSON_SEED` in ``PERSONS``).
SEED_PERSON = PERSONS.index(PERSON_SEED)
#: Deliberately broken arbiters for the formal tests (private knob ``_bug``): ``no_lock``
#: passes a ``cmd`` while the other user owns the core; ``shared_tag`` offers the tag to both.
ARBITER_BUGS = ("no_lock", "shared_tag")


class MacArbiter(wiring.Component):
    """Two users of one MAC core: ``dma`` (the DMA's sealed transfers) and ``seed`` (the
    key unit's seed derivation), both ``In(MacPortSignature())``, and ``core``
    (``Out(MacPortSignature())``) to :class:`~ringkv.hw.seal.mac.MacCore`.

    A user owns the core from its ``cmd`` transfer until its tag is taken (``o``) or it raises
    ``abort``; meanwhile the other user's ``cmd`` waits (``ready`` low). Between messages the
    DMA goes first when both ask in the same clock. No clock is added: ``cmd``, ``i`` and
    ``o`` pass through combinationally, so a user sees the core's own timing (one byte per
    clock, never a stall inside a message). With no owner a tag is taken and dropped, so an
    aborted user can never leave the core blocked on its tag. Model-checked
    (``tests/hw/top/test_top_sealed.py``): one owner at a time, a user sees ``i.ready`` and
    ``o.valid`` only while it owns the core, the core's bytes are the owner's.
    """

    def __init__(self, *, _bug=None):
        if _bug is not None and _bug not in ARBITER_BUGS:
            raise ValueError(f"Unknown bug {_bug!r}; known: {ARBITER_BUGS}")
        self._bug = _bug
        super().__init__({
            "dma": In(MacPortSignature()),
            "seed": In(MacPortSignature()),
            "core": Out(MacPortSignature()),
        })

    def elaborate(self, platform):
        m = Module()
        a, b, core = self.dma, self.seed, self.core
        held = Signal()                      # a message (or its tag) belongs to ``owner``
        owner = Signal()                     # 0: dma, 1: seed
        pick = Signal()                      # the user the core's ``cmd`` comes from
        m.d.comb += pick.eq(Mux(held, owner, ~a.cmd.valid & b.cmd.valid))
        if self._bug == "no_lock":
            m.d.comb += pick.eq(~a.cmd.valid & b.cmd.valid)
            held_cmd = Const(0)
        else:
            held_cmd = held
        m.d.comb += [
            core.cmd.valid.eq(~held_cmd & (a.cmd.valid | b.cmd.valid)),
            core.cmd.payload.eq(Mux(pick, b.cmd.payload, a.cmd.payload)),
            a.cmd.ready.eq(core.cmd.ready & ~held_cmd & ~pick),
            b.cmd.ready.eq(core.cmd.ready & ~held_cmd & pick),
            core.i.valid.eq(held & Mux(owner, b.i.valid, a.i.valid)),
            core.i.payload.eq(Mux(owner, b.i.payload, a.i.payload)),
            a.i.ready.eq(held & ~owner & core.i.ready),
            b.i.ready.eq(held & owner & core.i.ready),
            a.o.payload.eq(core.o.payload),
            b.o.payload.eq(core.o.payload),
            a.o.valid.eq(held & ~owner & core.o.valid),
            b.o.valid.eq(held & (owner | (self._bug == "shared_tag")) & core.o.valid),
            core.o.ready.eq(~held | Mux(owner, b.o.ready, a.o.ready)),
            core.abort.eq(held & Mux(owner, b.abort, a.abort)),
        ]
        with m.If(core.cmd.valid & core.cmd.ready):
            m.d.sync += [held.eq(1), owner.eq(pick)]
        with m.If(held & ((core.o.valid & core.o.ready) | core.abort)):
            m.d.sync += held.eq(0)
        return m


class KeyUnit(CommandUnit):
    OPS = (Op.KEY_SET, Op.KEY_CLEAR)
    SEALED = True

    def signals(self, d):
        self.slot = Signal(range(KEY_SLOTS))
        self.index = Signal(6)               # KeyWrite index / digest byte
        self.write = d.top.key_slots.write
        self.mac = d.top.mac_arbiter.seed
        m = d.m
        m.d.comb += self.write.payload.slot.eq(self.slot)

    def dispatch(self, d):
        m, arg = d.m, d.arg
        fixed = d.requests[Op.KEY_SET].size
        with m.Case(Op.KEY_SET.value):
            slot, key_id = arg(Op.KEY_SET, "slot"), arg(Op.KEY_SET, "key_id")
            with m.If(d.early(d.length != fixed + KEY_SET_TAIL)):
                d.reject(Status.BAD_LENGTH)
            with m.Elif(d.early((slot >= KEY_SLOTS) | (key_id == KEY_ID_NONE))):
                d.reject(Status.BAD_ARG)
            with m.Else():
                m.d.sync += [self.slot.eq(slot), self.index.eq(0)]
                m.next = "KEY_WRITE"
        with m.Case(Op.KEY_CLEAR.value):
            slot = arg(Op.KEY_CLEAR, "slot")
            with m.If(slot >= KEY_SLOTS):
                d.reject(Status.BAD_ARG)
            with m.Else():
                m.d.sync += self.slot.eq(slot)
                m.next = "KEY_CLEAR"

    def states(self, d):
        m, dec = d.m, d.dec
        w, mac = self.write, self.mac
        key_id = d.arg(Op.KEY_SET, "key_id")
        last_index = KEY_ID_BYTES + KEY_SET_TAIL - 1
        with m.State("KEY_WRITE"):
            # the key id from the argument record, then the key from the decoder, in order
            m.d.comb += w.payload.index.eq(self.index)
            with m.If(self.index < KEY_ID_BYTES):
                m.d.comb += [w.valid.eq(1),
                             w.payload.data.eq(key_id.word_select(self.index[:1], 8))]
                m.d.sync += self.index.eq(self.index + 1)
            with m.Else():
                m.d.comb += [dec.data.ready.eq(1), w.valid.eq(dec.data.valid),
                             w.payload.data.eq(dec.data.payload.data)]
                with m.If(dec.data.valid):
                    m.d.sync += self.index.eq(self.index + 1)
                    with m.If(self.index == last_index):
                        m.next = "KEY_SEED"
        with m.State("KEY_SEED"):
            # one MAC message: the configuration digest under the new key, person PERSON_SEED
            m.d.comb += [mac.cmd.valid.eq(1), mac.cmd.payload.person.eq(SEED_PERSON),
                         mac.cmd.payload.slot.eq(self.slot), mac.cmd.payload.empty.eq(0)]
            with m.If(mac.cmd.ready):
                m.d.sync += self.index.eq(0)
                m.next = "KEY_SEED_MSG"
        digest = Const(int.from_bytes(d.config.digest(), "little"), 256)
        with m.State("KEY_SEED_MSG"):
            m.d.comb += [mac.i.valid.eq(1),
                         mac.i.payload.data.eq(digest.word_select(self.index[:5], 8)),
                         mac.i.payload.last.eq(self.index == 31)]
            with m.If(mac.i.ready):
                m.d.sync += self.index.eq(self.index + 1)
                with m.If(self.index == 31):
                    m.next = "KEY_SEED_TAG"
        with m.State("KEY_SEED_TAG"):
            m.d.comb += mac.o.ready.eq(1)
            with m.If(mac.o.valid):
                for k, seed in enumerate(d.seeds):
                    with m.If(self.slot == k):
                        m.d.sync += seed.eq(mac.o.payload[:8 * SEED_BYTES])
                d.respond(Status.OK)
        with m.State("KEY_CLEAR"):
            m.d.comb += [w.valid.eq(1), w.payload.clear.eq(1)]
            d.respond(Status.OK)

"""The command front end of :class:`ringkv.hw.top.RingKVTop`: one dispatcher FSM, built from units.

A request goes through the same states whatever its opcode::

    IDLE ─► HDR_CHECK ─► ARGS ─► DECODE ─► DISPATCH ─► (the unit's states) ─► RESP_HDR ─► (body)
               │                               │
               └─► DRAIN ◄─────────────────────┘ (rejected: drain the payload, answer with no
                                                  payload)

``DECODE`` is one clock in which the request is complete and nothing happens but the units'
:meth:`Dispatcher.early` registers taking its checks (lengths, argument ranges, derived
response lengths): ``DISPATCH`` decides on flip-flops.

:class:`Dispatcher` builds what every opcode shares, **from the protocol definitions**
(:mod:`ringkv.defs.protocol`): the length check of ``HDR_CHECK`` from ``LENGTH`` and
``REQUESTS`` (exact, a fixed part plus a tail, optional, any), the collection of the fixed
argument record in ``ARGS`` (``arg(op, name)`` reads a field at its layout offset), the response
header, and the response record packed little-endian from ``RESPONSES``. A **command unit**
(:class:`CommandUnit`, one module per command family: ``hw/cmd_*.py``) adds the rest for its
opcodes: its argument checks and first step in ``DISPATCH``, its states, the values of its
response records, and the states that stream its response body.

Adding an opcode: define it in :mod:`ringkv.defs.protocol` (``Op``, ``REQUESTS``,
``RESPONSES``, ``LENGTH``), then give it to the unit of its family (or a new unit in
:data:`ringkv.hw.top.UNITS`). The units are elaboration-time pieces of **one** FSM, not
separate components with a handshake between them: a unit's state follows the dispatcher's in
the next clock exactly as if written in one place, so the split costs no cycle.

The request layouts are the build's (:func:`ringkv.defs.protocol.build_requests`): a sealed
build's tenant ops carry a key slot, which :meth:`Dispatcher.tenant` checks and turns into the
hash engine's seed and the DMA's ``sealed``/``slot`` (:meth:`Dispatcher.dma_tenant`); an open
build's dispatcher has none of it.

Resources shared between families (the hash feeder on token-memory read port 0, the directory
command port, the DMA command port, the attention core's command port, the statistics counters
and the commit sequence) live here, with helpers that emit the states of one call to them
(:meth:`Dispatcher.hash_call`, :meth:`~Dispatcher.dir_call`, :meth:`~Dispatcher.dma_call`,
:meth:`~Dispatcher.attn_cmd`).
"""

from contextlib import contextmanager

from amaranth import Array, Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import wiring

from ringkv.defs.hash import hash_seed
from ringkv.defs.mac import KEY_SLOTS, SEED_BYTES
from ringkv.defs.protocol import LENGTH, RECOVERY_STATUS, RESPONSES, Length, build_requests

from ..attention.ring_port import RingPortArbiter
from ..link.skid import StreamRegister
from ..protocol import Op as LinkOp
from ..protocol import Status
from ..store.directory import Op as DirOp
from ..store.directory import Status as DirStatus

__all__ = ["Dispatcher", "CommandUnit", "pack_layout"]


def _field(value, size):
    """``value`` as exactly ``size`` bytes (zero-extended or truncated)."""
    value = Value.cast(value).as_unsigned()
    width = 8 * size
    if len(value) >= width:
        return value[:width]
    return Cat(value, Const(0, width - len(value)))


def pack_layout(layout, **values):
    """A :class:`ringkv.defs.protocol.Layout` as one little-endian Value (missing fields 0)."""
    parts = []
    for f in layout.fields:
        parts.append(_field(values.get(f[0], 0), f[1]))
    return Cat(*parts) if parts else Const(0, 8)


class CommandUnit:
    """One command family of the dispatcher (see the module docstring).

    Subclasses set :attr:`OPS` (the opcodes they execute) and :attr:`BODIES` (``{mode name:
    first state}`` of the response bodies they stream, besides the fixed record) and override
    the hooks below; each hook runs inside the dispatcher FSM's elaboration, ``d`` being the
    :class:`Dispatcher`.
    """

    OPS = ()
    BODIES = {}
    #: A unit only sealed builds have (``RingKVTop(sealed=True)``): its opcodes are not
    #: executed by an open build (``UNKNOWN_OP``).
    SEALED = False
    #: A unit only builds with the SDRAM self-test have (``RingKVTop(sdram_test=True)``).
    SDRAM = False

    def signals(self, d):
        """Create the unit's registers (before any hook that uses them)."""

    def responses(self, d) -> dict:
        """``{op: {field: value}}`` of the fixed response records of the unit's opcodes."""
        return {}

    def dispatch(self, d):
        """The ``DISPATCH`` cases of the unit's opcodes (``with d.m.Case(op.value): ...``)."""

    def states(self, d):
        """The unit's FSM states."""

    def background(self, d):
        """Logic that runs beside the dispatcher FSM (its own FSM), built after the signals."""


class _Registered:
    """``component`` as the units see it: its command stream ``port`` behind a
    :class:`~ringkv.hw.link.skid.StreamRegister` (a submodule ``name`` of ``m``), every other
    attribute its own."""

    def __init__(self, m, name, component, port):
        self._component, self._port = component, port
        stream_port = getattr(component, port)
        m.submodules[name] = self._register = StreamRegister(
            stream_port.signature.members["payload"].shape)
        wiring.connect(m, self._register.o, stream_port)

    def __getattr__(self, attr):
        if attr == self._port:
            return self._register.i
        return getattr(self._component, attr)


class Dispatcher:
    """Shared registers, resources and helpers of the dispatcher FSM (see the module docstring).

    ``top`` is the :class:`~ringkv.hw.top.RingKVTop` being elaborated (its children are
    already submodules of ``m``); ``units`` its :class:`CommandUnit` list, in order.
    """

    def __init__(self, m: Module, top, units, *, decoder, encoder, tokens, hasher, directory,
                 dma, attention):
        self.m, self.top, self.units = m, top, list(units)
        self.dec, self.enc, self.tm, self.hasher = decoder, encoder, tokens, hasher
        # The command streams of the directory, the DMA and the attention core go through a
        # register slice each (one clock): the dispatcher's state decode and the command
        # fields it muxes by state end in flip-flops, not in those blocks' FSMs.
        self.dr = _Registered(m, "dir_cmd", directory, "i")
        self.dma = _Registered(m, "dma_cmd", dma, "cmd")
        self.at = _Registered(m, "attn_cmd", attention, "cmd")
        self.config, self.layout = top.config, top.record_layout
        #: The request layouts this build executes (:func:`ringkv.defs.protocol.build_requests`).
        self.sealed = top.sealed
        self.requests = build_requests(self.sealed, top.has_sdram_test)
        m = self.m
        m.submodules.early_checks = self._early = Module()
        # response body modes: the fixed record first, then each unit's, in unit order
        self.modes = {"BUF": ("SEND_BUFFER", 0)}
        for unit in self.units:
            for name, state in unit.BODIES.items():
                self.modes[name] = (state, len(self.modes))

        # ---- counters ----------------------------------------------------------------------
        self.cycles = Signal(64)
        self.attn_cycles, self.dma_cycles, self.dir_cycles = Signal(64), Signal(64), Signal(64)
        self.frames, self.frame_errors, self.rejected = Signal(32), Signal(32), Signal(32)
        self.queries, self.hits, self.exports = Signal(32), Signal(32), Signal(32)
        self.stats_clear = Signal()
        #: comb: the request is refused (:meth:`reject`); ``rejected`` counts it a clock later
        #: (a register between the argument checks and the counter's 32-bit increment; no
        #: request can read the counter within that clock)
        self.rejecting = Signal()
        rejected_inc = Signal()
        m.d.sync += [self.cycles.eq(self.cycles + 1), rejected_inc.eq(self.rejecting)]
        with m.If(self.stats_clear):
            m.d.sync += [x.eq(0) for x in (self.attn_cycles, self.dma_cycles, self.dir_cycles,
                                            self.frames, self.frame_errors, self.rejected,
                                            self.queries, self.hits, self.exports)]
        with m.Else():
            m.d.sync += [self.attn_cycles.eq(self.attn_cycles + attention.busy),
                         self.dma_cycles.eq(self.dma_cycles + dma.busy),
                         self.dir_cycles.eq(self.dir_cycles + ~directory.i.ready),
                         self.rejected.eq(self.rejected + rejected_inc)]

        # ---- request registers -------------------------------------------------------------
        arg_max = max(lay_.size for lay_ in self.requests.values())
        self.op = LinkOp(Signal(8, name="op"))     # any byte; reset value 0 is no Op
        self.seq = Signal(8)
        self.length = Signal(16)
        # payload bytes taken from the decoder so far, counted by one rule (every transfer on
        # ``dec.data``, whichever state takes it), and ``more``: ``taken != length``, a register
        # kept with every write of ``taken``. As comparators in front of ``dec.data.ready``
        # (``DRAIN``'s 16 bits, ``TOKENS_IN``'s 32-bit token count) and a count in each state,
        # they led the half-rate board build's paths into ``taken``'s enable (17.3 ns at 60 MHz)
        self.taken = Signal(16)
        self.more = Signal()
        self.args = Signal(8 * arg_max)
        self.rstatus = Signal(Status)
        self.rlen = Signal(16)
        self.mode = Signal(range(len(self.modes)))
        self.idx = Signal(17)                # response byte / item index
        self.cycles_at = Signal(64)          # STATS snapshot; start of QUERY/EXPORT
        #: A unit (the recovery unit) raises ``not_ready`` (comb, from ``op`` and its state) to have
        #: ``DISPATCH`` answer ``NOT_READY`` with ``not_ready_word`` (a RESPONSES-sized record)
        #: instead of running the op; ``scan_busy`` while it owns the directory and the DMA.
        self.not_ready = Signal()
        self.not_ready_word = Signal(8 * max(lay_.size for lay_ in RESPONSES.values()))
        self.answer_not_ready = Signal()
        self.scan_busy = Signal()

        # ---- token memory read port 0: shared by the hash feeder and TOKENS_READ -----------
        # Its address is always ``h_i`` (the hash feeder's next token, TOKENS_READ's next
        # token): a register, not a mux by state, in front of the port's address and the
        # compare with the write address that keeps a read in a write's clock reading the old
        # token (yosys' emulation of the non-transparent read on a block RAM); only ``en`` is
        # the states' decode.
        self.rd0 = tokens.read_port(0)
        self.tok_i = Signal(32)              # tokens done (stream ops) / item index

        # ---- hash feeder -------------------------------------------------------------------
        # The feeder's stream (``h_valid`` and the token read on port 0) reaches the hash
        # engine through a register slice: the token memory's block RAM has no output register
        # (5.8 ns clock-to-out), and its data crossing the chip into the engine's two carry
        # chains in the same clock was the board's critical path (docs/BOARD.md). One clock
        # more per hash run; ``h_ready`` (the slice's ``i.ready``, a flip-flop) is the feeder's
        # backpressure.
        self.h_n = Signal(32)
        self.h_i = Signal(32)
        m.d.comb += self.rd0.addr.eq(self.h_i)
        self.h_valid, self.h_first, self.h_last = Signal(), Signal(), Signal()
        self.hash_val = Signal(64)
        m.submodules.hash_in = hash_in = StreamRegister(hasher.i.payload.shape())
        wiring.connect(m, hash_in.o, hasher.i)
        self.h_ready = hash_in.i.ready
        m.d.comb += [hash_in.i.valid.eq(self.h_valid), hash_in.i.payload.token.eq(self.rd0.data),
                     hash_in.i.payload.first.eq(self.h_first),
                     hash_in.i.payload.last.eq(self.h_last), hasher.o.ready.eq(1)]
        m.d.sync += [self.h_valid.eq(0), self.h_first.eq(0), self.h_last.eq(0)]

        # ---- directory, allocator mirror, commit sequence ---------------------------------
        self.dresp = Signal(directory.resp_layout)
        self.dir_now = Signal(32)
        #: The commit sequence number of the next export; it wraps modulo 2**32
        #: (:func:`ringkv.defs.record.seq_next`).
        self.commit_seq = Signal(32, init=1)
        self.a_next = Signal(range(top.regions + 1))     # mirrors of the FIFO levels
        self.b_level = Signal(range(top.regions + 1))

        # ---- DMA ---------------------------------------------------------------------------
        self.dma_resp = Signal(dma.resp.payload.shape())

        # ---- the attention core's ring port: the DMA while busy, else the dispatcher -------
        # The DMA owns the port while busy with an import or export, the dispatcher (RING_READ,
        # EXPORT's ring check) otherwise -- also while the recovery scan has the DMA read
        # headers. ``self.ring`` is the dispatcher's read-only side (the units drive its
        # ``ring_addr``, ``ring_re``, ``meta_ring`` and read the rest).
        m.submodules.ring_arbiter = arbiter = RingPortArbiter(dma.ring.signature)
        wiring.connect(m, dma.ring, arbiter.dma)
        wiring.connect(m, arbiter.core, attention.ring)
        m.d.comb += arbiter.dma_owns.eq(dma.busy & ~self.scan_busy)
        self.ring = arbiter.reader
        # The dispatcher's ring reads address the ring port with its item index: RING_READ's
        # byte or ring, EXPORT's ring check (``tok_i``, a register: no mux by state in front
        # of the port's byte and metadata muxes); only ``ring_re`` is a state's decode.
        m.d.comb += [self.ring.ring_addr.eq(self.tok_i), self.ring.meta_ring.eq(self.tok_i)]

        # ---- tenants (sealed builds): key slots' set bits, per-slot seeds, the hash seed ----
        if self.sealed:
            #: which key slots hold a key (``KeySlots.set``)
            self.key_set = Signal(KEY_SLOTS)
            #: each slot's prefix-hash seed (``tenant_seed``), written by KEY_SET
            self.seeds = top.tenant_seeds
            #: the current request's tenant slot (valid once ``tenant`` has passed it)
            self.tenant_slot = Signal(range(KEY_SLOTS))
            #: the hash engine's ``h_0``: the open seed, or the request's tenant's seed
            self.open_seed = hash_seed(self.config)
            self.h_seed = Signal(8 * SEED_BYTES, init=self.open_seed)
            m.d.comb += [self.key_set.eq(top.key_slots.set), hasher.seed_in.eq(self.h_seed)]

    # ---- helpers for the units -------------------------------------------------------------
    def early(self, value):
        """``value`` (a request check or a value derived from the request: its op, length and
        argument record, the token count) through a register: in ``DISPATCH`` it is what
        ``value`` was in ``DECODE``, the clock before, when all of those are final. The units'
        ``DISPATCH`` cases test these registers, not the comparators and adders behind them."""
        value = Value.cast(value)
        held = Signal(value.shape())
        # (in a module of their own: the caller is inside the FSM's cases and If chains, and
        # these registers take their value every clock, unconditionally)
        self._early.d.sync += held.eq(value)
        return held

    def arg(self, op, name):
        """Field ``name`` of ``op``'s request record, as collected in ``ARGS``."""
        off, size = self.requests[op].offset(name)
        return self.args[8 * off:8 * (off + size)]

    @contextmanager
    def tenant(self, op):
        """The ``DISPATCH`` case body of a tenant op (:data:`~ringkv.defs.protocol.TENANT_OPS`).

        An open build runs the body as it is. A sealed build first checks the request's
        ``slot``: ``>= KEY_SLOTS`` is ``BAD_ARG``, a slot without a key ``NO_KEY`` (refused:
        nothing done); otherwise the body runs with ``tenant_slot`` and the hash seed set to
        the slot's in the same clock (so the op's first hashed token, a clock later at the
        earliest, starts from the tenant's seed)."""
        if not self.sealed:
            yield
            return
        m = self.m
        slot = self.arg(op, "slot")
        sel = slot[:max(1, (KEY_SLOTS - 1).bit_length())]
        with m.If(slot >= KEY_SLOTS):
            self.reject(Status.BAD_ARG)
        with m.Elif(~self.key_set.bit_select(sel, 1)):
            self.reject(Status.NO_KEY)
        with m.Else():
            m.d.sync += [self.tenant_slot.eq(sel), self.h_seed.eq(Array(self.seeds)[sel])]
            yield

    def dma_tenant(self) -> dict:
        """The DMA command fields of the current request's tenant: none in an open build
        (``sealed`` 0: an open transfer), ``sealed``/``slot`` in a sealed one."""
        if not self.sealed:
            return {}
        return {"sealed": 1, "slot": self.tenant_slot}

    def respond(self, status, n_bytes=0, how="BUF"):
        """Answer: the response header next, then ``n_bytes`` of body ``how``."""
        m = self.m
        m.d.sync += [self.rstatus.eq(status), self.rlen.eq(n_bytes),
                     self.mode.eq(self.modes[how][1]), self.idx.eq(0)]
        m.next = "RESPOND_HEADER"

    def reject(self, status):
        """Refuse the request: drain what is left of its payload, then answer."""
        m = self.m
        m.d.sync += [self.rstatus.eq(status), self.rlen.eq(0), self.mode.eq(0)]
        m.d.comb += self.rejecting.eq(1)
        m.next = "DRAIN"

    def ok_fixed(self, op):
        """Answer ``OK`` with ``op``'s fixed response record."""
        self.respond(Status.OK, RESPONSES[op].size)

    def dir_to_status(self, s):
        return Mux(s == DirStatus.OK, Status.OK,
                   Mux(s == DirStatus.MISS, Status.MISS,
                       Mux(s == DirStatus.FULL, Status.FULL, Status.BAD_ARG)))

    def mirror_allocator(self, r):
        """Track FIFO A/B levels from a response ``r`` (the directory exports no levels)."""
        m, a_next, b_level = self.m, self.a_next, self.b_level
        with m.If(r.status == DirStatus.OK):
            with m.Switch(r.op):
                with m.Case(DirOp.CLEAR):
                    m.d.sync += [a_next.eq(0), b_level.eq(0)]
                with m.Case(DirOp.INSERT):
                    from_a = r.region == a_next
                    m.d.sync += [a_next.eq(a_next + from_a),
                                 b_level.eq(b_level + r.evicted - ~from_a)]
                with m.Case(DirOp.INSERT_EXISTING):
                    m.d.sync += [a_next.eq(r.region + 1),
                                 b_level.eq(b_level + (r.region - a_next))]
                with m.Case(DirOp.DELETE):
                    m.d.sync += b_level.eq(b_level + 1)
                with m.Case(DirOp.EXPIRE):
                    m.d.sync += b_level.eq(b_level + r.expired)

    def dir_call(self, name, next_state, **fields):
        """States ``name`` (issue) and ``name_W`` (await): one directory command."""
        m, dr = self.m, self.dr
        with m.State(name):
            m.d.comb += dr.i.valid.eq(1)
            m.d.comb += dr.i.payload.now.eq(self.dir_now)
            for key, value in fields.items():
                m.d.comb += getattr(dr.i.payload, key).eq(value)
            with m.If(dr.i.ready):
                m.d.sync += self.dir_now.eq(self.dir_now + 1)
                m.next = name + "_W"
        with m.State(name + "_W"):
            m.d.comb += dr.o.ready.eq(1)
            with m.If(dr.o.valid):
                m.d.sync += self.dresp.eq(dr.o.payload)
                self.mirror_allocator(dr.o.payload)
                m.next = next_state

    def dma_call(self, name, next_state, **fields):
        """States ``name`` (issue) and ``name_W`` (await): one DMA command."""
        m, dma = self.m, self.dma
        with m.State(name):
            m.d.comb += dma.cmd.valid.eq(1)
            for key, value in fields.items():
                m.d.comb += getattr(dma.cmd.payload, key).eq(value)
            with m.If(dma.cmd.ready):
                m.next = name + "_W"
        with m.State(name + "_W"):
            m.d.comb += dma.resp.ready.eq(1)
            with m.If(dma.resp.valid):
                m.d.sync += self.dma_resp.eq(dma.resp.payload)
                m.next = next_state

    def hash_call(self, name, next_state):
        """Hash the first ``h_n`` tokens (``h_n >= 1``) into ``hash_val``: ``n + 3`` clocks
        (the read, the slice ``hash_in``, the engine)."""
        m, h_i, h_n = self.m, self.h_i, self.h_n
        with m.State(name):
            m.d.comb += self.rd0.en.eq(1)
            m.d.sync += [self.h_valid.eq(1), self.h_first.eq(h_i == 0),
                         self.h_last.eq(h_i == h_n - 1), h_i.eq(h_i + 1)]
            with m.If(h_i == h_n - 1):
                m.next = name + "_W"
        with m.State(name + "_W"):
            with m.If(self.hasher.o.valid & self.hasher.o.payload.last):
                m.d.sync += self.hash_val.eq(self.hasher.o.payload.hash)
                m.next = next_state

    def attn_cmd(self, name, next_state, attn_op, layer):
        """States ``name`` (issue) and ``name_W`` (await status): one attention command."""
        m, at = self.m, self.at
        with m.State(name):
            m.d.comb += [at.cmd.valid.eq(1), at.cmd.payload.op.eq(attn_op),
                         at.cmd.payload.layer.eq(layer)]
            with m.If(at.cmd.ready):
                m.next = name + "_W"
        with m.State(name + "_W"):
            m.d.comb += at.status.ready.eq(1)
            with m.If(at.status.valid):
                m.next = next_state

    # ---- the FSM -----------------------------------------------------------------------------
    def elaborate(self):
        m, dec, enc = self.m, self.dec, self.enc
        op, length, taken = self.op, self.length, self.taken
        for unit in self.units:
            unit.signals(self)
        for unit in self.units:
            unit.background(self)

        # the fixed response record of the current op (units give the values), or the
        # not-ready record
        records = {}
        for unit in self.units:
            records.update(unit.responses(self))
        resp_word = Signal(8 * max(lay_.size for lay_ in RESPONSES.values()))
        with m.If(self.answer_not_ready):
            m.d.comb += resp_word.eq(self.not_ready_word)
        with m.Else():
            with m.Switch(op):
                for o, values in records.items():
                    with m.Case(o.value):
                        m.d.comb += resp_word.eq(pack_layout(RESPONSES[o], **values))
        # the record as it stands while its header is offered (RESPOND_HEADER, the clock
        # before SEND_BUFFER): the op's record mux and the byte select are a register apart
        resp_held = Signal.like(resp_word)

        with m.If(dec.data.valid & dec.data.ready):
            m.d.sync += [taken.eq(taken + 1), self.more.eq(taken + 1 != length)]

        with m.FSM(name="dispatch"):
            with m.State("IDLE"):
                m.d.comb += dec.error.ready.eq(1)
                with m.If(dec.error.valid):
                    p = dec.error.payload
                    m.d.sync += [op.eq(p.op), self.seq.eq(p.seq),
                                 self.frame_errors.eq(self.frame_errors + 1)]
                    self.respond(p.status)
                with m.Else():
                    m.d.comb += dec.header.ready.eq(1)
                    with m.If(dec.header.valid):
                        p = dec.header.payload
                        m.d.sync += [op.eq(p.op), self.seq.eq(p.seq), length.eq(p.length),
                                     taken.eq(0), self.more.eq(p.length != 0),
                                     self.args.eq(0),
                                     self.answer_not_ready.eq(0),
                                     self.frames.eq(self.frames + 1),
                                     self.cycles_at.eq(self.cycles)]
                        if self.sealed:        # every request hashes with the open seed...
                            m.d.sync += self.h_seed.eq(self.open_seed)   # ...but a tenant's
                        m.next = "HEADER_CHECK"

            with m.State("HEADER_CHECK"):
                # the payload length against the op's layout, by its rule in LENGTH
                with m.Switch(op):
                    for o, rule in LENGTH.items():
                        if o not in self.requests:
                            continue
                        size = self.requests[o].size
                        with m.Case(o.value):
                            if rule is Length.ANY:
                                m.next = "DECODE"
                                continue
                            if rule is Length.EXACT:
                                bad = length != size
                            elif rule is Length.OPTIONAL:
                                bad = (length != 0) & (length != size)
                            else:
                                bad = length < size
                            with m.If(bad):
                                self.reject(Status.BAD_LENGTH)
                            if rule is Length.TAIL:
                                with m.Else():
                                    m.next = "ARGS"
                            else:
                                with m.Elif(length == 0):
                                    m.next = "DECODE"
                                with m.Else():
                                    m.next = "ARGS"
                    with m.Default():
                        self.reject(Status.UNKNOWN_OP)

            with m.State("ARGS"):
                # collect the op's fixed record (length >= its size was checked)
                m.d.comb += dec.data.ready.eq(1)
                with m.If(dec.data.valid):
                    m.d.sync += self.args.word_select(taken[:5], 8).eq(dec.data.payload.data)
                    with m.Switch(op):
                        for o in self.requests:
                            size = self.requests[o].size
                            if size == 0:
                                continue
                            with m.Case(o.value):
                                with m.If(taken == size - 1):
                                    m.next = "DECODE"

            with m.State("DRAIN"):
                m.d.comb += dec.data.ready.eq(self.more)
                with m.If(~self.more):
                    m.next = "RESPOND_HEADER"

            with m.State("RESPOND_HEADER"):
                m.d.sync += resp_held.eq(resp_word)
                m.d.comb += [enc.header.valid.eq(1), enc.header.payload.op.eq(op),
                             enc.header.payload.seq.eq(self.seq),
                             enc.header.payload.status.eq(self.rstatus),
                             enc.header.payload.length.eq(self.rlen)]
                with m.If(enc.header.ready):
                    m.d.sync += self.idx.eq(0)
                    with m.If(self.rlen == 0):
                        m.next = "IDLE"
                    with m.Else():
                        with m.Switch(self.mode):
                            for state, number in self.modes.values():
                                with m.Case(number):
                                    m.next = state

            with m.State("SEND_BUFFER"):
                m.d.comb += [enc.data.valid.eq(1),
                             enc.data.payload.eq(resp_held.word_select(self.idx[:7], 8))]
                with m.If(enc.data.ready):
                    m.d.sync += self.idx.eq(self.idx + 1)
                    with m.If(self.idx == self.rlen - 1):
                        m.next = "IDLE"

            with m.State("DECODE"):
                # the request is complete: the units' early() registers take its checks
                m.next = "DISPATCH"

            with m.State("DISPATCH"):
                with m.If(self.not_ready):
                    m.d.sync += self.answer_not_ready.eq(1)
                    self.respond(Status.NOT_READY, RECOVERY_STATUS.size)
                with m.Else():
                    with m.Switch(op):
                        for unit in self.units:
                            unit.dispatch(self)
                        with m.Default():
                            self.respond(Status.INTERNAL)

            for unit in self.units:
                unit.states(self)

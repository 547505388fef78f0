"""The DMA engine: snapshot export (rings + tokens -> storage) and import (storage -> rings).

The record layout is ``host/record/codec.py``'s (``docs/blocks/record-format.md``); this
engine is bit-exact with its golden ``encode_record`` / ``import_record``.

**Export** (``op = EXPORT``, region ``r``): reads the metadata of every ring (all
``layers * kv_heads`` rings must agree on count and head, else ``BAD_REQUEST``), then writes
three storage transfers: the tokens
(read from token memory) to region sectors ``1..``, the KV area (K in token order, V column-wise,
read from the ring port) to sectors ``kv_sector..``, and last the header to sector 0, built on
the fly with the payload CRC and its own CRC. A power cut before the header is written leaves no
valid header in the region, so the previous snapshot (in another region) stays the newest.

**Import** (``op = IMPORT``, region, ``count`` and ``hash`` from the directory's hit): reads the
header and checks magic, version, header CRC, config (digest and fields, against constants built
from the engine's :class:`RingKVConfig`), field consistency, and that count and hash are the
requested ones; then streams the stored tokens and compares each with token memory **before**
any KV is written; then streams K and V into the ring port while computing the payload CRC, and
finally writes the metadata (count, head) of every ring. Failures before the KV phase change
nothing; a payload CRC failure (or storage error) in the KV phase writes count 0 and head
``W - 1`` to every ring (the state RING_CLEAR_ALL leaves), so the rings are empty and the next
token goes to slot 0: a miss, never a stale or corrupt cache.

**Verify** (``op = VERIFY``, region): the import's checks without count/hash/token comparison and
without writing the rings: the directory rebuild scan uses it (host-driven, see
``docs/blocks/storage.md``). The response carries the record's count, hash and commit sequence.

**Header** (``op = HEADER``, region): the header sector only, with the import's header checks
(magic, version and header size, header CRC, config digest and fields, field consistency):
``OK`` with the record's count, hash and commit sequence, or the first failing check's status.
The device's power-on recovery (``hw/commands/recovery.py``) scans with it: one sector read per
region, the payload left to the import's checks.

**Sealed** (``sealed = 1``, key slot ``slot``; ``docs/blocks/dma.md#the-record-mac``): the
engine drives the record MAC (``mac``, to a :class:`~ringkv.hw.seal.mac.MacUnit`) with the record's
MAC message: the token and K/V bytes as they move, then header bytes 0..507 with the tag as
zeros (a second pass of the header encoder, 508 clocks). An export under a slot whose key is not
set is ``NO_KEY`` and writes nothing; else it writes the slot's key id and the tag into the
header, which it still writes last. An import (and a VERIFY with ``sealed``) checks the record's
key id after the header checks (``NO_KEY`` unless it is the slot's; a sealed import also refuses
an open record), and the tag after the payload CRC, before the ring metadata: ``BAD_MAC`` empties
the rings as a payload CRC failure does. An open import refuses a sealed record (``NO_KEY``) and
an open record with a tag (``BAD_MAC``), as the golden import does. A failed sealed transfer
gives its message up with ``mac.abort``. Open transfers never drive ``mac`` and keep their
clocks; a sealed one adds no clock per byte, one clock to open the message and ``509 +`` the
MAC's last-byte-to-tag latency (42..83) from its last payload byte to the response.

The ring port is byte-addressed (``element * EB + byte``, ``EB`` bytes per element from the
configuration's numerics): the KV loops step over elements as above with the byte of the element
innermost, so a record's bytes of one element are consecutive and little-endian (the record
format's order) and both directions move one byte per clock whatever ``EB`` (on a wide port
an open import's K/V area a word a clock: below).

Throughput (the byte port): one byte per clock on the storage port's data streams (its peak) in
every data phase,
with a 4-entry FIFO behind a two-stage read pipeline (the ring port's read latency is two
clocks, the token port's one; the token byte waits a clock in a register). The payload CRC
runs one clock behind its bytes (a register between the byte and the CRC: the board build's
critical path ran from the attention core's banks through the byte mux into the CRC); export's
header CRC takes the header encoder's bytes a clock after their issue, from the write pipeline's
first stage (no clock added: the CRC's own bytes are read from it a stage later). Overhead per
transfer: three storage commands (tokens, KV, header), ``2 * layers * kv_heads`` clocks of
metadata reads and a few clocks per state change; see ``docs/BENCHMARKS.md`` for exact counts.
Backpressure: ``cmd`` is accepted only when idle; ``resp`` holds until taken; every storage
stream may stall at any time. The ring and token ports have fixed latency and no backpressure.

**A wide storage port** (``width=4``: ``StoragePortSignature(width=4)``, the SDRAM tier's at
half rate): an open import's K/V area moves a four-byte word a clock, into the payload CRC
(:class:`~ringkv.hw.storage.crc_bytes.CrcBytes`, four bytes a clock) and the K/V writer
(:class:`~ringkv.hw.storage.kv_words.KvWordWriter`: V turned from the record's columns to the
rings' rows) and from it into the ring port's four-byte writes (``ring_wide``: the attention
core must take them, ``AttentionCore.takes_wide_writes``); the ring metadata is written once
the writer's last chunk is in (state ``KV_DRAIN``). The header, the tokens and a sealed
import's K/V area (the MAC takes a byte a clock) come a byte a clock through a
:class:`~ringkv.hw.storage.port_width.WordsToBytes`; an OK status that arrives while it still
holds the last word's bytes waits for them. Export's bytes go four to a word through a
:class:`~ringkv.hw.storage.port_width.BytesToWords` (3 clocks more). Exact clocks against the
byte port: ``tests/hw/storage/test_dma.py``'s ``test_wide_port_clocks``; an open import's K/V
words are not on :attr:`DmaEngine.record_tap` (its CRC and the writer take them whole).

Structure: this module is the transfer sequencer (request registers, storage commands, the phase
state machine, the header checks' order); the header bytes come from
:class:`~ringkv.hw.storage.record_header.HeaderEncoder` and go to
:class:`~ringkv.hw.storage.record_header.HeaderParser`, the segment's loop nest is
:class:`~ringkv.hw.storage.dma_stream.RecordCursor`, export's read pipeline and FIFO
:class:`~ringkv.hw.storage.dma_stream.WritePipeline`, import's token check
:class:`~ringkv.hw.storage.dma_stream.TokenChecker`. Every byte of a record passes
:attr:`DmaEngine.record_tap` in both directions, where the CRCs read it and where another
consumer of the byte stream attaches (``docs/blocks/dma.md``).
"""

from amaranth import Const, Module, Mux, Signal
from amaranth.lib import crc, data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

from ringkv.defs import record as record_defs
from ringkv.defs.checks import check_int, check_pow2, check_type
from ringkv.defs.config import RingKVConfig
from ringkv.defs.mac import KEY_ID_BYTES, KEY_SLOTS, PERSON_RECORD, PERSONS, TAG_BYTES
from ringkv.defs.record import (
    MAC_HEADER_BYTES,
    RECORD_CRC,
    RECORD_STATUS_BITS,
    SECTOR,
    RecordLayout,
)

from ..attention.ring_port import RingPortSignature
from ..enums import shaped
from ..seal.mac import MacPortSignature
from ..store.token_memory import TokenReadSignature
from .crc_bytes import CrcBytes
from .dma_stream import (
    ByteSource,
    RecordCursor,
    RecordSegment,
    RecordTap,
    TokenChecker,
    WritePipeline,
)
from .kv_words import KvWordWriter, kv_words_supported
from .port import STORAGE_WIDTHS, StorageError, StorageOp, StoragePortSignature
from .port_width import BytesToWords, WordsToBytes
from .record_header import HEADER_CHECKS, HeaderEncoder, HeaderParser

__all__ = ["DmaOp", "DmaCommand", "DmaResponse", "DmaEngine", "RecordStatus", "RecordKind"]

#: :class:`ringkv.defs.record.RecordStatus` as a 4-bit shape (export, import, verify results).
RecordStatus = shaped(record_defs.RecordStatus, RECORD_STATUS_BITS, module=__name__)
#: ``kind`` of a record: any byte, the known ones named (:class:`ringkv.defs.record.RecordKind`).
RecordKind = shaped(record_defs.RecordKind, 8, module=__name__)
_RECORD_CRC = crc.Algorithm(**RECORD_CRC.algorithm_kwargs())


class DmaOp(enum.Enum, shape=2):
    EXPORT = 0
    IMPORT = 1
    VERIFY = 2
    HEADER = 3


#: ``kind``: the record's :class:`~ringkv.defs.record.RecordKind` value, written by EXPORT into
#: the header (offset 94); the import's checks ignore it (the header CRC covers it).
#: ``sealed``/``slot``: a sealed request (export seals under key slot ``slot``; import accepts
#: only a record sealed under that slot's key id whose tag verifies); 0: an open request.
DmaCommand = data.StructLayout({"op": DmaOp, "region": 16, "count": 32, "hash": 64, "seq": 32,
                                "kind": RecordKind, "sealed": 1, "slot": range(KEY_SLOTS)})
#: ``key_id``: the record's key id (0: an open record), from its header once the header CRC
#: passed; EXPORT: the key id it wrote.
DmaResponse = data.StructLayout({"status": RecordStatus, "count": 32, "hash": 64, "seq": 32,
                                 "key_id": 8 * KEY_ID_BYTES})


class DmaEngine(wiring.Component):
    """Snapshot DMA between the ring port / token memory and a storage port.

    Parameters: ``config`` (:class:`RingKVConfig`; ``window`` and ``head_dim`` powers of two,
    ``token_width`` <= 32), ``regions`` (storage regions, region ``r`` at sector
    ``base_lba + r * sectors_per_region``), ``base_lba``, ``width`` (the storage port's bytes
    a transfer: 1, or 4 when a K row is whole words, ``kv_words_supported``; see the module's
    docstring).

    Ports: ``cmd`` (In stream of :data:`DmaCommand`), ``resp`` (Out stream of
    :data:`DmaResponse`), ``storage`` (Out :class:`StoragePortSignature`), ``ring`` (Out
    :class:`RingPortSignature`), ``tokens`` (Out :class:`TokenReadSignature`), ``busy``;
    ``mac`` (Out :class:`~ringkv.hw.seal.mac.MacPortSignature`: the record MAC core), ``key_ids``
    and ``key_set`` (In: the key slots' ids and set bits,
    :class:`~ringkv.hw.seal.key_slots.KeySlots`). ``mac`` is driven only during a sealed transfer
    (``cmd.valid`` in ``MAC_OPEN``, ``i`` while the message is open, ``o.ready`` in ``MAC_TAG``,
    ``abort`` in ``RESPOND`` of a transfer that gave its message up); ``cmd`` may wait there while
    the core serves another user.
    """

    def __init__(self, config: RingKVConfig, regions: int, base_lba: int = 0, *,
                 width: int = 1):
        check_type("config", config, RingKVConfig)
        if width not in STORAGE_WIDTHS:
            raise ValueError(f"width must be one of {STORAGE_WIDTHS} bytes, not {width!r}")
        if width == 4 and not kv_words_supported(config):
            raise ValueError(f"a storage port of four-byte words needs a K row of whole words: "
                             f"head_dim * EB = {config.head_dim * RecordLayout(config).elem_bytes}")
        check_int("regions", regions, low=1, high=(1 << 16) - 1)
        check_int("base_lba", base_lba, low=0)
        check_pow2("window", config.window)
        check_pow2("head_dim", config.head_dim)
        check_int("token_width", config.token_width, high=32)
        layout = RecordLayout(config)
        if base_lba + regions * layout.sectors_per_region > 1 << 32:
            raise ValueError(f"{regions} regions of {layout.sectors_per_region} sectors do not "
                             f"fit in 32-bit sector addresses")
        if config.layers * config.kv_heads > 256:
            raise ValueError(f"layers * kv_heads must be at most 256, not "
                             f"{config.layers * config.kv_heads}")
        if max(layout.kv_sectors_max, layout.token_sectors_max) >= 1 << 16:
            raise ValueError("a record area must be less than 65536 sectors")
        self._config, self._regions, self._base_lba, self._layout = (config, regions, base_lba,
                                                                     layout)
        self._width = width
        super().__init__({
            "cmd": In(stream.Signature(DmaCommand)),
            "resp": Out(stream.Signature(DmaResponse)),
            "storage": Out(StoragePortSignature(width)),
            "ring": Out(RingPortSignature.for_config(config)),
            "tokens": Out(TokenReadSignature(config.max_tokens, config.token_width)),
            "busy": Out(1),
            "mac": Out(MacPortSignature()),
            "key_ids": In(data.ArrayLayout(8 * KEY_ID_BYTES, KEY_SLOTS)),
            "key_set": In(KEY_SLOTS),
        })
        #: The record's bytes as they move, both directions (:data:`RecordTap`; not a port:
        #: the attachment point of a consumer of the byte stream, see ``docs/blocks/dma.md``).
        self.record_tap = Signal(RecordTap)

    @property
    def config(self):
        return self._config

    @property
    def regions(self):
        return self._regions

    @property
    def layout(self):
        return self._layout

    @property
    def width(self):
        """Bytes a storage transfer: 1, or 4 (an open import's K/V area a word a clock)."""
        return self._width

    def elaborate(self, platform):
        m = Module()
        c, lay = self._config, self._layout
        LH, W = c.layers * c.kv_heads, c.window
        TB = lay.token_bytes
        KV_PER_SLOT = 2 * LH * c.head_dim * lay.elem_bytes     # KV bytes per valid slot

        st = self.storage
        # --- request and record registers ------------------------------------------------
        op = Signal(DmaOp)
        region = Signal(16)
        req_count = Signal(32)
        req_hash = Signal(64)
        req_seq = Signal(32)
        req_kind = Signal(RecordKind)
        req_sealed = Signal()
        req_slot = Signal(range(KEY_SLOTS))
        base_lba = Signal(32)
        n = Signal(32)                    # token count of the snapshot
        head = Signal(range(W))
        status = Signal(RecordStatus)
        kv_started = Signal()
        # --- the record MAC (docs/blocks/dma.md#the-record-mac) --------------------------
        key_id = Signal(8 * KEY_ID_BYTES)  # export: the id written; else the header's
        tag = Signal(8 * TAG_BYTES)        # export: the tag, once computed
        mac_run = Signal()                 # this transfer runs the MAC
        mac_open = Signal()                # the MAC holds a message of ours (or its tag)
        slot_set = Signal()
        slot_id = Signal(8 * KEY_ID_BYTES)
        m.d.comb += [slot_set.eq(self.key_set.bit_select(req_slot, 1)),
                     slot_id.eq(self.key_ids[req_slot])]

        # --- the pieces ------------------------------------------------------------------
        wide = self._width == 4
        m.submodules.pcrc = pcrc = (CrcBytes(RECORD_CRC) if wide else
                                    _RECORD_CRC(data_width=8).create())
        m.submodules.hcrc = hcrc = _RECORD_CRC(data_width=8).create()
        m.submodules.cursor = cursor = RecordCursor(c)
        m.submodules.header_encoder = henc = HeaderEncoder(c)
        m.submodules.header_parser = hparse = HeaderParser(c)
        m.submodules.write_pipeline = wpipe = WritePipeline(c)
        m.submodules.token_checker = tcheck = TokenChecker(c)

        # --- segment and address generator -------------------------------------------------
        seg = Signal(RecordSegment)
        # The segment counters are as wide as the largest segment of this configuration: a
        # segment runs only once its count is checked (export: META_CHECK's ``n <= max_tokens``;
        # import and verify: HEADER_EVALUATE's fields check), so ``seg_pay`` and ``seg_count``
        # fit. 34 bits wide, ``pay_left``'s enable fanned out to every bit across the DMA
        # (15.1-15.7 ns of the half-rate board builds at 60 MHz; 18 bits at the default shape).
        pay_max = max(SECTOR - 4, c.max_tokens * TB, W * KV_PER_SLOT)
        total_max = SECTOR * max(1, -(-pay_max // SECTOR))
        pay_left = Signal(range(pay_max + 1))     # payload bytes left in the segment
        # ``pay_left != 0``, a register of its own kept with every write of pay_left (as
        # ``total_nz``): the 34-bit compare sat in front of the storage port's ``rdata.ready``
        # (word mode) and of pay_left's own enable (16.2 ns in the half-rate board build of
        # 763fb32, the 10 % margin at 60 MHz being 15.0 ns)
        pay_nz = Signal()
        total_left = Signal(range(total_max + 1))   # bytes (payload + padding) left
        # ``total_left != 0`` as a register of its own, kept with every write of total_left:
        # the 26-bit compare in front of the byte issue (and from there the header CRC's
        # enable) was one of the DMA's longest paths at the board's 60 MHz.
        total_nz = Signal()
        hdr_pos = cursor.hdr_pos

        # --- export: header bytes, built at issue time --------------------------------------
        # (and the MAC's header pass, both directions: an import's fields are the header's
        # it read, its count, head and lengths checked equal to what they derive from)
        exporting = op == DmaOp.EXPORT
        importing = op == DmaOp.IMPORT
        hd = hparse.fields

        # --- the snapshot's sizes, registers a clock behind the count and head they derive
        # from (export: ``n``, ``head``, set in META_CAPTURE at least two clocks before
        # SEGMENT_COMMAND reads them; otherwise the parsed header's, whose bytes came at
        # least four clocks before HEADER_EVALUATE). Computed in one clock from ``n`` (the
        # 32-bit ``n < W``, then ``v - 1`` in the cursor) they were the board's longest path
        # at 60 MHz with the half-rate SDRAM (docs/blocks/dma.md).
        n_src = Signal(32)
        head_src = Signal(range(W))
        m.d.comb += [n_src.eq(Mux(exporting, n, hd.count)),
                     head_src.eq(Mux(exporting, head, hd.ring_head))]
        v_src = Signal(range(W + 1))
        m.d.comb += v_src.eq(Mux(n_src < W, n_src, W))
        v = Signal(range(W + 1))
        tok_payload = Signal(34)
        kv_payload = Signal(32)
        tok_sectors = Signal(16)
        kv_sectors = Signal(16)
        s0 = Signal(range(W))                    # oldest valid slot, mod W (W a power of two)
        m.d.sync += [v.eq(v_src), tok_payload.eq(n_src * TB), kv_payload.eq(v_src * KV_PER_SLOT),
                     tok_sectors.eq((n_src * TB + SECTOR - 1) >> 9),
                     kv_sectors.eq((v_src * KV_PER_SLOT + SECTOR - 1) >> 9),
                     s0.eq(head_src + 1 - v_src)]
        m.d.comb += [cursor.segment.eq(seg), cursor.valid_slots.eq(v), cursor.first_slot.eq(s0)]
        # (the header CRC's bytes 508..511 do not come from the encoder: the write pipeline
        # takes them from the CRC itself, ByteSource.CRC; its ``header_crc`` stays 0)
        m.d.comb += [henc.pos.eq(hdr_pos),
                     henc.fields.commit_seq.eq(Mux(exporting, req_seq, hd.commit_seq)),
                     henc.fields.prefix_hash.eq(Mux(exporting, req_hash, hd.prefix_hash)),
                     henc.fields.count.eq(n), henc.fields.ring_head.eq(head),
                     henc.fields.token_bytes.eq(tok_payload),
                     henc.fields.k_bytes.eq(kv_payload >> 1),
                     henc.fields.v_bytes.eq(kv_payload >> 1),
                     henc.fields.payload_crc.eq(pcrc.crc),
                     henc.fields.kind.eq(Mux(exporting, req_kind, hd.kind)),
                     henc.fields.key_id.eq(key_id), henc.fields.mac_tag.eq(tag)]

        # --- export datapath: issue -> read pipeline -> FIFO -> storage.wdata ---------------
        m.d.comb += [wpipe.token_word.eq(self.tokens.data),
                     wpipe.ring_rdata.eq(self.ring.ring_rdata),
                     wpipe.sel.eq(cursor.token_byte), wpipe.crc.eq(hcrc.crc)]
        # Export's header bytes 0..507 reach the header CRC from the write pipeline's first
        # stage, a clock after their issue (the encoder's byte mux into the CRC's update in one
        # clock was one of the DMA's longest paths at the board's 60 MHz); import's come from
        # the storage port's read data in the clock it hands them over (below).
        m.d.comb += [hcrc.valid.eq(wpipe.hdr_valid), hcrc.data.eq(wpipe.hdr_byte)]
        if wide:
            # export's bytes, four to a storage word
            m.submodules.pack = pack = BytesToWords()
            wiring.connect(m, wpipe.wdata, pack.i)
            wiring.connect(m, pack.o, wiring.flipped(st.wdata))
            wpipe_empty = wpipe.empty & ~pack.o.valid
        else:
            wiring.connect(m, wpipe.wdata, wiring.flipped(st.wdata))
            wpipe_empty = wpipe.empty

        # --- import: the storage's read data as bytes (rd_*), or on a wide port an open
        # import's K/V area as words (word_mode: the payload CRC four bytes a clock, the K/V
        # writer into the ring port's four-byte writes, docs/blocks/dma.md)
        rd_valid, rd_ready = Signal(), Signal()
        word_mode = Signal()
        if wide:
            m.submodules.unpack = unpack = WordsToBytes()
            m.submodules.kv_writer = kvw = KvWordWriter(c)
            # a register a clock behind its terms: they change only on the way into
            # SEGMENT_COMMAND, which lasts a clock at least before SEGMENT_DATA uses it (as a
            # comb decode of the segment it led the board build's paths through the storage
            # handshakes into the tier's state and the backends' status: 15.8 ns at 60 MHz)
            m.d.sync += word_mode.eq(importing & (seg == RecordSegment.KV) & ~mac_run)
            m.d.comb += [unpack.i.valid.eq(st.rdata.valid & ~word_mode),
                         unpack.i.payload.eq(st.rdata.payload),
                         rd_valid.eq(unpack.o.valid), unpack.o.ready.eq(rd_ready)]
            with m.If(~word_mode):
                m.d.comb += st.rdata.ready.eq(unpack.i.ready)
            rbyte = unpack.o.payload
            m.d.comb += [kvw.valid_slots.eq(v), kvw.first_slot.eq(s0), kvw.writes.ready.eq(1)]
        else:
            m.d.comb += [rd_valid.eq(st.rdata.valid), st.rdata.ready.eq(rd_ready)]
            rbyte = st.rdata.payload

        # --- import: header parse, token compare; K/V bytes go straight to the ring port -----
        m.d.comb += [hparse.pos.eq(hdr_pos), hparse.byte.eq(rbyte),
                     tcheck.byte.eq(rbyte), tcheck.sel.eq(cursor.token_byte),
                     tcheck.token_word.eq(self.tokens.data)]

        # --- the record's bytes as the CRCs see them: the tap (docs/blocks/dma.md) -----------
        # payload CRC one clock behind its bytes (export: the FIFO's input; import: the
        # storage's read data): nothing reads it until the segment's status has come
        crc_v, crc_d = Signal(), Signal(8)
        pcrc_v, pcrc_d = Signal(), Signal(8)
        m.d.comb += [crc_v.eq(wpipe.tap_valid), crc_d.eq(wpipe.tap_byte)]
        m.d.sync += [pcrc_v.eq(crc_v), pcrc_d.eq(crc_d)]
        m.d.comb += [pcrc.valid.eq(pcrc_v), pcrc.data.eq(pcrc_d)]
        if wide:
            # a K/V word of word mode, a clock behind as the bytes are
            crc_wv, crc_wd = Signal(), Signal(32)
            pcrc_wv, pcrc_wd = Signal(), Signal(32)
            m.d.sync += [pcrc_wv.eq(crc_wv), pcrc_wd.eq(crc_wd)]
            with m.If(pcrc_wv):
                m.d.comb += [pcrc.valid.eq(1), pcrc.data.eq(pcrc_wd), pcrc.n.eq(4)]
            with m.Else():
                m.d.comb += pcrc.n.eq(1)
        tap = self.record_tap
        # (an export's header byte is on the tap a clock after its issue, the cursor one past it)
        m.d.comb += [tap.valid.eq(hcrc.valid | crc_v), tap.segment.eq(seg),
                     tap.pos.eq(Mux(exporting, hdr_pos - 1, hdr_pos)),
                     tap.byte.eq(Mux(hcrc.valid, hcrc.data, crc_d))]
        # the MAC takes the payload bytes with the payload CRC, one clock behind the tap (off
        # the ring port's read path); the header pass (MAC_HEADER) overrides this below
        mac = self.mac
        m.d.comb += [mac.i.valid.eq(mac_open & pcrc_v), mac.i.payload.data.eq(pcrc_d),
                     mac.cmd.payload.person.eq(PERSONS.index(PERSON_RECORD)),
                     mac.cmd.payload.slot.eq(req_slot)]
        # a key check decides this request: an import always (no slot: no key), a verify
        # with ``sealed``; a sealed import refuses an open record too
        check_keys = importing | ((op == DmaOp.VERIFY) & req_sealed)
        key_fail = check_keys & Mux(hd.key_id == 0, importing & req_sealed,
                                    ~(req_sealed & slot_set & (hd.key_id == slot_id)))
        # an open record carries a zero tag (host/record/codec.py's check_mac)
        tag_bad = check_keys & (hd.key_id == 0) & (hd.mac_tag != 0)

        ml = Signal(range(max(LH, 2)))    # ring index of a metadata access
        meta_bad = Signal()
        meta_w_count = Signal(32)
        meta_w_head = Signal(range(W))
        seg_count = Signal(16)
        seg_lba = Signal(32)
        seg_pay = Signal(34)
        with m.Switch(seg):
            with m.Case(RecordSegment.HDR):
                m.d.comb += [seg_count.eq(1), seg_lba.eq(base_lba), seg_pay.eq(SECTOR - 4)]
            with m.Case(RecordSegment.TOK):
                m.d.comb += [seg_count.eq(tok_sectors), seg_lba.eq(base_lba + 1),
                             seg_pay.eq(tok_payload)]
            with m.Default():
                m.d.comb += [seg_count.eq(kv_sectors), seg_lba.eq(base_lba + lay.kv_sector),
                             seg_pay.eq(kv_payload)]

        # token memory: read every clock at the cursor's token (a register). Both readers, the
        # write pipeline and the token check, take the word exactly a clock after the byte's
        # issue or check, so nothing needs the port's hold while ``en`` is low; an ``en`` from
        # the segment's handshakes crossed the chip to the block RAMs' clock enables (16.9 ns
        # of the half-rate board build at 60 MHz)
        m.d.comb += [self.ring.ring_addr.eq(cursor.ring_addr), self.ring.meta_ring.eq(ml),
                     self.tokens.addr.eq(cursor.token_index), self.tokens.en.eq(1),
                     self.ring.ring_wdata.eq(rbyte),
                     self.ring.meta_wcount.eq(meta_w_count), self.ring.meta_whead.eq(meta_w_head)]
        if wide:
            with m.If(kvw.writes.valid):
                m.d.comb += [self.ring.ring_addr.eq(kvw.writes.payload.addr),
                             self.ring.ring_wdata.eq(kvw.writes.payload.data),
                             self.ring.ring_we.eq(1), self.ring.ring_wide.eq(1)]
        with m.FSM(name="dma"):
            with m.State("IDLE"):
                m.d.comb += self.cmd.ready.eq(1)
                with m.If(self.cmd.valid):
                    p = self.cmd.payload
                    m.d.sync += [op.eq(p.op), region.eq(p.region), req_count.eq(p.count),
                                 req_hash.eq(p.hash), req_seq.eq(p.seq), req_kind.eq(p.kind),
                                 req_sealed.eq(p.sealed), req_slot.eq(p.slot), key_id.eq(0),
                                 tag.eq(0), mac_run.eq(0),
                                 status.eq(RecordStatus.OK), kv_started.eq(0),
                                 meta_bad.eq(0), ml.eq(0), n.eq(0), head.eq(0)]
                    m.d.comb += [pcrc.start.eq(1), hcrc.start.eq(1), hparse.clear.eq(1),
                                 tcheck.clear.eq(1)]
                    m.next = "CHECK"
            with m.State("CHECK"):
                m.d.comb += self.busy.eq(1)
                m.d.sync += base_lba.eq(self._base_lba + region * lay.sectors_per_region)
                with m.If(region >= self._regions):
                    m.d.sync += status.eq(RecordStatus.BAD_REQUEST)
                    m.next = "RESPOND"
                with m.Elif(exporting & req_sealed & ~slot_set):
                    m.d.sync += status.eq(RecordStatus.NO_KEY)
                    m.next = "RESPOND"
                with m.Elif(exporting):
                    m.d.sync += [key_id.eq(Mux(req_sealed, slot_id, 0)), mac_run.eq(req_sealed)]
                    m.next = "META_READ"
                with m.Else():
                    m.d.sync += seg.eq(RecordSegment.HDR)
                    m.next = "SEGMENT_COMMAND"
            # ---- export: metadata of every ring ----
            with m.State("META_READ"):
                m.d.comb += self.busy.eq(1)
                m.next = "META_CAPTURE"
            with m.State("META_CAPTURE"):
                m.d.comb += self.busy.eq(1)
                with m.If(self.ring.meta_head >= W):
                    m.d.sync += meta_bad.eq(1)
                with m.If(ml == 0):
                    m.d.sync += [n.eq(self.ring.meta_count), head.eq(self.ring.meta_head)]
                with m.Elif((self.ring.meta_count != n) | (self.ring.meta_head != head)):
                    m.d.sync += meta_bad.eq(1)
                with m.If(ml == LH - 1):
                    m.d.sync += ml.eq(0)
                    m.next = "META_CHECK"
                with m.Else():
                    m.d.sync += ml.eq(ml + 1)
                    m.next = "META_READ"
            with m.State("META_CHECK"):
                m.d.comb += self.busy.eq(1)
                with m.If(meta_bad | (n > c.max_tokens)):
                    m.d.sync += status.eq(RecordStatus.BAD_REQUEST)
                    m.next = "RESPOND"
                with m.Else():
                    m.d.sync += seg.eq(Mux(n == 0, RecordSegment.HDR, RecordSegment.TOK))
                    with m.If(mac_run):
                        m.next = "MAC_OPEN"
                    with m.Else():
                        m.next = "SEGMENT_COMMAND"
            # ---- sealed transfers: open the MAC's message (the core may be busy elsewhere) ----
            with m.State("MAC_OPEN"):
                m.d.comb += [self.busy.eq(1), mac.cmd.valid.eq(1)]
                with m.If(mac.cmd.ready):
                    m.d.sync += mac_open.eq(1)
                    with m.If(exporting & (seg == RecordSegment.HDR)):    # no payload
                        m.d.comb += cursor.start.eq(1)
                        m.next = "MAC_HEADER"
                    with m.Elif(exporting):
                        m.next = "SEGMENT_COMMAND"
                    with m.Elif(hd.count == 0):
                        m.next = "CRC_EVALUATE"
                    with m.Else():
                        m.d.sync += seg.eq(RecordSegment.TOK)
                        m.next = "SEGMENT_COMMAND"
            # ---- one storage transfer ----
            with m.State("SEGMENT_COMMAND"):
                m.d.comb += [self.busy.eq(1), st.cmd.valid.eq(1),
                             st.cmd.payload.op.eq(Mux(exporting, StorageOp.WRITE,
                                                      StorageOp.READ)),
                             st.cmd.payload.lba.eq(seg_lba), st.cmd.payload.count.eq(seg_count)]
                with m.If(st.cmd.ready):
                    m.d.sync += [pay_left.eq(seg_pay), pay_nz.eq(seg_pay != 0),
                                 total_left.eq(seg_count * SECTOR),
                                 total_nz.eq(seg_count != 0)]
                    m.d.comb += cursor.start.eq(1)
                    if wide:
                        m.d.comb += [kvw.start.eq(1), unpack.clear.eq(1), pack.clear.eq(1)]
                    m.next = "SEGMENT_DATA"
            with m.State("SEGMENT_DATA"):
                # on a wide port an OK status may come while the unpacker still holds the
                # last word's bytes: it waits for them (an error status is taken at once)
                # (or a word the port hands over in the status's own clock)
                status_wait = ((st.status.payload.error == StorageError.OK) & total_nz
                               & (unpack.o.valid | (st.rdata.valid & unpack.i.ready
                                                    & ~word_mode))) if wide else Const(0)
                m.d.comb += [self.busy.eq(1), st.status.ready.eq(~status_wait)]
                with m.If(exporting):
                    with m.If(total_nz & wpipe.room):
                        m.d.sync += [total_left.eq(total_left - 1), total_nz.eq(total_left != 1)]
                        m.d.comb += wpipe.issue.eq(1)
                        with m.If(seg == RecordSegment.HDR):
                            # 0..507 the encoder's, into the header CRC (``hdr``); 508..511
                            # the CRC's bytes (``sel``), read when it has taken byte 507
                            body = hdr_pos < SECTOR - 4
                            m.d.comb += [wpipe.source.eq(Mux(body, ByteSource.CONST,
                                                             ByteSource.CRC)),
                                         wpipe.const.eq(henc.byte), wpipe.hdr.eq(body),
                                         wpipe.sel.eq(hdr_pos[:2]), cursor.step.eq(1)]
                        with m.Elif(pay_nz):
                            m.d.sync += [pay_left.eq(pay_left - 1), pay_nz.eq(pay_left != 1)]
                            m.d.comb += cursor.step.eq(1)
                            with m.If(seg == RecordSegment.TOK):
                                m.d.comb += wpipe.source.eq(ByteSource.TOKEN)
                            with m.Else():
                                m.d.comb += [self.ring.ring_re.eq(1),
                                             wpipe.source.eq(ByteSource.RING)]
                        with m.Else():         # padding to the sector
                            m.d.comb += [wpipe.source.eq(ByteSource.CONST), wpipe.const.eq(0)]
                if wide:
                    with m.Elif(word_mode):
                        # an open import's K/V area (and its padding), a word a clock
                        to_kvw = pay_nz
                        m.d.comb += [st.rdata.ready.eq(total_nz & (kvw.words.ready | ~to_kvw)),
                                     kvw.words.valid.eq(st.rdata.valid & total_nz & to_kvw),
                                     kvw.words.payload.eq(st.rdata.payload)]
                        with m.If(st.rdata.valid & st.rdata.ready):
                            m.d.sync += [total_left.eq(total_left - 4),
                                         total_nz.eq(total_left != 4)]
                            with m.If(to_kvw):
                                m.d.sync += [pay_left.eq(pay_left - 4), pay_nz.eq(pay_left != 4),
                                             kv_started.eq(1)]
                                m.d.comb += [crc_wv.eq(1), crc_wd.eq(st.rdata.payload)]
                with m.Else():
                    m.d.comb += rd_ready.eq(total_nz)
                    with m.If(rd_valid & total_nz):
                        m.d.sync += [total_left.eq(total_left - 1), total_nz.eq(total_left != 1)]
                        with m.If(seg == RecordSegment.HDR):
                            m.d.comb += [hcrc.valid.eq(1), hcrc.data.eq(rbyte), hparse.valid.eq(1),
                                         cursor.step.eq(1)]
                        with m.Elif(pay_nz):
                            m.d.sync += [pay_left.eq(pay_left - 1), pay_nz.eq(pay_left != 1)]
                            m.d.comb += [crc_v.eq(1), crc_d.eq(rbyte)]
                            m.d.comb += cursor.step.eq(1)
                            with m.If(seg == RecordSegment.TOK):
                                with m.If(importing):
                                    m.d.comb += tcheck.check.eq(1)
                            with m.Elif(importing):
                                m.d.comb += self.ring.ring_we.eq(1)
                                m.d.sync += kv_started.eq(1)
                data_done = ~total_nz & wpipe_empty
                with m.If(st.status.valid & ~status_wait):
                    with m.If((st.status.payload.error != StorageError.OK) | ~data_done):
                        m.d.sync += status.eq(RecordStatus.STORAGE)
                        m.d.comb += wpipe.flush.eq(1)
                        if wide:
                            m.d.comb += [pack.clear.eq(1), unpack.clear.eq(1), kvw.flush.eq(1)]
                        m.next = "FAIL"
                    with m.Else():
                        m.next = "SEGMENT_NEXT"
            with m.State("SEGMENT_NEXT"):
                m.d.comb += self.busy.eq(1)
                with m.If(exporting):
                    with m.Switch(seg):
                        with m.Case(RecordSegment.TOK):
                            m.d.sync += seg.eq(Mux(v == 0, RecordSegment.HDR, RecordSegment.KV))
                            with m.If(mac_run & (v == 0)):
                                m.d.comb += cursor.start.eq(1)
                                m.next = "MAC_HEADER"
                            with m.Else():
                                m.next = "SEGMENT_COMMAND"
                        with m.Case(RecordSegment.KV):
                            m.d.sync += seg.eq(RecordSegment.HDR)
                            with m.If(mac_run):
                                m.d.comb += cursor.start.eq(1)
                                m.next = "MAC_HEADER"
                            with m.Else():
                                m.next = "SEGMENT_COMMAND"
                        with m.Default():
                            m.next = "RESPOND"
                with m.Else():
                    with m.Switch(seg):
                        with m.Case(RecordSegment.HDR):
                            m.d.sync += [n.eq(hd.count), head.eq(hd.ring_head)]
                            m.next = "HEADER_EVALUATE"
                        with m.Case(RecordSegment.TOK):
                            with m.If(importing & tcheck.mismatch):
                                m.d.sync += status.eq(RecordStatus.TOKEN_MISMATCH)
                                m.next = "RESPOND"
                            with m.Elif(v == 0):
                                m.next = "CRC_EVALUATE"
                            with m.Else():
                                m.d.sync += seg.eq(RecordSegment.KV)
                                m.next = "SEGMENT_COMMAND"
                        with m.Default():
                            m.next = "KV_DRAIN" if wide else "CRC_EVALUATE"
            if wide:
                # the K/V writer's last V chunk reaches the rings ``v`` clocks after its last
                # word; the ring metadata is written after it
                with m.State("KV_DRAIN"):
                    m.d.comb += self.busy.eq(1)
                    with m.If(kvw.idle):
                        m.next = "CRC_EVALUATE"
            # ---- import: header checks, in the golden model's order ----
            with m.State("HEADER_EVALUATE"):
                m.d.comb += self.busy.eq(1)
                # the response's key id: the header's, once its magic, version and CRC passed
                m.d.sync += key_id.eq(Mux(~hparse.bad_magic & ~hparse.bad_version
                                          & hcrc.match_detected, hd.key_id, 0))
                failed = {"magic": hparse.bad_magic, "version": hparse.bad_version,
                          "header_crc": ~hcrc.match_detected, "config": hparse.bad_config,
                          "fields": ((hd.count > c.max_tokens) | (hd.ring_head >= W)
                                     | (hd.token_bytes != tok_payload)
                                     | (hd.k_bytes != kv_payload >> 1)
                                     | (hd.v_bytes != kv_payload >> 1))}
                for i, (check, result) in enumerate(HEADER_CHECKS):
                    with (m.If if i == 0 else m.Elif)(failed[check]):
                        m.d.sync += status.eq(RecordStatus[result])
                        m.next = "RESPOND"
                with m.Elif(op == DmaOp.HEADER):
                    m.next = "RESPOND"
                with m.Elif(key_fail):
                    m.d.sync += status.eq(RecordStatus.NO_KEY)
                    m.next = "RESPOND"
                with m.Elif(importing & ((hd.count != req_count) | (hd.prefix_hash != req_hash))):
                    m.d.sync += status.eq(RecordStatus.NOT_THIS)
                    m.next = "RESPOND"
                with m.Elif(check_keys & (hd.key_id != 0)):      # a sealed record, its key held
                    m.d.sync += mac_run.eq(1)
                    m.next = "MAC_OPEN"
                with m.Elif(hd.count == 0):
                    m.next = "CRC_EVALUATE"
                with m.Else():
                    m.d.sync += seg.eq(RecordSegment.TOK)
                    m.next = "SEGMENT_COMMAND"
            with m.State("CRC_EVALUATE"):
                m.d.comb += self.busy.eq(1)
                crc_ok = pcrc.crc == hd.payload_crc
                ok = crc_ok & ~tag_bad
                with m.If(~crc_ok):
                    m.d.sync += status.eq(RecordStatus.BAD_PAYLOAD_CRC)
                with m.Elif(tag_bad):
                    m.d.sync += status.eq(RecordStatus.BAD_MAC)
                with m.If(crc_ok & mac_run):       # the tag decides: the MAC's header pass
                    m.d.sync += seg.eq(RecordSegment.HDR)
                    m.d.comb += cursor.start.eq(1)
                    m.next = "MAC_HEADER"
                with m.Elif(importing & (ok | kv_started)):
                    m.d.sync += [meta_w_count.eq(Mux(ok, n, 0)),
                                 meta_w_head.eq(Mux(ok, head, W - 1)), ml.eq(0)]
                    m.next = "META_WRITE"
                with m.Else():
                    m.next = "RESPOND"
            # ---- the MAC's header pass: bytes 0..507, the tag field as zeros (``tag`` is 0
            # until MAC_TAG), one per clock (the core never stalls inside a message) ----
            with m.State("MAC_HEADER"):
                m.d.comb += [self.busy.eq(1), mac.i.valid.eq(1), mac.i.payload.data.eq(henc.byte),
                             mac.i.payload.last.eq(hdr_pos == MAC_HEADER_BYTES - 1)]
                with m.If(mac.i.ready):
                    m.d.comb += cursor.step.eq(1)
                    with m.If(hdr_pos == MAC_HEADER_BYTES - 1):
                        m.next = "MAC_TAG"
            with m.State("MAC_TAG"):
                m.d.comb += [self.busy.eq(1), mac.o.ready.eq(1)]
                with m.If(mac.o.valid):
                    m.d.sync += mac_open.eq(0)
                    with m.If(exporting):           # the tag goes into the header, written now
                        m.d.sync += tag.eq(mac.o.payload)
                        m.next = "SEGMENT_COMMAND"
                    with m.Else():
                        good = mac.o.payload == hd.mac_tag
                        with m.If(~good):
                            m.d.sync += status.eq(RecordStatus.BAD_MAC)
                        with m.If(importing & (good | kv_started)):
                            m.d.sync += [meta_w_count.eq(Mux(good, n, 0)),
                                         meta_w_head.eq(Mux(good, head, W - 1)), ml.eq(0)]
                            m.next = "META_WRITE"
                        with m.Else():
                            m.next = "RESPOND"
            with m.State("FAIL"):
                # storage error: an import that has started writing the rings empties them
                m.d.comb += self.busy.eq(1)
                m.d.sync += [meta_w_count.eq(0), meta_w_head.eq(W - 1), ml.eq(0)]
                with m.If(importing & kv_started):
                    m.next = "META_WRITE"
                with m.Else():
                    m.next = "RESPOND"
            with m.State("META_WRITE"):
                m.d.comb += [self.busy.eq(1), self.ring.meta_we.eq(1)]
                with m.If(ml == LH - 1):
                    m.next = "RESPOND"
                with m.Else():
                    m.d.sync += ml.eq(ml + 1)
            with m.State("RESPOND"):
                # a failed sealed transfer gives its message up: the core is free again
                m.d.comb += mac.abort.eq(mac_open)
                m.d.sync += mac_open.eq(0)
                m.d.comb += [self.busy.eq(1), self.resp.valid.eq(1),
                             self.resp.payload.status.eq(status),
                             self.resp.payload.key_id.eq(key_id),
                             self.resp.payload.count.eq(Mux(exporting, n, hd.count)),
                             self.resp.payload.hash.eq(Mux(exporting, req_hash, hd.prefix_hash)),
                             self.resp.payload.seq.eq(Mux(exporting, req_seq, hd.commit_seq))]
                with m.If(self.resp.ready):
                    m.next = "IDLE"
        return m

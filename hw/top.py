"""The whole RingKV device: link frames in, command dispatcher, every block, frames out.

::

    rx ─► FrameDecoder ─► dispatcher ─┬─► TokenMemory ◄─┬─ HashEngine (read port 0, shared
                              │       │                 │  with TOKENS_READ)
                              │       ├─► CacheDirectory (+ allocator; its probe stream fed
                              │       │   by the HashEngine through a key FIFO: QUERY_PREFIX)
                              │       ├─► DmaEngine ─── storage port (muxed with SECTOR_READ)
                              │       │      │    └─ (tier: TieredStorage ─┬─ storage: card
                              │       │      │                            └─ sdram)
                              │       │      └─ ring port ─► AttentionCore ring/meta
                              │       │                      (muxed with RING_READ)
                              │       └─► AttentionCore (cmd / i / o / status)
    tx ◄─ FrameEncoder ◄──────┘

The payload layout of every opcode is defined once in :mod:`ringkv.defs.protocol` (the
dispatcher takes its length rules, argument offsets and response packing from there) and
documented in ``docs/blocks/top.md``. The dispatcher (:mod:`ringkv.hw.commands.dispatch`) is one FSM
built from a command unit per family (:data:`UNITS`, ``hw/cmd_*.py``): adding an opcode touches
its definition and its family's unit.
"""

from types import SimpleNamespace

from amaranth import Module, ResetInserter, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ringkv.defs.checks import check_int, check_pow2, check_type
from ringkv.defs.config import RingKVConfig
from ringkv.defs.hash import hash_seed
from ringkv.defs.hot_tier import TIER_KEYS, tier_parameters
from ringkv.defs.mac import KEY_SLOTS, SEED_BYTES
from ringkv.defs.protocol import (
    DEFAULT_MAX_PAYLOAD,
    REQUESTS,
    Op,
    StorageKind,
    attn_in_bytes,
    attn_out_bytes,
    build_requests,
)
from ringkv.defs.record import RecordLayout

from .attention.core import AttentionCore
from .commands.attention import AttentionUnit
from .commands.directory import DirectoryUnit
from .commands.dispatch import Dispatcher
from .commands.keys import KeyUnit, MacArbiter
from .commands.link import LinkUnit
from .commands.prefix import PrefixUnit
from .commands.recovery import RecoveryUnit
from .commands.sdram import SdramTestUnit
from .commands.snapshot import SnapshotUnit
from .commands.storage import StorageUnit
from .commands.tokens import TokenUnit
from .link.framing import FrameDecoder, FrameEncoder, PayloadByte
from .link.skid import StreamRegister
from .sdram.bist import BistSignature
from .seal.key_slots import KeySlots
from .seal.mac import MacCore
from .storage.dma import DmaEngine
from .storage.kv_words import kv_words_supported
from .storage.port import STORAGE_WIDTHS, StorageInfoSignature, StoragePortSignature
from .storage.tiered import TieredStorage
from .store.directory import CacheDirectory
from .store.hash_engine import HashEngine
from .store.token_memory import TokenMemory

__all__ = ["RingKVTop", "UNITS"]

#: The dispatcher's command units, one per command family; together they execute every
#: opcode of the build's requests (:func:`ringkv.defs.protocol.build_requests`; checked at
#: construction). ``KeyUnit`` is a sealed build's only (``SEALED``), ``SdramTestUnit`` a
#: build's with the SDRAM self-test only (``SDRAM``).
UNITS = (LinkUnit, TokenUnit, DirectoryUnit, SnapshotUnit, PrefixUnit, AttentionUnit,
         StorageUnit, RecoveryUnit, KeyUnit, SdramTestUnit)


class RingKVTop(wiring.Component):
    """The RingKV device: a framed byte link in, every block of docs/ARCHITECTURE.md inside.

    Parameters
    ----------
    config : RingKVConfig
        Model shape and numerics; ``window`` and ``head_dim`` powers of two. ``numerics``
        (``ringkv-fx1``: int8 q/k/v, ``ringkv-fx2``: int16) sets the attention core's element
        width and ``EB``, the bytes per element in ATTN payloads (M*EB bytes per input beat),
        on the byte-addressed ring port (``RING_READ`` counts bytes) and in records.
    regions : int
        Snapshot regions in storage (power of two, 2..32768); region ``r`` starts at sector
        ``base_lba + r * sectors_per_region`` (:class:`~ringkv.defs.record.RecordLayout`).
    links, buckets : int
        Directory link pool and bucket table (powers of two; default ``regions`` and
        ``max(regions // 2, 2)``).
    lanes, macs : int
        Attention core split-KV lanes and MACs per lane.
    max_payload : int
        Largest request payload (the frame decoder's buffer); must hold one attention token.
    timeout : int
        Frame decoder idle timeout in clocks.
    base_lba : int
        First sector of region 0.
    storage_kind : StorageKind
        What serves the storage port (:class:`~ringkv.defs.protocol.StorageKind`; ``NONE``:
        no SD controller, a simulation's sector model), and ``sd_clock_hz`` its SD clock in
        data transfers: the build's parameters, reported by ``STORAGE_INFO``.
    sealed : bool
        A sealed build (default: open). It holds :class:`~ringkv.hw.seal.key_slots.KeySlots` and
        a :class:`~ringkv.hw.seal.mac.MacCore` (shared by the DMA and the tenant-seed derivation
        through :class:`~ringkv.hw.commands.keys.MacArbiter`), executes ``KEY_SET`` and
        ``KEY_CLEAR``, and takes a tenant key slot in ``QUERY``, ``QUERY_PREFIX`` and
        ``EXPORT`` (:data:`~ringkv.defs.protocol.SEALED_REQUESTS`): the hash engine starts
        from that slot's seed, the DMA seals (export) or verifies (import) under its key, and
        a slot without a key is refused ``NO_KEY`` before anything is done. A build
        parameter, not a run-time setting: nothing on the link can turn a sealed device open
        (an open device accepts unauthenticated records), and an open build has no MAC at all
        (its gateware is the device's before sealing existed, with the key opcodes answered
        ``UNKNOWN_OP``).
    tier : dict or None
        The SDRAM hot tier (issue #35; ``docs/blocks/tiered_storage.md``): ``None`` (the
        default) for none; a dict of :func:`ringkv.defs.hot_tier.tier_parameters`' keywords
        (``{}``: the ULX3S's 32 MB part, compact slots of ``BOARD_SLOT_TOKEN_SECTORS`` token
        sectors, as many slots as fit, at most ``regions``) puts a
        :class:`~ringkv.hw.storage.tiered.TieredStorage` between the DMA and the card: the top
        then has an ``sdram`` port (to the SDRAM sector store; slot ``s`` from its sector
        ``s * slot_sectors``), the directory's deletes drop their regions' copies, and
        ``STORAGE_INFO`` reports the tier. :attr:`tier` is the resolved dict.
    storage_width : int
        With a tier, the bytes a transfer between the DMA, the tiered storage and the SDRAM
        sector store (``sdram``): 1 (default), or 4: the four-byte import (an open import's
        K/V area a word a clock from an SDRAM slot, ``docs/blocks/dma.md``), for an SDRAM
        store of 32-bit words (a half-rate controller); the card side stays a port of bytes.
    sdram_test : bool
        The build executes ``SDRAM_TEST`` (:data:`~ringkv.defs.protocol.SDRAM_OPS`) through its
        ``sdram_test`` port (default: no; the ULX3S top with its SDRAM sets it and connects
        the port to its :class:`~ringkv.hw.sdram.bist.SdramBist`).

    Ports
    -----
    ``rx`` (In stream of bytes from the link), ``tx`` (Out stream of bytes to the link),
    ``storage`` (:class:`~ringkv.hw.storage.StoragePortSignature`, initiator side),
    ``storage_info`` (:class:`~ringkv.hw.storage.StorageInfoSignature`, flipped: the SD
    controller's ready, card type, high speed and capacity, for ``STORAGE_INFO``; all 0 when
    nothing drives them); with a tier, ``sdram`` (:class:`~ringkv.hw.storage.StoragePortSignature`,
    initiator side: the SDRAM sector store), and ``storage`` is the card behind it; with
    ``sdram_test``, ``sdram_test`` (:class:`~ringkv.hw.sdram.bist.BistSignature`, requester
    side).

    Behaviour
    ---------
    One frame at a time, exactly one response per frame, in order. A frame-layer error (bad
    CRC, timeout, length above ``max_payload``, unknown opcode) is answered with the frame
    decoder's error status. For a checked frame the dispatcher first checks the payload length
    against the op's layout (``BAD_LENGTH``) and its arguments against the configuration
    (``BAD_ARG``); a rejected request's payload is drained and **nothing is changed**. Opcodes
    of :class:`~ringkv.defs.protocol.Op` not in :data:`~ringkv.defs.protocol.IMPLEMENTED` are
    answered ``UNKNOWN_OP``.

    At reset (and on ``STORAGE_REBUILD``) the device recovers its directory from the record
    headers by itself (:mod:`ringkv.hw.commands.recovery`): meanwhile ``QUERY`` and ``EXPORT`` (and
    the ``DIR_*``, ``SECTOR_READ`` requests) answer ``NOT_READY`` with the progress, every other
    request answers as usual; ``recovering`` (not a port) is high while it scans.

    No hang: every wait has a bound or is guaranteed by a block's contract. Draining and
    argument collection are bounded by the frame's length (the decoder has checked it); the
    hash engine is fixed latency (``n + 3`` clocks with its input slice); the directory
    answers every command (its worst case is an expiry of every link, ``4 * links + 2``
    clocks); the DMA answers every command
    once the storage port answers (the storage contract: a dead card ends in ``TIMEOUT``); the
    attention core answers every command the dispatcher has checked (layer, count, lengths).
    The only unbounded waits are on the link itself: ``tx.ready`` (the host must read) and
    ``rx`` (a partial frame times out).

    Latency and throughput: a request is decoded at one byte per clock and its header reaches
    the dispatcher 2 clocks after the last CRC byte; simple ops answer within ~5 clocks of the
    payload; the response goes out at one byte per clock (plus 8 framing bytes). Streams with
    backpressure: ``rx`` (the decoder holds ``ready`` low while it releases a frame) and ``tx``.
    """

    def __init__(self, config: RingKVConfig, *, regions: int = 64, links: int | None = None,
                 buckets: int | None = None, lanes: int = 4, macs: int = 8,
                 max_payload: int = DEFAULT_MAX_PAYLOAD, timeout: int = 1 << 16,
                 base_lba: int = 0, storage_kind: StorageKind = StorageKind.NONE,
                 sd_clock_hz: int = 0, sealed: bool = False, tier: dict | None = None,
                 sdram_test: bool = False, storage_width: int = 1):
        check_type("config", config, RingKVConfig)
        check_pow2("regions", regions, low=2, high=1 << 15)
        links = regions if links is None else links
        buckets = max(regions // 2, 2) if buckets is None else buckets
        check_pow2("links", links, low=2, high=1 << 15)
        check_pow2("buckets", buckets, low=2, high=1 << 15)
        if config.layers > 255 or config.layers * config.kv_heads > 256:
            raise ValueError(f"at most 255 layers and 256 rings, not {config.layers} layers "
                             f"of {config.kv_heads} KV heads")
        if config.max_tokens >= 1 << 24:
            raise ValueError(f"max_tokens must be below 2**24 (the directory's count field), "
                             f"not {config.max_tokens!r}")
        check_int("max_payload", max_payload, low=1, high=0xFFFF)
        need = max(max(lay.size for lay in REQUESTS.values()),
                   REQUESTS[Op.ATTN_PREFILL].size + attn_in_bytes(config, 1),
                   attn_out_bytes(config, 1))
        if max_payload < need:
            raise ValueError(f"max_payload must be at least {need} bytes (one attention token "
                             f"of this config), not {max_payload!r}")
        check_type("storage_kind", storage_kind, StorageKind)
        check_int("sd_clock_hz", sd_clock_hz, low=0, high=(1 << 32) - 1)
        check_type("sealed", sealed, bool)
        self._sealed = sealed
        check_type("sdram_test", sdram_test, bool)
        self._sdram_test = sdram_test
        self._units = tuple(u for u in UNITS if (sealed or not u.SEALED)
                            and (sdram_test or not u.SDRAM))
        requests = build_requests(sealed, sdram_test)
        handled = [o for unit in self._units for o in unit.OPS]
        if sorted(handled, key=lambda o: o.value) != sorted(requests, key=lambda o: o.value):
            raise AssertionError(f"command units {sorted(o.name for o in handled)} do not "
                                 f"cover the requests {sorted(o.name for o in requests)} "
                                 f"exactly once")
        self._config = config
        self._regions, self._links, self._buckets = regions, links, buckets
        self._max_payload, self._base_lba = max_payload, base_lba
        self._storage_kind, self._sd_clock_hz = storage_kind, sd_clock_hz
        self._layout = RecordLayout(config)
        tier_bug = None
        if tier is not None:
            check_type("tier", tier, dict)
            unknown = sorted(set(tier) - set(TIER_KEYS) - {"_bug"})
            if unknown:
                raise ValueError(f"unknown tier keys {unknown}; known: {list(TIER_KEYS)}")
            tier_bug = tier.get("_bug")          # a test's broken variant of the block
            tier = tier_parameters(self._layout, regions,
                                   **{k: v for k, v in tier.items() if k != "_bug"})
        self._tier = tier
        if storage_width not in STORAGE_WIDTHS:
            raise ValueError(f"storage_width must be one of {STORAGE_WIDTHS} bytes, not "
                             f"{storage_width!r}")
        if storage_width != 1:
            if tier is None:
                raise ValueError("storage_width 4 needs the SDRAM tier (tier=...): the card's "
                                 "controllers move bytes")
            if not kv_words_supported(config) or (macs * RecordLayout(config).elem_bytes) % 4:
                raise ValueError(f"storage_width 4 needs a K row and a bank word of whole "
                                 f"four-byte groups: head_dim * EB = "
                                 f"{config.head_dim * self._layout.elem_bytes}, macs * EB = "
                                 f"{macs * self._layout.elem_bytes}")
        self._storage_width = storage_width
        if tier is not None:
            self.tier_storage = TieredStorage(
                regions=regions, sectors_per_region=self._layout.sectors_per_region,
                base_lba=base_lba, kv_sector=self._layout.kv_sector, slots=tier["slots"],
                slot_token_sectors=tier["slot_token_sectors"],
                stamp_width=tier["stamp_width"], width=storage_width, _bug=tier_bug)
        # children built here so that their parameter checks run at construction
        self.decoder = FrameDecoder(max_payload=max_payload, timeout=timeout)
        self.encoder = FrameEncoder()
        self.tokens = TokenMemory(config.max_tokens, config.token_width, read_ports=2)
        self.hasher = HashEngine(token_width=config.token_width, hash_width=64,
                                 count_width=24, seed=hash_seed(config), seed_input=sealed)
        self.directory = CacheDirectory(buckets=buckets, links=links, regions=regions,
                                        count_width=24, hash_width=64, stamp_width=32)
        self.dma = DmaEngine(config, regions, base_lba, width=storage_width)
        self.attention = AttentionCore(layers=config.layers, q_heads=config.q_heads,
                                       kv_heads=config.kv_heads, head_dim=config.head_dim,
                                       window=config.window, lanes=lanes, macs=macs,
                                       numerics=config.numerics,
                                       qkv_fracs=config.qkv_fracs)
        if sealed:
            self.key_slots = KeySlots()
            self.mac = MacCore()
            self.mac_arbiter = MacArbiter()
            #: Each key slot's prefix-hash seed, written by KEY_SET (not a port: the
            #: dispatcher's registers, a simulation observation point).
            self.tenant_seeds = [Signal(8 * SEED_BYTES, name=f"tenant_seed{k}")
                                 for k in range(KEY_SLOTS)]
        ports = {
            "rx": In(stream.Signature(8)),
            "tx": Out(stream.Signature(8)),
            "storage": Out(StoragePortSignature()),
            "storage_info": In(StorageInfoSignature()),
        }
        if tier is not None:
            ports["sdram"] = Out(StoragePortSignature(storage_width))
        if sdram_test:
            ports["sdram_test"] = Out(BistSignature())
        super().__init__(ports)
        #: The storage port the DMA and SECTOR_READ drive (not a port): ``storage`` itself, or
        #: with a tier the tiered storage's target side.
        self.initiator = (self.storage if tier is None
                          else StoragePortSignature(storage_width).create(path=("initiator",)))
        #: High while the recovery scan runs (not a port: a simulation observation point;
        #: the link's STORAGE_STATUS reports the same).
        self.recovering = Signal()

    config = property(lambda self: self._config)
    regions = property(lambda self: self._regions)
    links = property(lambda self: self._links)
    buckets = property(lambda self: self._buckets)
    max_payload = property(lambda self: self._max_payload)
    base_lba = property(lambda self: self._base_lba)
    record_layout = property(lambda self: self._layout)
    storage_kind = property(lambda self: self._storage_kind)
    sd_clock_hz = property(lambda self: self._sd_clock_hz)
    sealed = property(lambda self: self._sealed)
    #: the SDRAM hot tier's parameters (:func:`ringkv.defs.hot_tier.tier_parameters`), or None
    tier = property(lambda self: self._tier)
    #: the build executes SDRAM_TEST (its ``sdram_test`` port exists)
    has_sdram_test = property(lambda self: self._sdram_test)
    #: bytes a transfer between the DMA and the tiered storage, and on ``sdram``
    storage_width = property(lambda self: self._storage_width)

    # ------------------------------------------------------------------------------------
    def elaborate(self, platform):
        m = Module()
        m.submodules.decoder = dec = self.decoder
        m.submodules.encoder = enc = self.encoder
        m.submodules.tokens = tm = self.tokens
        m.submodules.hasher = hasher = self.hasher
        m.submodules.directory = dr = self.directory
        m.submodules.dma = dma = self.dma
        m.submodules.attention = at = self.attention
        wiring.connect(m, wiring.flipped(self.rx), dec.i)
        wiring.connect(m, enc.o, wiring.flipped(self.tx))
        # Register slices on the payload bytes between the link and the dispatcher (1 clock
        # each way): the dispatcher's byte muxes and its ``ready`` decode end in flip-flops
        # instead of running on into the encoder's CRC, the UART and the decoder's buffer.
        m.submodules.rx_bytes = rx_bytes = StreamRegister(PayloadByte)
        m.submodules.tx_bytes = tx_bytes = StreamRegister(8)
        wiring.connect(m, dec.data, rx_bytes.i)
        wiring.connect(m, tx_bytes.o, enc.data)
        dec_port = SimpleNamespace(header=dec.header, error=dec.error, data=rx_bytes.o)
        enc_port = SimpleNamespace(header=enc.header, data=tx_bytes.i)
        wiring.connect(m, dma.tokens, tm.read_port(1))
        if self._tier is not None:
            tier = self.tier_storage
            if self._sdram_test:
                # SDRAM_TEST overwrites the SDRAM: from its command to its result the tier is
                # held in reset (its copies dropped, as at a power cut: reads go to the card);
                # the dispatcher runs nothing else meanwhile, so the DMA is idle
                testing = Signal()
                cmd, result = self.sdram_test.cmd, self.sdram_test.result
                with m.If(cmd.valid & cmd.ready):
                    m.d.sync += testing.eq(1)
                with m.Elif(result.valid & result.ready):
                    m.d.sync += testing.eq(0)
                m.submodules.tier = ResetInserter(testing)(tier)
            else:
                m.submodules.tier = tier
            wiring.connect(m, self.initiator, tier.storage)
            wiring.connect(m, tier.card, wiring.flipped(self.storage))
            wiring.connect(m, tier.sdram, wiring.flipped(self.sdram))
        if self._sealed:
            # keys: written by the key unit, read only by the MAC; the MAC shared by the DMA
            # and the seed derivation; the DMA sees the slots' ids and set bits
            m.submodules.key_slots = slots = self.key_slots
            m.submodules.mac_arbiter = arbiter = self.mac_arbiter
            # the owner's abort resets the core's registers (as in MacUnit): a transfer that
            # fails half way leaves the core idle the next clock, with no message open
            m.submodules.mac = ResetInserter(arbiter.core.abort)(self.mac)
            mac = self.mac
            wiring.connect(m, mac.key, slots.read)
            wiring.connect(m, dma.mac, arbiter.dma)
            for name in ("cmd", "i"):
                wiring.connect(m, getattr(arbiter.core, name), getattr(mac, name))
            wiring.connect(m, mac.o, arbiter.core.o)
            m.d.comb += [dma.key_ids.eq(slots.key_ids), dma.key_set.eq(slots.set)]
        dispatcher = Dispatcher(m, self, [unit() for unit in self._units], decoder=dec_port,
                                encoder=enc_port,
                                tokens=tm, hasher=hasher, directory=dr, dma=dma, attention=at)
        dispatcher.elaborate()
        m.d.comb += self.recovering.eq(dispatcher.scan_busy)
        return m

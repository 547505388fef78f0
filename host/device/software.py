"""The whole device in software: what :class:`~ringkv.host.scheduler.Scheduler` drives when
there is no FPGA, with the FPGA's store.

:class:`SoftwareDevice` implements the :class:`~ringkv.host.device.interface.Device` seam with
golden models: the prefix hash of :mod:`ringkv.host.golden.hash`, the cache directory and allocator
of :mod:`ringkv.host.golden.directory` (the gateware's, bit-exact: LRU eviction by stamp, regions
from FIFO A and then FIFO B), token verification before a hit, the longest-prefix query and the
model's attention backend as the rings.

**The store is a card image** in the gateware's record format (``docs/blocks/record-format.md``:
:func:`~ringkv.host.record.encode_record` writes, :func:`~ringkv.host.record.import_record`
verifies and imports): region ``r`` at sector ``r * sectors_per_region``, base LBA 0, as the
simulated board's image. So an image written by the simulated board (or copied from a card) is
served here, and an image written here is served by the board. The image is a file
(``image=``) or, without one, kept in memory (only the regions written take memory). Either
way every export writes its payload first and its header (with the commit sequence number)
last; with a file, both are flushed to the medium in that order (``durable``), so a crash or a
power cut between them leaves the previous snapshot of the session the newest valid one.

Opening an image runs the device's power-on recovery (the golden
:func:`~ringkv.host.record.plan_recovery` of :func:`~ringkv.host.record.scan_headers`: the
header sector of every region; newest commit per key wins; torn, foreign and corrupt headers
are freed) and replays its directory commands, so the directory, its links, the FIFOs and the
next commit sequence are those the board would have after its reset. Like the board, the
payload is checked at import (``QUERY``): tokens, config digest and fields, payload CRC;
anything else is a miss that deletes the entry, never a wrong answer.

The card format stores the rings as the fixed-point core's integer words, so the card store
needs a backend whose snapshot is the core's integer rings
(:class:`~ringkv.host.model.FixedBackend`, ``ringkv --backend fixed``). A float backend
(:class:`~ringkv.host.model.Float64Backend`, the reference model) cannot be stored in that
format: its records are then kept in memory only (same directory, same policy, same checks of
tokens and configuration), and asking for an image with it is a
:class:`~ringkv.host.errors.ConfigError`. An image file from an older version (a Python pickle)
is refused with :class:`~ringkv.host.errors.NotACardImage`; it is never unpickled.
"""

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ringkv.defs.config import DEFAULT_CONFIG, RingKVConfig
from ringkv.defs.directory import Op as DirOp
from ringkv.defs.directory import Status as DirStatus
from ringkv.defs.hash import hash_seed
from ringkv.defs.hot_tier import TIER_KEYS, import_clocks_model, tier_parameters
from ringkv.defs.record import (
    MAGIC,
    SECTOR,
    RecordKind,
    RecordLayout,
    RecordStatus,
    seq_next,
)

from ..errors import ConfigError, NotACardImage, StorageError
from ..golden.directory import GoldenDirectory
from ..golden.hash import prefix_hashes, sequence_hash
from ..golden.mac import tenant_seed
from ..golden.tiered import OK, READ, WRITE, GoldenTieredStorage
from ..keys import tenant_key_id
from ..model.transformer import FixedBackend, Float64Backend, RingPool
from ..record import (
    RecordError,
    check_key_ring,
    decode_header,
    encode_record,
    import_record,
    kind_name,
    plan_recovery,
    read_record_bytes,
    record_writes,
    rings_from_image,
    scan_headers,
)
from .interface import Context, Device, Holding, QueryResult, snapshot_bytes

__all__ = ["SoftwareDevice", "MAX_REGIONS", "IMAGE_REGIONS", "MEMORY_REGIONS"]

log = logging.getLogger(__name__)

#: The most regions a store may have (the gateware's bound: ``RingKVTop(regions=)``).
MAX_REGIONS = 1 << 15
#: Regions of a new image file when neither ``regions`` nor ``capacity`` is given: the
#: gateware's default (``RingKVTop(regions=64)``), so that the simulated board started on the
#: image with its default size sees every region (10.0 MiB for the default configuration; the
#: file is sparse: regions never written take no disk space where the file system has holes).
IMAGE_REGIONS = 64
#: Regions of an in-memory store when neither ``regions`` nor ``capacity`` is given: the most
#: the gateware addresses (only regions written take memory).
MEMORY_REGIONS = MAX_REGIONS

#: Why a query missed, by the record's status (the reasons ``FpgaDevice`` gives too).
_MISS_REASONS = {
    RecordStatus.EMPTY: "corrupt record",
    RecordStatus.BAD_VERSION: "foreign format",
    RecordStatus.BAD_HEADER: "corrupt record",
    RecordStatus.FOREIGN_CONFIG: "foreign config",
    RecordStatus.NOT_THIS: "stale directory entry",
    RecordStatus.TOKEN_MISMATCH: "tokens differ",
    RecordStatus.BAD_PAYLOAD_CRC: "corrupt record",
    RecordStatus.STORAGE: "storage error",
    RecordStatus.NO_KEY: "no key",
    RecordStatus.BAD_MAC: "bad tag",
}
#: Failures after which a record stays in the directory (as the gateware's QUERY keeps it,
#: ``hw/commands/snapshot.py``): a hash collision (another session's tokens may still hit it),
#: a storage fault, or a record refused with ``NO_KEY`` (the requester lacks its key, but the
#: tenant that holds the key may still use it, and one tenant's request must never free
#: another tenant's record; LRU ages it out like any record). Every other failure can never
#: verify and frees the record (``BAD_MAC`` too: the key id selects the key, so a bad tag is a
#: forgery or a corruption).
_KEEP = (RecordStatus.TOKEN_MISMATCH, RecordStatus.STORAGE, RecordStatus.NO_KEY)

#: Flushes a file's data to the medium (``fdatasync`` where the system has it, else ``fsync``).
_datasync = getattr(os, "fdatasync", os.fsync)

#: The first bytes of a Python pickle (protocols 2..5): the store format of older versions.
_PICKLE_STARTS = tuple(bytes([0x80, p]) for p in range(2, 6))


def _pow2_at_least(n: int) -> int:
    return 1 << max(1, (max(n, 1) - 1).bit_length())


def _pow2_at_most(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


class _MemoryCard:
    """Sectors in memory, region by region (a region takes memory once written)."""

    def __init__(self, layout: RecordLayout, regions: int):
        self.spr, self.regions = layout.sectors_per_region, regions
        self.data: dict[int, bytearray] = {}
        self.path = None

    def read(self, lba: int, n: int) -> bytes:
        out = bytearray()
        while n > 0:
            region, off = divmod(lba, self.spr)
            k = min(n, self.spr - off)
            buf = self.data.get(region)
            out += (buf[off * SECTOR:(off + k) * SECTOR] if buf is not None
                    else bytes(k * SECTOR))
            lba, n = lba + k, n - k
        return bytes(out)

    def write(self, lba: int, data: bytes) -> None:
        data = bytes(data)
        while data:
            region, off = divmod(lba, self.spr)
            if region >= self.regions:
                raise StorageError(f"write past the store's {self.regions} regions")
            k = min(len(data) // SECTOR, self.spr - off)
            buf = self.data.setdefault(region, bytearray(self.spr * SECTOR))
            buf[off * SECTOR:(off + k) * SECTOR] = data[:k * SECTOR]
            lba, data = lba + k, data[k * SECTOR:]

    def sync(self) -> None:
        pass

    def close(self) -> None:
        pass


class _TieredCard:
    """A card behind the SDRAM hot tier: every read and write is routed by the golden tiered
    storage (:class:`~ringkv.host.golden.tiered.GoldenTieredStorage`, the gateware's rules,
    bit-exact), so the device knows which copies SDRAM holds and which sectors of each read it
    would serve; the bytes always come from the card (the tier's invariant, proven by its
    tests: a byte served from SDRAM is the card's). ``sectors`` counts the sectors read from
    each tier, ``clocks`` the modelled storage clocks of the reads
    (:data:`~ringkv.defs.hot_tier.READ_CLOCKS`)."""

    def __init__(self, card, golden):
        self.card, self.golden = card, golden
        self.sectors = {"sdram": 0, "card": 0}
        self.clocks = 0

    def __getattr__(self, name):
        return getattr(self.card, name)

    def read(self, lba: int, n: int) -> bytes:
        route = self.golden.command(READ, lba, n)
        self.sectors[route.tier] += n
        self.clocks += import_clocks_model([(route.tier, route.setup, n)])
        return self.card.read(lba, n)

    def write(self, lba: int, data: bytes) -> None:
        route = self.golden.command(WRITE, lba, len(data) // SECTOR)
        try:
            self.card.write(lba, data)
        except BaseException:
            if route.tier == "both":
                self.golden.finish(1, OK)          # a failed card write aborts the copy
            raise
        if route.tier == "both":
            self.golden.finish(OK, OK)


class _FileCard:
    """Sectors of an image file (``os.pread``/``os.pwrite``: no Python buffering, so what a
    write returned is in the operating system's hands; ``sync`` flushes it to the medium)."""

    def __init__(self, path: Path, layout: RecordLayout, regions: int, *, durable: bool):
        self.path, self.durable, self.fd = path, durable, None
        self.size = regions * layout.sectors_per_region * SECTOR
        try:
            self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise StorageError(f"cannot open the card image {path}: {e.strerror}",
                               hint="check the path and its permissions") from None

    def extend(self) -> None:
        """A new or shorter image grows to its regions (zeros: holes where the file system has
        them); called once the image was accepted, so a refused file stays as it was."""
        if os.fstat(self.fd).st_size < self.size:
            os.ftruncate(self.fd, self.size)

    def read(self, lba: int, n: int) -> bytes:
        data = os.pread(self.fd, n * SECTOR, lba * SECTOR)
        return data + bytes(n * SECTOR - len(data))

    def write(self, lba: int, data: bytes) -> None:
        data = memoryview(bytes(data))
        offset = lba * SECTOR
        while data:
            done = os.pwrite(self.fd, data, offset)
            data, offset = data[done:], offset + done

    def sync(self) -> None:
        if self.durable:
            _datasync(self.fd)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


@dataclass
class _MemoryRecord:
    """A record of a float backend's store: the backend's own snapshot, in memory."""
    tokens: tuple
    rings: object
    digest: bytes
    kind: int
    commit_seq: int
    key_id: int = 0


def _integer_rings(attention, config) -> bool:
    """Whether ``attention``'s snapshot is the fixed-point core's state ``(rings, count,
    head)`` (integer rings of the card's shape), which the card format stores exactly."""
    snap = attention.snapshot()
    if not (isinstance(snap, tuple) and len(snap) == 3):
        return False
    rings = np.asarray(snap[0])
    c = config
    return (rings.dtype.kind in "iu"
            and rings.shape == (c.layers, c.kv_heads, 2, c.window, c.head_dim))


def _rings_bytes(config, attention) -> int:
    """Bytes of one context's rings as ``attention`` keeps them."""
    pool = getattr(attention, "pool", None)
    if pool is not None or isinstance(attention, FixedBackend):
        return RingPool.slot_bytes(config)
    c = config
    return 8 * c.layers * c.kv_heads * 2 * c.window * c.head_dim        # float64 rings


def _hot_tier(config, attention, hot_bytes) -> list:
    """The device's contexts: ``attention`` alone without a hot tier; else as many as
    ``hot_bytes`` holds, in a :class:`RingPool` for the fixed-point core (its lanes), or
    backends of ``attention``'s type."""
    if hot_bytes is None:
        return [Context(attention, [], 0)]
    if isinstance(attention, FixedBackend):
        pool = RingPool(config, RingPool.slots_for_bytes(config, hot_bytes), attention.lanes)
        return [Context(pool.backend(i), [], i) for i in range(pool.slots)]
    slots = max(1, hot_bytes // _rings_bytes(config, attention))
    return [Context(attention if i == 0 else type(attention)(config), [], i)
            for i in range(slots)]


def _check_image_file(path: Path, span: int) -> int | None:
    """Refuse a file that is not a card image; return its size in regions (rounded up), or
    ``None`` for a new (missing or empty) file."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return None
    except OSError as e:
        raise StorageError(f"cannot read the card image {path}: {e.strerror}") from None
    if size == 0:
        return None
    if not path.is_file():
        raise NotACardImage(f"{path} is not a regular file")
    with open(path, "rb") as f:
        start = f.read(2)
    if start in _PICKLE_STARTS:
        raise NotACardImage(
            f"{path} is a store saved by an older RingKV version (a Python pickle); it is not "
            "read, since loading a pickle can run code",
            hint="start with a new image (its records cannot be converted: the old format "
                 "did not keep them in the card format)")
    if size % SECTOR:
        raise NotACardImage(f"{path} is not a card image: {size} bytes is not a whole number "
                            f"of {SECTOR}-byte sectors")
    return -(-size // span)


class SoftwareDevice(Device):
    """The device in software; see the module docstring.

    ``SoftwareDevice(config, *, attention=None, capacity=None, image=None, regions=None,
    durable=True)``:

    * ``attention``: the rings (default :class:`~ringkv.host.model.Float64Backend`, whose
      records stay in memory; :class:`~ringkv.host.model.FixedBackend` gives the card store);
    * ``capacity``: the most records the directory holds (its links; default: one per
      region); an export beyond it evicts the least recently used record;
    * ``image`` (or ``path``, the same): the card image file (created when missing or empty;
      refused when it is not a card image); ``None``: the card in memory;
    * ``regions``: the store's size in regions, a power of two from 2 to 32,768 like the
      gateware's ``RingKVTop(regions=)``. Default: an existing image's size (rounded down to a
      power of two), else enough for ``capacity``, else :data:`IMAGE_REGIONS` for a new file
      and :data:`MEMORY_REGIONS` in memory. A file shorter than ``regions`` is extended with
      zeros (empty regions). One region is ``RecordLayout(config).sectors_per_region`` sectors;
    * ``durable``: flush an image file to the medium after each export's payload and again
      after its header (``os.fdatasync``), so that the write order holds across a power cut.

    * ``sealed``: sealed mode (default: open). Records are sealed under the requesting tenant's
      key (keyed BLAKE2s, ``docs/blocks/record-format.md``), and a query imports only a record
      whose tag verifies under that tenant's key: an open record, another tenant's record or a
      forged one is a miss (``no key``, ``bad tag``). ``query``, ``query_prefix``, ``import_``
      and ``export`` take ``tenant=``; a tenant without a key is refused
      (:class:`~ringkv.host.errors.KeyRequired`);
    * ``keys``: the key ring ``{key_id: 32-byte key}`` (or a
      :class:`~ringkv.host.keys.KeyRing`), ``tenants``: ``{tenant: key_id}``. A tenant's
      prefix-hash seed is ``tenant_seed(key, config.digest())``, so one tenant's tokens never
      give another tenant's directory keys; sharing records between tenants takes the same key.
      Open mode ignores tenants and uses the open seed (``hash_seed``).

    * ``hot_bytes``: the hot tier, in bytes: the device then holds as many conversations'
      rings at once as fit (:attr:`resident_limit`; the fixed-point core's in one
      :class:`~ringkv.host.model.transformer.RingPool`, int8 words: 128 KiB a conversation at
      the default shape), each a :class:`~ringkv.host.device.interface.Context` with its own
      token memory; :meth:`bind` chooses the one the store and token calls act on. ``None``
      (the default): one context, ``attention`` itself. The card (or the memory store) stays
      the cold tier and the persistence point: a resident conversation is only a copy of
      rings whose last turn was exported.
    * ``tier``: the gateware's SDRAM hot tier between the DMA and the card (``RingKVTop(tier=)``,
      the same dict: :func:`ringkv.defs.hot_tier.tier_parameters`; needs the card format). The
      card's reads and writes are routed by the golden tiered storage, so the device knows
      which records SDRAM holds (:meth:`hot_tier`, the numbers ``STORAGE_INFO`` gives) and
      counts the sectors each tier serves and the modelled clocks of its imports
      (``counters``: ``sdram_sectors_in``, ``card_sectors_in``, ``imports_sdram``: imports
      wholly from SDRAM, ``import_clocks``). Deletes drop their region's copy as the
      gateware's directory deletes do; an eviction to make room does not (the gateware's
      evicting ``INSERT`` reports no region). The directory, and so the server's index of
      what the device holds, does not depend on the tier: a copy in SDRAM is never a record
      the card lacks.

    ``export`` refuses, like the FPGA's ``EXPORT`` (``BAD_ARG``), rings that do not hold exactly
    ``len(tokens)`` tokens or a token memory that does not begin with ``tokens``.
    :attr:`recovery` is the :class:`~ringkv.host.record.RecoveryPlan` of the image at opening
    (``None`` for a new store).
    """

    def __init__(self, config: RingKVConfig = DEFAULT_CONFIG, *, attention=None,
                 capacity: int | None = None, image=None, regions: int | None = None,
                 durable: bool = True, path=None, sealed: bool = False, keys=None,
                 tenants=None, hot_bytes: int | None = None, tier: dict | None = None):
        if path is not None:
            if image is not None and Path(image) != Path(path):
                raise ValueError("image and path name the same file: give one of them")
            image = path
        if capacity is not None and (not isinstance(capacity, int) or capacity < 1):
            raise ValueError(f"capacity must be a positive number of records, not {capacity!r}")
        if regions is not None and (not isinstance(regions, int) or regions & (regions - 1)
                                    or not 2 <= regions <= MAX_REGIONS):
            raise ValueError(f"regions must be a power of two between 2 and {MAX_REGIONS}, "
                             f"not {regions!r}")
        if hot_bytes is not None and (not isinstance(hot_bytes, int) or hot_bytes < 1):
            raise ValueError(f"hot_bytes must be a positive number of bytes, not {hot_bytes!r}")
        self.config = config
        attention = attention if attention is not None else Float64Backend(config)
        self._contexts = _hot_tier(config, attention, hot_bytes)
        self._ctx = self._contexts[0]
        self.image = Path(image) if image is not None else None
        self.seed = hash_seed(config)
        self.sealed = bool(sealed)
        self._ring = check_key_ring(keys.keys() if hasattr(keys, "ids") else dict(keys or {}))
        self.tenants = dict(tenants or {})
        self._seeds = {kid: tenant_seed(key, config.digest()) for kid, key in self._ring.items()}
        self.layout = RecordLayout(config)
        self.counters = {"queries": 0, "hits": 0, "misses": 0, "prefix_queries": 0,
                         "prefix_hits": 0, "prefix_misses": 0, "probes": 0, "imports": 0,
                         "exports": 0, "checkpoints": 0, "evictions": 0, "bytes_in": 0,
                         "bytes_out": 0, "copied_in": 0, "recoveries": 0,
                         "sdram_sectors_in": 0, "card_sectors_in": 0, "imports_sdram": 0,
                         "import_clocks": 0}
        self._imported = None                          # the last query_prefix hit, imported
        self.recovery = None
        self.card_format = _integer_rings(self.attention, config)
        if self.image is not None and not self.card_format:
            raise ConfigError(
                "a card image holds the fixed-point core's integer K/V, and this device's "
                f"attention backend ({type(self.attention).__name__}) keeps other rings",
                hint="use the fixed-point backend (--backend fixed, "
                     "attention=FixedBackend(config)) with an image, or no image")
        span = self.layout.sectors_per_region * SECTOR
        found = _check_image_file(self.image, span) if self.image is not None else None
        if regions is None:
            if found is not None:
                regions = min(MAX_REGIONS, max(2, _pow2_at_most(found)))
            elif capacity is not None:
                regions = min(MAX_REGIONS, _pow2_at_least(capacity))
            else:
                regions = IMAGE_REGIONS if self.image is not None else MEMORY_REGIONS
        self.regions = regions
        self.capacity = min(capacity or regions, regions)
        links = min(_pow2_at_least(self.capacity), 1 << 15)
        self.directory = GoldenDirectory(buckets=max(regions // 2, 2), links=links,
                                         regions=regions)
        self._now = 0
        self._keys: dict[tuple[int, int], int] = {}   # (count, hash) -> link (the live rows)
        self.next_seq = 1
        self._memory: dict[int, _MemoryRecord] = {}   # region -> record (float backends)
        self._meta: dict[int, tuple[int, int]] = {}   # region -> (kind, commit_seq) (card)
        self.tier = None
        if tier is not None:
            if not isinstance(tier, dict) or set(tier) - set(TIER_KEYS):
                raise ValueError(f"tier must be a dict of {list(TIER_KEYS)}, not {tier!r}")
            if not self.card_format:
                raise ConfigError("the SDRAM hot tier holds records in the card format",
                                  hint="use the fixed-point backend (--backend fixed)")
            self.tier = tier_parameters(self.layout, regions, **tier)
        if not self.card_format:
            self.card = None
            return
        if self.image is None:
            self.card = self._tiered(_MemoryCard(self.layout, regions))
            return
        self.card = self._tiered(_FileCard(self.image, self.layout, regions, durable=durable))
        try:
            self._recover(blank_check=found is not None)
            self.card.extend()
        except BaseException:
            self.card.close()
            raise

    def _tiered(self, card):
        """``card`` behind the hot tier's golden model (a reset: no copies), if there is one."""
        if self.tier is None:
            return card
        t = self.tier
        return _TieredCard(card, GoldenTieredStorage(
            regions=self.regions, sectors_per_region=self.layout.sectors_per_region,
            base_lba=0, slots=t["slots"], stamp_width=t["stamp_width"],
            kv_sector=self.layout.kv_sector, slot_token_sectors=t["slot_token_sectors"]))

    def hot_tier(self) -> dict:
        """The SDRAM hot tier as ``STORAGE_INFO`` reports it (``hot_slots``, ``hot_residents``,
        ``hot_slot_sectors``, ``hot_slot_tokens``; all 0 without a tier) and the regions whose
        copy SDRAM holds (``resident_regions``)."""
        if self.tier is None:
            return dict(hot_slots=0, hot_residents=0, hot_slot_sectors=0, hot_slot_tokens=0,
                        resident_regions=[])
        t, g = self.tier["slot_token_sectors"], self.card.golden
        return dict(hot_slots=self.tier["slots"], hot_residents=g.residents(),
                    hot_slot_sectors=self.tier["slot_sectors"],
                    hot_slot_tokens=self.layout.token_sectors_max if t is None else t,
                    resident_regions=sorted(g.resident()))

    def lose_sdram(self) -> None:
        """A power cut of the board: the SDRAM hot tier's copies are lost (the card, here the
        store, keeps every record); nothing without a tier."""
        if self.tier is not None:
            self.card.golden.power_cut()

    def _drop(self, region: int) -> None:
        """The gateware's directory deleted the record of ``region``: its SDRAM copy goes."""
        if self.tier is not None:
            self.card.golden.drop(region)

    # -- the directory (golden model of the gateware's) ---------------------------------------
    def _dir(self, op: DirOp, **fields) -> dict:
        self._now = (self._now + 1) & 0xFFFFFFFF
        r = self.directory.command({"op": op, "now": self._now, **fields})
        return r

    def _drop_link(self, link: int) -> None:
        for key, value in list(self._keys.items()):
            if value == link:
                del self._keys[key]
                return

    def _delete(self, key, *, drop: bool = True) -> int | None:
        """Delete the directory entry of ``key`` (its region goes to FIFO B); its region.
        ``drop``: its SDRAM copy too (a ``DIR_DELETE``; not an eviction: the gateware's
        evicting ``INSERT`` reports no region to drop)."""
        link = self._keys.pop(tuple(key), None)
        if link is None:
            return None
        r = self._dir(DirOp.DELETE, link=link)
        self._memory.pop(r["region"], None)
        if drop:
            self._drop(r["region"])
        return r["region"]

    def _lookup(self, key) -> int | None:
        """``LOOKUP``: the key's region (the record becomes the most recently used), or None."""
        count, h = key
        if tuple(key) not in self._keys:
            return None
        r = self._dir(DirOp.LOOKUP, count=count, hash=h)
        return r["region"] if r["status"] == DirStatus.OK.value else None

    def _insert(self, key) -> tuple[int, int]:
        """``INSERT`` with LRU eviction: ``(link, region)`` for a new record of ``key``.

        The least recently used record is evicted here (``DELETE`` of the directory's LRU
        victim, then ``INSERT``) when the directory holds ``capacity`` records: the same links,
        regions and FIFO order as the gateware's evicting ``INSERT`` when ``capacity`` is its
        link count, and a bound below it otherwise."""
        while len(self.directory.live) >= self.capacity:
            row = self.directory.live[self.directory.lru_victim(self._now + 1)]
            self._delete((row["count"], row["hash"]), drop=False)
            self.counters["evictions"] += 1
        count, h = key
        r = self._dir(DirOp.INSERT, count=count, hash=h, evict=1)
        if r["status"] != DirStatus.OK.value:
            raise StorageError(f"the directory refused a record ({DirStatus(r['status']).name})")
        return r["link"], r["region"]

    def _recover(self, *, blank_check: bool) -> None:
        """The power-on recovery of the gateware (``hw/commands/recovery.py``) on the image."""
        infos = scan_headers(self.config, self.card.read, self.regions)
        valid = [i for i in infos if i.valid]
        foreign = [i for i in infos if i.status is RecordStatus.FOREIGN_CONFIG]
        if foreign and not valid:
            raise ConfigError(
                f"the card image {self.image} holds records of another configuration "
                f"(region {foreign[0].region}: {foreign[0].message}); none is this device's",
                hint="open it with the configuration it was written with, or use another image")
        if blank_check and not any(i.status is not RecordStatus.EMPTY for i in infos):
            lay = self.layout
            for region in range(self.regions):
                sector = self.card.read(lay.region_lba(region), 1)
                if sector.strip(b"\0") and sector.strip(b"\xff") and sector[:8] != MAGIC:
                    raise NotACardImage(
                        f"{self.image} is not a card image: region {region}'s header sector "
                        "is neither blank nor a record header",
                        hint="give a card image (for example one written by the board or by "
                             "this device), or a new file name")
        plan = plan_recovery(infos, links=self.capacity)
        self.directory.clear()
        found = None
        for cmd in plan.commands:
            if cmd[0] == "lookup":
                r = self._dir(DirOp.LOOKUP, count=cmd[1], hash=cmd[2])
                found = r["link"] if r["status"] == DirStatus.OK.value else None
            elif cmd[0] == "delete":
                self._dir(DirOp.DELETE, link=found)
                self._drop_link(found)
            else:
                _, count, h, region = cmd
                r = self._dir(DirOp.INSERT_EXISTING, count=count, hash=h, region=region)
                if r["status"] != DirStatus.OK.value:        # plan_recovery bounds the links
                    raise StorageError(f"recovery: the directory refused region {region} "
                                       f"({DirStatus(r['status']).name})")
                self._keys[(count, h)] = r["link"]
        kinds = {i.region: i.kind for i in valid}
        self._meta = {r: (kinds[r], seq) for _, _, r, seq in plan.inserts}
        self.next_seq = plan.next_seq
        self.recovery = plan
        self.counters["recoveries"] += 1
        if plan.freed:
            log.info("%s: recovery kept %d records, freed %d regions", self.image, plan.live,
                     plan.freed)

    def close(self) -> None:
        """Close the image file (a device on a closed image cannot be used)."""
        if getattr(self, "card", None) is not None:
            self.card.close()

    def __del__(self):
        self.close()

    @property
    def records(self) -> dict:
        """The in-memory store's records by key (a float backend's store: tokens, the
        backend's snapshot, config digest, kind, commit sequence); empty for a card store,
        whose records :meth:`holdings` and :meth:`read_record` give."""
        return {(row["count"], row["hash"]): self._memory[row["region"]]
                for row in self.directory.live.values() if row["region"] in self._memory}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- token memory ----------------------------------------------------------------------
    # -- tenants ---------------------------------------------------------------------------
    def _tenant(self, tenant) -> tuple[int, int]:
        """``(key_id, seed)`` of a request: ``(0, open seed)`` in open mode; in sealed mode the
        tenant's key id and seed, or :class:`KeyRequired`."""
        if not self.sealed:
            return 0, self.seed
        key_id = tenant_key_id(self.tenants, self._ring, tenant)
        return key_id, self._seeds[key_id]

    def set_key(self, key_id: int, key: bytes, tenants=()) -> None:
        """Hold ``key`` under ``key_id`` (replacing a key of that id) and give it to
        ``tenants``. Records sealed under a replaced key no longer verify (a miss)."""
        ring = check_key_ring({key_id: key})
        self._ring.update(ring)
        self._seeds[key_id] = tenant_seed(ring[key_id], self.config.digest())
        for t in tenants:
            self.tenants[t] = key_id

    def __repr__(self) -> str:
        mode = f"sealed, key ids {sorted(self._ring)}" if self.sealed else "open"
        return f"SoftwareDevice({self.config.digest().hex()[:12]}, {mode})"

    # -- the hot tier ----------------------------------------------------------------------------
    @property
    def attention(self):
        """The rings of the bound context (:meth:`bind`)."""
        return self._ctx.attention

    @attention.setter
    def attention(self, backend):
        self._ctx.attention = backend

    @property
    def tokens(self) -> list:
        """The token memory of the bound context."""
        return self._ctx.tokens

    @tokens.setter
    def tokens(self, tokens):
        self._ctx.tokens = list(tokens)

    @property
    def resident_limit(self) -> int:
        return len(self._contexts)

    @property
    def hot_bytes(self) -> int:
        """Bytes of the hot tier's rings (all contexts)."""
        pool = getattr(self._contexts[0].attention, "pool", None)
        if pool is not None:
            return pool.nbytes
        return len(self._contexts) * _rings_bytes(self.config, self._contexts[0].attention)

    def context(self, number: int) -> Context:
        if not 0 <= number < len(self._contexts):
            raise ValueError(f"context {number!r} is not one of the device's "
                             f"{len(self._contexts)}")
        return self._contexts[number]

    def bind(self, context: Context) -> None:
        if not (0 <= context.number < len(self._contexts)
                and context is self._contexts[context.number]):
            raise ValueError("bind takes one of this device's own contexts")
        self._ctx = context
        self._imported = None

    def key_of(self, tokens, *, tenant=None) -> tuple:
        return (len(tokens), sequence_hash(list(tokens), self._tenant(tenant)[1]))

    def write_tokens(self, tokens):
        self.tokens = list(tokens)

    def append_tokens(self, tokens):
        self.tokens += list(tokens)

    # -- verified import -------------------------------------------------------------------
    def _verify(self, region: int, key, tokens, key_id: int = 0):
        """The import's checks of the record in ``region`` against ``key`` and ``tokens``:
        ``(status, apply)`` where ``apply()`` loads it into the rings (status ``OK``)."""
        count, h = key
        if self.card is None:
            rec = self._memory.get(region)
            if rec is None:
                return RecordStatus.EMPTY, None
            if rec.digest != self.config.digest():
                return RecordStatus.FOREIGN_CONFIG, None
            if rec.key_id != key_id:
                return RecordStatus.NO_KEY, None
            if rec.tokens != tuple(tokens[:count]) or len(tokens) < count:
                return RecordStatus.TOKEN_MISMATCH, None
            return RecordStatus.OK, lambda: self.attention.restore(rec.rings)
        rings, _, _ = self.attention.snapshot()
        bits = 8 * self.layout.elem_bytes
        words = (np.asarray(rings).astype(np.int64) & ((1 << bits) - 1)).astype(
            f"<u{self.layout.elem_bytes}")
        try:
            status, _, meta = import_record(self.config, self.card.read, region, count=count,
                                            prefix_hash=h, session_tokens=list(tokens),
                                            rings=words, sealed=self.sealed,
                                            keys={key_id: self._ring[key_id]} if key_id else {})
        except OSError as e:
            log.warning("storage error reading region %d: %s", region, e)
            return RecordStatus.STORAGE, None
        if meta is not None and status is not RecordStatus.OK:
            self.attention.reset()          # a failure in the K/V phase empties the rings
        if status is not RecordStatus.OK:
            return status, None
        n_rings = self.config.layers * self.config.kv_heads

        def apply():
            signed = rings_from_image(self.config, words.tobytes(), signed=True)
            self.attention.restore((signed, np.full(n_rings, meta[0], dtype=np.int64),
                                    np.full(n_rings, meta[1], dtype=np.int64)))
        return status, apply

    def _query_key(self, key, tokens, key_id: int = 0):
        """``QUERY`` of ``key`` on ``tokens``: lookup, verify, import. ``(reason, moved)``: an
        empty reason is a hit (imported)."""
        region = self._lookup(key)
        if region is None:
            return "no record", 0
        tiered = self.tier is not None
        if tiered:
            before = dict(self.card.sectors), self.card.clocks
        status, apply = self._verify(region, key, tokens, key_id)
        if tiered:
            sdram = self.card.sectors["sdram"] - before[0]["sdram"]
            card = self.card.sectors["card"] - before[0]["card"]
            self.counters["sdram_sectors_in"] += sdram
            self.counters["card_sectors_in"] += card
            self.counters["import_clocks"] += self.card.clocks - before[1]
            if status is RecordStatus.OK and not card:
                self.counters["imports_sdram"] += 1
        if status is not RecordStatus.OK:
            if status not in _KEEP:
                self._delete(key)                    # can never verify: freed
            return _MISS_REASONS.get(status, "corrupt record"), 0
        apply()
        self.tokens = list(tokens[:key[0]])
        moved = snapshot_bytes(self.config, key[0])
        self.counters["imports"] += 1
        self.counters["bytes_in"] += moved
        return "", moved

    def query(self, tokens, *, tenant=None) -> QueryResult:
        tokens = [int(t) for t in tokens]
        key_id, seed = self._tenant(tenant)
        self.counters["queries"] += 1
        self._imported = None
        key = (len(tokens), sequence_hash(tokens, seed))
        reason, moved = self._query_key(key, tokens, key_id) if tokens else ("no record", 0)
        hit = not reason
        self.counters["hits" if hit else "misses"] += 1
        result = QueryResult(hit, *key, reason)
        if hit:
            self._imported = (result, moved)
        return result

    def query_prefix(self, tokens, limit: int, *, tenant=None) -> QueryResult:
        """Hash ``tokens[:limit]`` once, probing ``(n, h_n)`` for every ``n`` (``probes``
        counts them; a probe is not a use); of the stored keys, the longest whose record
        verifies wins and is imported at once. A record of other tokens (a hash collision)
        is skipped for the next shorter one, and so is a record that fails its checks (it is
        deleted, as the device's ``QUERY`` deletes it, unless :data:`_KEEP` keeps it: a
        collision, a storage fault, ``NO_KEY``); a record of a foreign configuration makes the
        query a miss."""
        if not isinstance(limit, int) or limit < 0:
            raise ValueError(f"limit must be a non-negative number of tokens, not {limit!r}")
        tokens = [int(t) for t in tokens]
        key_id, seed = self._tenant(tenant)
        limit = min(limit, len(tokens))
        self.counters["prefix_queries"] += 1
        self.counters["probes"] += limit
        self._imported = None
        hashes = prefix_hashes(tokens[:limit], seed)
        reason = "no record"
        for n in range(limit, 0, -1):
            key = (n, hashes[n - 1])
            if key not in self._keys:
                continue
            why, moved = self._query_key(key, tokens, key_id)
            if not why:
                result = QueryResult(True, *key)
                self._imported = (result, moved)
                self.counters["prefix_hits"] += 1
                return result
            reason = why
            if why == "foreign config":
                break
        self.counters["prefix_misses"] += 1
        return QueryResult(False, 0, hashes[limit - 1] if limit else seed, reason)

    def import_(self, result: QueryResult, *, tenant=None) -> int:
        if not result.hit:
            raise ValueError("import needs the result of a hit")
        key_id, _ = self._tenant(tenant)
        if self._imported is not None and self._imported[0] == result:
            return self._imported[1]                   # imported by the query
        tokens = self.tokens
        reason, moved = self._query_key((result.count, result.prefix_hash), tokens, key_id)
        if reason:
            raise StorageError(f"the record of {result.count} tokens no longer imports: "
                               f"{reason}")
        return moved

    # -- export ----------------------------------------------------------------------------
    def export(self, tokens, replaces=None, *, checkpoint=False, tenant=None):
        tokens = tuple(int(t) for t in tokens)
        key_id, seed = self._tenant(tenant)
        n = len(tokens)
        if n == 0:
            raise ValueError("export needs at least one token")
        if self.attention.n != n:
            raise ValueError(f"export of {n} tokens: the rings hold {self.attention.n}")
        if tuple(self.tokens[:n]) != tokens:
            raise ValueError(f"export of {n} tokens: the token memory holds other tokens")
        kind = RecordKind.CHECKPOINT if checkpoint else RecordKind.TURN
        key = (n, sequence_hash(list(tokens), seed))
        snap = self.attention.snapshot()
        if self.card is None:
            def store(region, seq):
                self._memory[region] = _MemoryRecord(tokens, snap, self.config.digest(),
                                                     kind.value, seq, key_id)
        else:
            rings, counts, heads = snap
            if len(set(np.asarray(counts).tolist())) != 1 or len(set(
                    np.asarray(heads).tolist())) != 1:
                raise ValueError(f"export of {n} tokens: the rings are not all at one position")

            def store(region, seq):
                self._write(region, encode_record(
                    self.config, tokens, rings, count=n, ring_head=int(heads[0]),
                    prefix_hash=key[1], commit_seq=seq, kind=kind,
                    key=self._ring[key_id] if key_id else None, key_id=key_id))
        self._store(key, store, kind.value)
        if replaces is not None and tuple(replaces) != key:
            self._delete(replaces)
        moved = snapshot_bytes(self.config, n)
        self.counters["exports"] += 1
        self.counters["checkpoints"] += bool(checkpoint)
        self.counters["bytes_out"] += moved
        return key, moved

    def _store(self, key, store, kind: int) -> int:
        """The gateware's EXPORT around ``store(region, seq)``: look the old record of ``key``
        up, insert a new link (LRU eviction), write, then retire the old record (so a crash
        in between leaves the old one valid). A failed write deletes the new link again."""
        old = self._keys.get(key)
        if old is not None:
            self._lookup(key)
        link, region = self._insert(key)
        seq = self.next_seq
        try:
            store(region, seq)
        except BaseException:
            self._drop(self._dir(DirOp.DELETE, link=link)["region"])
            if self._keys.get(key) == link:
                del self._keys[key]
            raise
        self.next_seq = seq_next(seq)
        self._meta[region] = (kind, seq)
        if old is not None and old in self.directory.live and old != link:
            region = self._dir(DirOp.DELETE, link=old)["region"]
            self._memory.pop(region, None)
            self._drop(region)
        self._keys[key] = link
        return region

    def _write(self, region: int, writes) -> None:
        """Sector writes of one record, in order: the payload, flushed, then the header,
        flushed (the header is the last write; it commits the record)."""
        base = self.layout.region_lba(region)
        for offset, data in writes[:-1]:
            self.card.write(base + offset, data)
        self.card.sync()
        offset, header = writes[-1]
        self.card.write(base + offset, header)
        self.card.sync()

    def forget(self, key) -> bool:
        """Delete the directory entry of ``key = (count, hash)`` (its region is freed; the
        record stays on the card until the region is reused, and comes back at a recovery
        until then, as on the board)."""
        return self._delete(key) is not None

    # -- what the device holds; records copied between devices --------------------------------
    def holdings(self, *, tokens: bool = True) -> list[Holding]:
        """The live records of the directory, least recently used first: count, hash, kind,
        region and commit sequence as the directory's exports and recovery found them, and
        (``tokens``) the tokens, read from the store's token sectors."""
        out = []
        rows = sorted(self.directory.live.values(),
                      key=lambda row: (self._now - row["stamp"]) & 0xFFFFFFFF, reverse=True)
        for row in rows:
            count, h, region = row["count"], row["hash"], row["region"]
            if self.card is None:
                rec = self._memory[region]
                out.append(Holding(count, h, kind_name(rec.kind), region,
                                   rec.tokens if tokens else None, rec.commit_seq))
                continue
            lba = self.layout.region_lba(region)
            kind, seq = self._meta[region]
            toks = None
            if tokens:
                tb = self.layout.token_bytes
                raw = self.card.read(lba + 1, self.layout.token_sectors(count))
                toks = tuple(int.from_bytes(raw[i:i + tb], "little")
                             for i in range(0, count * tb, tb))
            out.append(Holding(count, h, kind_name(kind), region, toks, seq))
        return out

    def listing(self) -> list[tuple[int, int, str]]:
        """The stored records, least recently used first: ``(count, hash, kind)``."""
        return [(x.count, x.prefix_hash, x.kind) for x in self.holdings(tokens=False)]

    def read_record(self, key) -> bytes:
        """The record of ``key`` in the card format (verified: header, configuration, payload
        CRC); :class:`StorageError` when it is not held or does not verify."""
        key = tuple(key)
        if self.card is None:
            raise StorageError("this software device keeps float rings in memory, not records "
                               "in the card format", hint="use the fixed-point backend")
        link = self._keys.get(key)
        if link is None:
            raise StorageError(f"no record of {key[0]} tokens with hash {key[1]:#018x} here")
        region = self.directory.live[link]["region"]
        data = read_record_bytes(self.config, self.card.read, region, keys=self._ring)
        if decode_header(data[:SECTOR], self.config).prefix_hash != key[1]:
            raise StorageError(f"region {region} holds another record than the directory says")
        return data

    def write_record(self, data: bytes, *, tenant=None) -> tuple:
        """Store a record read from another device (:meth:`read_record`, or the board's
        ``FpgaDevice.read_record``) as this device's newest: checked first (length, header,
        configuration, payload CRC, a sealed record's tag:
        :class:`~ringkv.host.record.RecordError`, a :class:`StorageError`), re-stamped with
        this store's next commit sequence, written payload first and header last into a region
        the directory allocates (as an export would). With ``tenant`` (sealed mode) the record
        must be sealed under that tenant's key (else ``NO_KEY``, nothing written). Returns its
        key."""
        if self.card is None:
            raise StorageError("this software device keeps float rings in memory: it cannot "
                               "store a record in the card format",
                               hint="use the fixed-point backend")
        header, _ = record_writes(self.config, data, keys=self._ring)
        if self.sealed != header.sealed:
            raise RecordError(RecordStatus.NO_KEY, "a sealed device stores only sealed records, "
                              "an open one only open records", header)
        if self.sealed and tenant is not None and header.key_id != self._tenant(tenant)[0]:
            raise RecordError(RecordStatus.NO_KEY, f"the record is sealed under key id "
                              f"{header.key_id}, not under tenant {tenant!r}'s key", header)
        if header.count == 0:
            raise RecordError(RecordStatus.BAD_HEADER, "a record of no tokens holds nothing "
                              "to resume", header)
        key = (header.count, header.prefix_hash)

        def store(region, seq):
            self._write(region, record_writes(self.config, data, commit_seq=seq,
                                              keys=self._ring)[1])
        self._store(key, store, header.kind)
        self.counters["copied_in"] += 1
        return key

    def stats(self) -> dict:
        kinds = [x.kind for x in self.holdings(tokens=False)]
        hot = {"hot_residents": self.card.golden.residents()} if self.tier else {}
        return dict(self.counters, **hot, records=len(kinds),
                    checkpoint_records=kinds.count("checkpoint"), regions=self.regions,
                    next_seq=self.next_seq)

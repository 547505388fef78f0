"""``ringkv board check --link URL``: the bring-up self-test of a RingKV device.

What a first board owner runs (``/dev/ttyUSB0`` for the ULX3S, ``socket://...`` for the
simulated board); every step prints one ``PASS``/``FAIL`` line with its wall time and what it
measured, and a failed step says what it means (``docs/BOARD.md`` has the whole table). A step
whose prerequisite failed is skipped. Exit status 0 when every step passed, else 1.

1. **link**: ``PING`` of several sizes (random bytes, all-zero, all-one, and the frame SYNC
   byte inside the payload) echoed byte for byte at the link's full rate, then ``STATS``: no
   frame errors (CRC, timeout), no rejected frames, no retries.
2. **identity**: ``VERSION`` (protocol and gateware version, the device's parameters) and
   ``CONFIG_DIGEST`` against the host's configuration (a difference names the field).
3. **storage**: ``STORAGE_INFO`` (the SD mode, bus width and clock of the bitstream; the card
   initialised, its type, SDSC or SDHC/SDXC, from its OCR, and its capacity from its CSD, which
   SPI mode does not read; the last storage error; the SDRAM hot tier, when the build has one:
   its slots, how many hold a record, their shape), the device's own recovery scan at power-on
   has ended (``STORAGE_STATUS``: ready, regions scanned, records found, regions freed, its
   clocks), the card is large enough for every region, and it answers ``SECTOR_READ`` of the
   first and of the last sector the device's regions use.
4. **scratch region**: the directory is cleared (a host rebuilds it from storage anyway) and
   region headers are read from region 0 on; the first region without a record is the scratch
   region (with ``--force``: region 0, whatever it holds). The allocator is steered to it: a
   placeholder directory entry at the region before it moves the regions below to FIFO B.
   No region holding a record is ever written without ``--force``.
5. **attention**: a known-answer test: random q/k/v for every layer, ``n`` tokens by chunked
   ``ATTN_PREFILL`` (the ring wraps) and one ``ATTN_DECODE``, every int16 output equal to the
   bit-exact golden core (:class:`ringkv.host.golden.fixed.FixedRingCore`).
6. **write/read/verify**: the tokens go to token memory, ``EXPORT`` writes the record to the
   scratch region (the device must report that region and the golden prefix hash), and every
   sector of it, read back with ``SECTOR_READ``, equals the golden encoder's
   (:func:`ringkv.host.record.encode_record`).
7. **export/import**: the rings are cleared, ``QUERY`` of the tokens must be a ``HIT`` (the
   device verified and imported the record), and the rings' valid slots read back are
   byte-identical to the golden core's, their heads equal. At the end the device rebuilds its
   directory from the card (``STORAGE_REBUILD``, as at power-on), so the records on the card
   are found again; the scratch record stays on the card as a record of ``n`` tokens.
8. **sdram** (last: it overwrites the SDRAM, whose hot-tier copies the device then drops; the
   records stay on the card): ``SDRAM_TEST``, the gateware's memory self-test
   (``hw/sdram/bist.py``): the data lines (walking ones and zeros), every address line alone,
   the first and last row of every bank, a pattern over the whole part (``--sdram-words``) and
   the same read back after a pause longer than the 64 ms refresh period (``--sdram-pause``,
   default 100 ms) while the controller refreshes. A failure names the test, the first wrong
   word (its bank, row and column), the bits that differ and what to try (the clock phase,
   the part fitted: ``docs/BOARD.md``). A bitstream without an SDRAM answers ``UNKNOWN_OP``:
   the step says so and passes (nothing to test).
"""

import dataclasses
import sys
import time

import numpy as np

from ringkv.defs.config import RingKVConfig, named_config
from ringkv.defs.hash import hash_seed
from ringkv.defs.protocol import (
    DEFAULT_MAX_PAYLOAD,
    FLAG_EXISTING,
    GATEWARE_VERSION,
    PROTOCOL_VERSION,
    REQUESTS,
    RESPONSES,
    RING_CLEAR_ALL,
    RING_ELEMENTS,
    SNAPSHOT_RESPONSE,
    SYNC,
    CardType,
    Op,
    Status,
    StorageKind,
)
from ringkv.defs.record import SECTOR, RecordLayout, RecordStatus
from ringkv.defs.sdram import BIST_ALL_TESTS, BOARD_CHIPS, BistPhase

from ..errors import ArgumentParser, UsageError, run_main
from ..golden.fixed import FixedRingCore
from ..golden.hash import sequence_hash
from ..record import RecordError, decode_header, encode_record
from .fpga import ConfigMismatch, DeviceNotReady, FpgaDevice
from .link import DeviceError, Link, LinkError

__all__ = ["BoardCheck", "StepResult", "main", "PING_SIZES", "describe_storage",
           "describe_tier", "SDRAM_PAUSE_MS", "describe_sdram_failure"]

#: The retention test's default pause: longer than the SDRAM's 64 ms refresh period.
SDRAM_PAUSE_MS = 100

#: Default PING payload sizes of the link step (bytes).
PING_SIZES = (0, 1, 16, 255, 1024, 4096)
#: The placeholder key that steers the allocator past records (never a real prefix: count 1).
_PLACEHOLDER = (1, 0x5C7A_7C4B_0A4D_C4EC)


def _size(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):.1f} {unit}"
    return f"{nbytes} B"


def describe_storage(info: dict) -> str:
    """One line for a :meth:`~ringkv.host.device.fpga.FpgaDevice.storage_info` record:
    ``SD card, native 4-bit bus at 20 MHz: SDHC/SDXC, 1.0 GiB (2097152 sectors), initialised``.
    """
    kind = info["kind"]
    if kind is StorageKind.NONE:
        return "no SD controller in this build (a simulation's sector model)" + _tier(info)
    mode = ("native 4-bit bus" if kind is StorageKind.SD_NATIVE
            else f"SPI mode ({info['bus_width']}-bit)")
    clock = info["sd_clock_hz"] / 1e6
    card = {CardType.UNKNOWN: "card type unknown (no card answered)",
            CardType.SDSC: "SDSC", CardType.SDHC: "SDHC/SDXC"}[info["card_type"]]
    if info["sectors"]:
        size = f"{_size(info['sectors'] * SECTOR)} ({info['sectors']} sectors)"
    else:
        size = ("size unknown (SPI mode does not read the CSD)" if kind is StorageKind.SD_SPI
                else "size unknown (the CSD was not read)")
    state = "initialised" if info["initialised"] else "NOT initialised"
    if info["high_speed"]:
        state += ", high speed"
    errors = (f"; {info['errors']} storage errors, the last {info['last_error'].name}"
              if info["errors"] else "")
    return f"SD card, {mode} at {clock:g} MHz: {card}, {size}, {state}{errors}{_tier(info)}"


def describe_tier(info: dict) -> str:
    """The SDRAM hot tier of a :meth:`~ringkv.host.device.fpga.FpgaDevice.storage_info`
    record, in words: ``SDRAM hot tier: 3 of 240 slots hold a record (273 sectors a slot, 16
    token sectors)``, or ``no SDRAM hot tier``."""
    if not info.get("hot_slots"):
        return "no SDRAM hot tier"
    return (f"SDRAM hot tier: {info['hot_residents']} of {info['hot_slots']} slots hold a "
            f"record ({info['hot_slot_sectors']} sectors a slot, {info['hot_slot_tokens']} "
            f"token sectors)")


def _tier(info: dict) -> str:
    return f"; {describe_tier(info)}" if info.get("hot_slots") else ""


@dataclasses.dataclass
class StepResult:
    name: str
    ok: bool | None          # None: skipped
    seconds: float
    detail: str
    hint: str = ""


class _Fail(Exception):
    def __init__(self, detail, hint=""):
        super().__init__(detail)
        self.detail, self.hint = detail, hint


class BoardCheck:
    """The steps of the module docstring against ``link`` (a
    :class:`~ringkv.host.device.link.Link`).

    ``tokens``: tokens of the attention/export steps (default ``window + window // 4 + 1``,
    so that the ring wraps), ``ping_sizes``, ``force`` (allow the scratch record on region 0
    whatever it holds), ``say`` (where the lines go).
    """

    def __init__(self, link, config: RingKVConfig, *, force: bool = False, seed: int = 0,
                 tokens: int | None = None, ping_sizes=PING_SIZES, say=print,
                 recovery_timeout: float = 60.0, sdram_words: int = 0,
                 sdram_pause_ms: int = SDRAM_PAUSE_MS):
        self.link, self.config, self.force = link, config, force
        #: seconds to wait for the device's recovery scan (a full card: about 0.25 s on the
        #: 4-bit bus, 1.8 s in SPI mode on the board; far longer in simulation)
        self.recovery_timeout = recovery_timeout
        self.dev = FpgaDevice(link, config)
        self.rng = np.random.default_rng(seed)
        self.n = tokens if tokens is not None else config.window + config.window // 4 + 1
        if not 1 <= self.n <= config.max_tokens:
            raise ValueError(f"tokens must be in 1..{config.max_tokens}, not {self.n!r}")
        self.ping_sizes = tuple(ping_sizes)
        #: the SDRAM step's full pattern (words, 0: the whole part) and retention pause
        self.sdram_words, self.sdram_pause_ms = sdram_words, sdram_pause_ms
        self.say = say
        self.results: list[StepResult] = []
        self.info = None
        self.scratch = None
        self.golden = None
        self.tokens = None

    # -- driver -------------------------------------------------------------------------------
    def run(self) -> bool:
        steps = [("link", self.step_link, None), ("identity", self.step_identity, "link"),
                 ("storage", self.step_storage, "identity"),
                 ("scratch region", self.step_scratch, "storage"),
                 ("attention", self.step_attention, "identity"),
                 ("write/read/verify", self.step_write_verify, ("scratch region", "attention")),
                 ("export/import", self.step_roundtrip, "write/read/verify"),
                 ("sdram", self.step_sdram, "identity")]
        done = {}
        for name, fn, needs in steps:
            needs = (needs,) if isinstance(needs, str) else (needs or ())
            missing = [n for n in needs if not done.get(n)]
            if missing:
                self._report(StepResult(name, None, 0.0, f"skipped: {', '.join(missing)} "
                                                         f"did not pass"))
                done[name] = False
                continue
            t = time.monotonic()
            try:
                detail = fn()
                result = StepResult(name, True, time.monotonic() - t, detail)
            except _Fail as e:
                result = StepResult(name, False, time.monotonic() - t, e.detail, e.hint)
            except (LinkError, DeviceError, ConfigMismatch, RuntimeError) as e:
                result = StepResult(name, False, time.monotonic() - t, str(e),
                                    _HINTS.get(name, ""))
            done[name] = result.ok
            self._report(result)
        try:
            if self.scratch is not None:
                # no placeholder left behind: the directory is the card's again
                self.dev.recover(timeout=self.recovery_timeout)
        except (LinkError, DeviceError, RuntimeError, TimeoutError) as e:
            self.say(f"note: the directory could not be rebuilt from the card ({e}); "
                     f"power-cycle the board")
        passed = sum(1 for r in self.results if r.ok)
        ok = passed == len(self.results)
        self.say(f"board check: {passed}/{len(self.results)} steps passed"
                 + ("" if ok else " -- see docs/BOARD.md for what a failure means"))
        return ok

    def _report(self, r: StepResult):
        self.results.append(r)
        tag = {True: "PASS", False: "FAIL", None: "SKIP"}[r.ok]
        self.say(f"[{tag}] {r.name:18} {r.seconds:7.2f} s  {r.detail}")
        if r.ok is False and r.hint:
            self.say(f"       -> {r.hint}")

    # -- steps --------------------------------------------------------------------------------
    def step_link(self) -> str:
        self.dev._request(Op.STATS_CLEAR)
        retries0 = self.link.stats["retries"]
        sent = 0
        t = time.monotonic()
        for i, size in enumerate(self.ping_sizes):
            kind = i % 4
            if kind == 0:
                data = self.rng.integers(0, 256, size, dtype=np.uint8).tobytes()
            elif kind == 1:
                data = bytes(size)
            elif kind == 2:
                data = b"\xff" * size
            else:
                data = bytes([SYNC, 0x81, 0, 0]) * (size // 4) + bytes([SYNC]) * (size % 4)
            status, echo = self.link.request(Op.PING, data)
            if echo != data:
                bad = next((j for j, (a, b) in enumerate(zip(echo, data)) if a != b),
                           min(len(echo), len(data)))
                raise _Fail(f"PING of {size} B came back as {len(echo)} B, first difference "
                            f"at byte {bad}", _HINTS["link"])
            sent += len(data)
        elapsed = time.monotonic() - t
        stats = RESPONSES[Op.STATS].unpack(self.dev._call(Op.STATS))
        retries = self.link.stats["retries"] - retries0
        counts = (f"frame errors {stats['frame_errors']}, rejected {stats['rejected']}, "
                  f"retries {retries}")
        if stats["frame_errors"] or stats["rejected"] or retries:
            raise _Fail(f"PINGs echoed, but {counts}", _HINTS["link"])
        wire = sent * 2 + len(self.ping_sizes) * 15
        return (f"{len(self.ping_sizes)} PINGs of {min(self.ping_sizes)}..{max(self.ping_sizes)}"
                f" B echoed byte-exact, {wire} B on the wire at {wire / elapsed / 1e3:.1f} kB/s;"
                f" {counts}")

    def step_identity(self) -> str:
        info = self.dev.version()
        self.info = info
        if info["protocol"] != PROTOCOL_VERSION:
            raise _Fail(f"device speaks protocol {info['protocol']}, host "
                        f"{PROTOCOL_VERSION}", _HINTS["identity"])
        if info["gateware"] != GATEWARE_VERSION:
            raise _Fail(f"gateware version {info['gateware']}, host expects "
                        f"{GATEWARE_VERSION}", _HINTS["identity"])
        self.dev.check_config()
        lay = RecordLayout(self.config)
        if info["sectors_per_region"] != lay.sectors_per_region:
            raise _Fail(f"device regions are {info['sectors_per_region']} sectors, the host's "
                        f"record layout {lay.sectors_per_region}", _HINTS["identity"])
        self.dev.max_payload = info["max_payload"]
        c = self.config
        return (f"protocol {info['protocol']}, gateware {info['gateware']}, config digest "
                f"{c.digest().hex()[:16]} equal (layers {c.layers}, Hq {c.q_heads}, "
                f"Hkv {c.kv_heads}, d {c.head_dim}, W {c.window}, {c.numerics}); "
                f"P={info['lanes']} M={info['macs']}, {info['regions']} regions of "
                f"{info['sectors_per_region']} sectors, max payload {info['max_payload']} B")

    def step_storage(self) -> str:
        info = self.info
        try:
            sinfo = self.dev.storage_info()
        except (DeviceError, RuntimeError) as e:
            raise _Fail(f"STORAGE_INFO failed ({e})", _HINTS["storage"]) from None
        try:
            st = self.dev.wait_ready(timeout=self.recovery_timeout)
        except (DeviceNotReady, TimeoutError) as e:
            sinfo = self.dev.storage_info()
            raise _Fail(f"the device's recovery scan did not end ready ({e}); "
                        f"{describe_storage(sinfo)}", self._storage_hint(sinfo)) from None
        sinfo = self.dev.storage_info()     # after the scan: the card has been initialised
        card = describe_storage(sinfo)
        if sinfo["kind"] is not StorageKind.NONE and not sinfo["initialised"]:
            raise _Fail(f"the card is not initialised; {card}", self._storage_hint(sinfo))
        recovery = (f"recovery scan ready: {st['scanned']}/{st['regions']} regions, "
                    f"{st['live']} records, {st['freed']} freed (torn, foreign or superseded), "
                    f"{st['cycles']} clocks")
        last = info["base_lba"] + info["regions"] * info["sectors_per_region"] - 1
        need = _size((last + 1) * SECTOR)
        if sinfo["sectors"] and sinfo["sectors"] <= last:
            raise _Fail(f"the card holds {sinfo['sectors']} sectors, the {info['regions']} "
                        f"regions need {last + 1} ({need}); {card}", _HINTS["storage"])
        for lba in (info["base_lba"], last):
            try:
                data = self.dev._call(Op.SECTOR_READ, lba=lba)
            except (DeviceError, RuntimeError) as e:
                raise _Fail(f"SECTOR_READ of sector {lba} failed ({e}); {card}",
                            _HINTS["storage"]) from None
            if len(data) != SECTOR:
                raise _Fail(f"SECTOR_READ of sector {lba} gave {len(data)} B",
                            _HINTS["storage"])
        return (f"{card}; {recovery}; sectors {info['base_lba']} and {last} readable (the "
                f"{info['regions']} regions need {need})")

    @staticmethod
    def _storage_hint(sinfo) -> str:
        if sinfo["kind"] is StorageKind.SD_NATIVE and sinfo["card_type"] is CardType.SDSC:
            return ("an SDSC card (2 GB or less): native mode supports SDHC/SDXC only; use "
                    "an SDHC/SDXC card, or build the bitstream with --storage spi")
        return _HINTS["storage"]

    def _holds_record(self, region) -> tuple[bool, str]:
        lba = self.info["base_lba"] + region * self.info["sectors_per_region"]
        try:
            decode_header(self.dev._call(Op.SECTOR_READ, lba=lba), self.config)
        except RecordError as e:
            if e.status is RecordStatus.EMPTY:
                return False, ""
            return True, e.status.name
        return True, "a valid record"

    def step_scratch(self) -> str:
        regions = self.info["regions"]
        self.dev._request(Op.DIR_CLEAR)
        if self.force:
            self.scratch = 0
            held, what = self._holds_record(0)
            return ("region 0 (--force" + (f": it held {what}, now overwritten" if held
                                           else ": it holds no record") + ")")
        skipped = []
        # Regions below the scratch go to FIFO B; the allocator takes from FIFO A while B
        # holds fewer than regions // 2 (docs/blocks/directory.md, "Policy").
        for region in range(max(1, regions // 2)):
            held, what = self._holds_record(region)
            if not held:
                break
            skipped.append((region, what))
        else:
            raise _Fail(f"the first {max(1, regions // 2)} regions all hold records; nothing "
                        f"was written", "use a blank card, or --force to overwrite region 0")
        if region > 0:
            self.dev._call(Op.DIR_INSERT, count=_PLACEHOLDER[0], hash=_PLACEHOLDER[1],
                           region=region - 1, flags=FLAG_EXISTING)
        self.scratch = region
        kept = "; ".join(f"region {r}: {w}" for r, w in skipped)
        return f"region {region} holds no record" + (f" (kept: {kept})" if skipped else "")

    def step_attention(self) -> str:
        c = self.config
        lanes = self.info["lanes"]
        golden = FixedRingCore.for_config(c, lanes)
        nx = golden.numerics
        lo, hi = -(1 << (8 * nx.elem_bytes - 1)), 1 << (8 * nx.elem_bytes - 1)
        self.dev._call(Op.SESSION_BEGIN)
        self.dev._call(Op.RING_CLEAR, layer=RING_CLEAR_ALL)
        g = c.q_heads // c.kv_heads
        outputs = 0
        for layer in range(c.layers):
            for op, count in ((Op.ATTN_PREFILL, self.n - 1), (Op.ATTN_DECODE, 1)):
                q = self.rng.integers(lo, hi, (count, c.q_heads, c.head_dim))
                k = self.rng.integers(lo, hi, (count, c.kv_heads, c.head_dim))
                v = self.rng.integers(lo, hi, (count, c.kv_heads, c.head_dim))
                if count == 0:
                    continue
                got = self.dev._attend(op, layer, q, k, v)
                want = np.concatenate([golden.attend(layer, h, q[:, h * g:(h + 1) * g],
                                                     k[:, h], v[:, h])
                                       for h in range(c.kv_heads)], axis=1)
                want = want.reshape(got.shape)
                if not np.array_equal(got, want):
                    where = np.argwhere(got != want)[0]
                    raise _Fail(f"layer {layer} {op.name}: output {tuple(where)} is "
                                f"{got[tuple(where)]}, the golden core gives "
                                f"{want[tuple(where)]} ({int((got != want).sum())} of "
                                f"{got.size} differ)", _HINTS["attention"])
                outputs += got.size
        self.golden = golden
        wraps = ", the ring wraps" if self.n > c.window else ""
        return (f"{c.layers} layers x {self.n} tokens (prefill of {self.n - 1}, one decode; "
                f"W={c.window}{wraps}): {outputs} int16 outputs equal to the bit-exact "
                f"golden core")

    def step_write_verify(self) -> str:
        c = self.config
        tokens = [int(t) for t in self.rng.integers(0, 1 << c.token_width, self.n)]
        self.dev.write_tokens(tokens)
        self.tokens = tokens
        data = self.dev._call(Op.EXPORT, n=self.n)
        r = SNAPSHOT_RESPONSE.unpack(data)
        want_hash = sequence_hash(tokens, hash_seed(c))
        if r["hash"] != want_hash:
            raise _Fail(f"EXPORT hashed the tokens to {r['hash']:#018x}, golden "
                        f"{want_hash:#018x}", _HINTS["write/read/verify"])
        if r["region"] != self.scratch:
            raise _Fail(f"EXPORT wrote region {r['region']}, not the scratch region "
                        f"{self.scratch}", _HINTS["write/read/verify"])
        writes = encode_record(c, tokens, self.golden.rings, count=self.n,
                               ring_head=int(self.golden.head[0]), prefix_hash=want_hash,
                               commit_seq=r["seq"])
        base = self.info["base_lba"] + self.scratch * self.info["sectors_per_region"]
        sectors = 0
        for offset, blob in writes:
            for s in range(len(blob) // SECTOR):
                got = self.dev._call(Op.SECTOR_READ, lba=base + offset + s)
                want = blob[s * SECTOR:(s + 1) * SECTOR]
                if got != want:
                    bad = next(j for j in range(SECTOR) if got[j] != want[j])
                    raise _Fail(f"sector {offset + s} of region {self.scratch} differs from "
                                f"the golden record at byte {bad}", _HINTS["write/read/verify"])
                sectors += 1
        return (f"EXPORT of {self.n} tokens to region {self.scratch} ({r['bytes']} B, "
                f"{r['cycles']} device cycles); {sectors} sectors read back equal to the "
                f"golden record")

    def step_roundtrip(self) -> str:
        self.dev._call(Op.RING_CLEAR, layer=RING_CLEAR_ALL)
        status, data = self.dev._request(Op.QUERY, REQUESTS[Op.QUERY].pack(n=self.n),
                                         ok=(Status.HIT, Status.MISS))
        r = SNAPSHOT_RESPONSE.unpack(data)
        if status != Status.HIT:
            raise _Fail(f"QUERY of the exported tokens missed (record status "
                        f"{r['record_status']})", _HINTS["export/import"])
        c = self.config
        head = int(self.golden.head[0])
        # the valid slots (an import writes those; the others keep older contents), read
        # slot by slot: RING_READ of the whole rings would move every slot over the link
        slots = sorted((head - t) % c.window for t in range(min(self.n, c.window)))
        eb = self.golden.numerics.elem_bytes
        want = self.golden.rings[:, :, :, slots]
        got = np.empty_like(want)
        for layer in range(c.layers):
            for h in range(c.kv_heads):
                for kind in range(2):
                    for i, slot in enumerate(slots):
                        row = ((layer * c.kv_heads + h) * 2 + kind) * c.window + slot
                        raw = self.dev._call(Op.RING_READ, addr=row * c.head_dim * eb,
                                             n=c.head_dim * eb, what=RING_ELEMENTS)
                        got[layer, h, kind, i] = np.frombuffer(raw, dtype=f"<i{eb}")
        meta = self.dev.ring_meta()
        if not np.array_equal(got, want):
            raise _Fail(f"the imported rings differ from the golden core's in "
                        f"{int((got != want).sum())} of {want.size} elements",
                        _HINTS["export/import"])
        heads = {h for _, h in meta}
        if heads != {int(self.golden.head[0])}:
            raise _Fail(f"ring heads after import {sorted(heads)}, golden "
                        f"{int(self.golden.head[0])}", _HINTS["export/import"])
        return (f"QUERY hit, {r['bytes']} B imported in {r['cycles']} device cycles; rings "
                f"({want.size} elements) byte-identical to the golden core")


    def step_sdram(self) -> str:
        # the recovery scan uses the storage port and the SDRAM tier: wait until it has ended
        # (ready or failed: the memory test needs neither the card nor the directory)
        try:
            self.dev.wait_ready(timeout=self.recovery_timeout)
        except DeviceNotReady:
            pass
        except TimeoutError as e:
            raise _Fail(f"the device's recovery scan did not end ({e})",
                        _HINTS["storage"]) from None
        try:
            r = self.dev.sdram_test(BIST_ALL_TESTS, self.sdram_words, self.sdram_pause_ms)
        except DeviceError as e:
            if e.status == Status.UNKNOWN_OP:
                return "this bitstream has no SDRAM (SDRAM_TEST answered UNKNOWN_OP): nothing " \
                       "to test"
            raise
        size = _size(2 * r["chip_words"])
        chip = _board_chip(r["chip_words"])
        bits = (r["chip_words"] - 1).bit_length()
        if r["failed"] is not BistPhase.PASS:
            raise _Fail(f"{size} part: {describe_sdram_failure(r, chip)}",
                        _SDRAM_HINTS[r["failed"]])
        return (f"{size} part ({r['chip_words']} words): data lines DQ0-15, {bits - 3} "
                f"address bits, {chip.banks if chip else '?'} banks, full pattern over "
                f"{r['words']} words ({_size(2 * r['words'])}), the same read back after a "
                f"{self.sdram_pause_ms} ms pause: no word wrong; {r['cycles']} device clocks")


def _board_chip(words):
    return next((c for c in BOARD_CHIPS.values() if c.words == words), None)


def describe_sdram_failure(r: dict, chip=None) -> str:
    """One line for a failed ``SDRAM_TEST`` record (:meth:`FpgaDevice.sdram_test`): the test,
    the first wrong word with its bank, row and column (when ``chip``, the part's geometry, is
    known), the bits that differ and the count of wrong words."""
    addr, want, got = r["address"], r["expected"], r["got"]
    where = f"word {addr:#x}"
    if chip is not None:
        col = addr & (chip.cols - 1)
        bank = addr >> chip.col_bits & (chip.banks - 1)
        row = addr >> (chip.col_bits + chip.bank_bits)
        where += f" (bank {bank}, row {row}, column {col})"
    diff = want ^ got
    lines = ", ".join(f"DQ{b}" for b in range(16) if diff >> b & 1)
    return (f"{r['failed'].name.lower()} test: {where} read {got:#06x}, expected {want:#06x} "
            f"(differ: {lines}); {r['errors']} words wrong")


_SDRAM_HINTS = {
    BistPhase.DATA: "a data line is stuck, open or shorted to another (the DQ lines named), "
                    "or reads are sampled at the wrong time: first rebuild with another SDRAM "
                    "clock phase (docs/BOARD.md, 'SDRAM bring-up'); if the same lines fail at "
                    "every phase, check their solder joints",
    BistPhase.ADDRESS: "two addresses reach one cell: an address or bank line stuck or "
                       "shorted, or a part smaller than the bitstream's (a 32 MB part under a "
                       "bitstream built for 64 MB fails at word 0x200, column bit 9): rebuild "
                       "for the part fitted (docs/BOARD.md)",
    BistPhase.BANKS: "a bank (BA0/BA1) or the highest row lines: see the address test's hint",
    BistPhase.FULL: "some cells or lines fail under a dense pattern: the SDRAM clock phase "
                    "(timing margins) first, then the part's speed grade against the build's "
                    "clock",
    BistPhase.RETENTION: "the data did not survive the pause although every word read back "
                         "right before it: the refresh does not reach the chip (CKE, the "
                         "refresh interval) or the cells are weak (temperature); try a shorter "
                         "--sdram-pause to bound it",
}


_HINTS = {
    "link": "check the baud rate (3 Mbaud), the USB cable and that no other program holds "
            "the port; frame errors mean corrupted bytes (clock, baud), no answer means a "
            "wrong port or an unconfigured FPGA (LED 0 shows the PLL lock)",
    "identity": "the bitstream was built from another version or configuration: rebuild it "
                "(make bitstream) or give the host the device's --config/--numerics",
    "storage": "no card, a card that does not answer in the bitstream's SD mode (native "
               "4-bit, or SPI), or a card smaller than the regions need: "
               "LED 1 is lit once the card is initialised; reseat or replace the card",
    "scratch region": "the directory refused the placeholder: a gateware fault",
    "attention": "the attention core disagrees with its golden model: a synthesis/timing "
                 "problem (check the build's slack) or a bad bitstream",
    "write/read/verify": "the card stores other bytes than the record written: a failing "
                         "card or SD timing; try another card or a lower SD clock",
    "export/import": "the device could not verify or import its own record: storage "
                     "corruption or a DMA fault",
    "sdram": "the SDRAM self-test could not run: see docs/BOARD.md, 'SDRAM bring-up'",
}


def _config(name: str, numerics: str | None) -> RingKVConfig:
    return named_config(name, numerics)


#: Seconds the first PING of :func:`adapt_timeouts` may take (a simulated board is slow).
PROBE_TIMEOUT = 120.0


def adapt_timeouts(link, largest: int) -> tuple[float, float, str]:
    """Per-request and recovery-scan timeouts for this link: two ``PING``s (0 and 256 bytes)
    give the round trip and the time per byte; a request may take ten times the round trip of
    the largest frame (``largest`` payload bytes, at least a sector read's), at least 10 s,
    the recovery scan ten times that. On a board (3 Mbaud, microseconds per clock) this
    gives the floors; in simulation, where a clock takes microseconds of host time, the
    simulator's own speed. Returns ``(request, recovery, how it was measured)``."""
    link.timeout = PROBE_TIMEOUT
    t = time.monotonic()
    link.request(Op.PING, b"")
    empty = time.monotonic() - t
    t = time.monotonic()
    link.request(Op.PING, bytes(256))
    per_byte = max(0.0, time.monotonic() - t - empty) / 512
    frame = max(largest, 4096)
    request = max(10.0, 10 * (empty + 2 * frame * per_byte))
    return (request, max(60.0, 10 * request),
            f"round trip {empty * 1e3:.1f} ms, {per_byte * 1e6:.2f} us per byte")


def main(argv=None) -> int:
    parser = ArgumentParser(prog="ringkv board check",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--link", required=True,
                        help="/dev/ttyUSB0 (the board) or socket://HOST:PORT (ringkv sim)")
    parser.add_argument("--config", default="default",
                        help="the device's configuration: 'default' (the board build's: the "
                             "default shape in ringkv-fx1c with the trained model's scales), "
                             "'demo' (likewise) or RingKVConfig fields as JSON")
    parser.add_argument("--numerics", choices=["ringkv-fx1", "ringkv-fx2", "ringkv-fx1c"],
                        default=None, help="the device's numerics, if not the configuration's")
    parser.add_argument("--baud", type=int, default=3_000_000)
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per request (default: adapted to the link, measured "
                             "with two PINGs first and stated)")
    parser.add_argument("--force", action="store_true",
                        help="use region 0 as the scratch region even if it holds a record")
    parser.add_argument("--tokens", type=int, default=None,
                        help="tokens of the attention and export steps (default W + W/4 + 1)")
    parser.add_argument("--ping-sizes", default=",".join(map(str, PING_SIZES)),
                        help="comma-separated PING payload sizes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sdram-words", type=int, default=0,
                        help="16-bit words of the SDRAM step's full pattern (default 0: the "
                             "whole part)")
    parser.add_argument("--sdram-pause", type=int, default=SDRAM_PAUSE_MS, metavar="MS",
                        help="the SDRAM retention test's pause in ms (default 100: longer "
                             "than the 64 ms refresh period)")
    args = parser.parse_args(argv)
    try:
        config = _config(args.config, args.numerics)
        sizes = [int(s) for s in args.ping_sizes.split(",") if s]
    except (ValueError, TypeError) as e:
        raise UsageError(f"bad --config, --numerics or --ping-sizes: {e}") from None
    print(f"ringkv board check: {args.link} at {args.baud} baud, host config digest "
          f"{config.digest().hex()[:16]}")
    if args.timeout is not None and args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, not {args.timeout}", param="timeout")
    if not 0 <= args.sdram_words < 1 << 32:
        raise UsageError(f"--sdram-words must be 0..{(1 << 32) - 1}", param="sdram-words")
    if not 0 <= args.sdram_pause < 1 << 16:
        raise UsageError("--sdram-pause must be 0..65535 ms", param="sdram-pause")
    if any(not 0 <= n <= DEFAULT_MAX_PAYLOAD for n in sizes):
        raise UsageError(f"--ping-sizes must be 0..{DEFAULT_MAX_PAYLOAD}", param="ping-sizes")
    link = Link(args.link, baudrate=args.baud, timeout=args.timeout or PROBE_TIMEOUT)
    with link:
        recovery = 60.0
        if args.timeout is None:
            link.timeout, recovery, how = adapt_timeouts(link, max(sizes, default=0))
            print(f"timeouts: {link.timeout:.1f} s per request, {recovery:.0f} s for the "
                  f"recovery scan ({how}; --timeout sets them)")
        else:
            recovery = max(recovery, args.timeout)
        ok = BoardCheck(link, config, force=args.force, seed=args.seed, tokens=args.tokens,
                        ping_sizes=sizes, recovery_timeout=recovery,
                        sdram_words=args.sdram_words, sdram_pause_ms=args.sdram_pause).run()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(run_main(main))

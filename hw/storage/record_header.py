"""A record's header sector in gateware: the encoder (fields -> bytes) and the parser (bytes ->
fields and the checks of the bytes that are constant for a configuration).

The header's layout is ``ringkv.defs.record``'s (:data:`~ringkv.defs.record.HEADER_FIELDS`,
``docs/blocks/record-format.md``); its constant bytes come from
:func:`~ringkv.defs.record.header_template` of the configuration, so gateware and golden model
(``host/record/codec.py``'s ``encode_header`` / ``decode_header``) cannot drift apart. Both pieces
work one byte per clock at any byte position, in any order: the DMA engine walks the sector from
byte 0 to 511, and a consumer that wants the variable fields (a MAC over the header) may step
an encoder over just their offsets.

* :class:`HeaderEncoder`: combinational, the header byte at ``pos`` from the variable fields
  (:data:`HeaderFields`) and the header CRC.
* :class:`HeaderParser`: registers the variable fields of the bytes it is given and flags a
  constant byte that differs from the configuration's (magic, version and header size, config
  digest and fields). The header CRC is not its business: the DMA engine runs one CRC over the
  header bytes in both directions.
* :data:`HEADER_CHECKS`: the order in which the import's header checks decide a status (the
  golden model's order), for the engine's sequencer.
"""

from amaranth import Module, Value
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from ringkv.defs.checks import check_type
from ringkv.defs.config import RingKVConfig
from ringkv.defs.record import CONST_RANGES, HEADER_OFFSETS, SECTOR, header_template

__all__ = ["HeaderFields", "ParsedHeader", "HEADER_CHECKS", "HeaderEncoder", "HeaderParser"]

#: The header's variable fields, each as wide as its place in the sector. ``ring_head`` and
#: ``kind`` are narrower in the engine; the bytes above their value are zero. ``mac_tag`` and
#: ``key_id`` are a sealed record's (``docs/blocks/mac.md``); an open record's are zero.
HeaderFields = data.StructLayout({
    name: 8 * HEADER_OFFSETS[name][1]
    for name in ("commit_seq", "prefix_hash", "count", "ring_head", "token_bytes", "k_bytes",
                 "v_bytes", "payload_crc", "kind", "mac_tag", "key_id")})
#: The fields :class:`HeaderParser` keeps: all of :data:`HeaderFields` (an import re-encodes
#: the header it read for the record MAC, and compares the stored tag).
ParsedHeader = HeaderFields
#: The import's header checks in the order they decide (first failing wins), as
#: ``(check, RecordStatus member name)``: ``magic``, ``version`` and ``config`` are
#: :class:`HeaderParser`'s flags, ``header_crc`` the CRC over all 512 bytes, ``fields`` the
#: consistency of count, head and lengths (the engine compares them with what it derives from
#: the count).
HEADER_CHECKS = (("magic", "EMPTY"), ("version", "BAD_VERSION"), ("header_crc", "BAD_HEADER"),
                 ("config", "FOREIGN_CONFIG"), ("fields", "BAD_HEADER"))


def _check_config(config):
    check_type("config", config, RingKVConfig)
    return header_template(config)


class HeaderEncoder(wiring.Component):
    """The header byte at ``pos``, combinational.

    Ports: ``pos`` (In 9: the byte's offset in the sector), ``fields`` (In :data:`HeaderFields`),
    ``header_crc`` (In 32: bytes 508..511), ``byte`` (Out 8). Constant bytes come from the
    configuration's :func:`~ringkv.defs.record.header_template`; bytes no field covers are 0.

    Latency 0 (a multiplexer on ``pos``); one byte per clock, any order; no backpressure. The
    header CRC covers bytes 0..507: a writer feeds its CRC with those bytes and presents the CRC
    by the time ``pos`` reaches 508.
    """

    def __init__(self, config: RingKVConfig):
        self._template = _check_config(config)
        super().__init__({"pos": In(9), "fields": In(HeaderFields), "header_crc": In(32),
                          "byte": Out(8)})

    def elaborate(self, platform):
        m = Module()
        template = self._template
        names = list(HeaderFields.members)
        with m.Switch(self.pos):
            for name in names:
                off, size = HEADER_OFFSETS[name]
                value = Value.cast(getattr(self.fields, name))
                for i in range(size):
                    with m.Case(off + i):
                        m.d.comb += self.byte.eq(value[8 * i:8 * i + 8])
            for i in range(4):
                with m.Case(SECTOR - 4 + i):
                    m.d.comb += self.byte.eq(self.header_crc[8 * i:8 * i + 8])
            for off, byte in enumerate(template[:SECTOR - 4]):
                if byte and not any(HEADER_OFFSETS[f][0] <= off
                                    < HEADER_OFFSETS[f][0] + HEADER_OFFSETS[f][1]
                                    for f in names):
                    with m.Case(off):
                        m.d.comb += self.byte.eq(byte)
        return m


class HeaderParser(wiring.Component):
    """Registers a header's variable fields and checks its constant bytes, one byte per clock.

    Ports: ``clear`` (In 1: zero ``commit_seq``, ``prefix_hash``, ``count`` and the flags at the
    next edge; the other fields keep their value: the lengths are checked against ``count``
    before use, and the engine uses ``kind``, ``key_id`` and ``mac_tag`` only once the whole
    sector passed its checks),
    ``valid``/``pos``/``byte`` (In: the byte at offset ``pos``), ``fields`` (Out
    :data:`ParsedHeader`), ``bad_magic``, ``bad_version``, ``bad_config`` (Out 1: a byte of
    that range differed from the configuration's since the last ``clear``; the config range
    covers the digest and the config fields around ``kind``).

    Latency 1 (fields and flags are registers); one byte per clock; no backpressure. A byte
    given twice is taken twice (the last one wins for a field; a flag stays set).
    """

    def __init__(self, config: RingKVConfig):
        self._template = _check_config(config)
        super().__init__({"clear": In(1), "valid": In(1), "pos": In(9), "byte": In(8),
                          "fields": Out(ParsedHeader), "bad_magic": Out(1),
                          "bad_version": Out(1), "bad_config": Out(1)})

    def elaborate(self, platform):
        m = Module()
        template = self._template
        fields = self.fields
        with m.If(self.clear):
            m.d.sync += [fields.commit_seq.eq(0), fields.prefix_hash.eq(0), fields.count.eq(0),
                         self.bad_magic.eq(0), self.bad_version.eq(0), self.bad_config.eq(0)]
        with m.If(self.valid):
            with m.Switch(self.pos):
                for name in ParsedHeader.members:
                    off, size = HEADER_OFFSETS[name]
                    reg = Value.cast(getattr(fields, name))
                    for i in range(size):
                        with m.Case(off + i):
                            m.d.sync += reg.word_select(i, 8).eq(self.byte)
                for flag, (lo, hi) in ((self.bad_magic, CONST_RANGES["magic"]),
                                       (self.bad_version, CONST_RANGES["version"]),
                                       (self.bad_config, CONST_RANGES["config"]),
                                       (self.bad_config, CONST_RANGES["config_fields"]),
                                       (self.bad_config, CONST_RANGES["config_fields_tail"])):
                    for off in range(lo, hi):
                        with m.Case(off):
                            with m.If(self.byte != template[off]):
                                m.d.sync += flag.eq(1)
        return m

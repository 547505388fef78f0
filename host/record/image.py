"""Card-image files: what a file holds and which configuration wrote it (:func:`survey_image`),
reading it as a card (:func:`open_card_image`, :class:`CardImage`), erasing the headers of its
broken regions (:func:`repair_image`), and the storage tool over them (:func:`main`: ``ringkv
storage`` and ``python -m ringkv.host.record``)."""

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ringkv.defs.config import DEFAULT_CONFIG, RingKVConfig, with_numerics
from ringkv.defs.mac import KEY_ID_NONE
from ringkv.defs.numerics import NUMERICS_TABLE
from ringkv.defs.record import MAGIC, SECTOR, VERSION, RecordLayout

from ..errors import ConfigError, NotACardImage, RingKVError, UsageError
from .codec import decode_fields
from .listing import REPAIRABLE_STATES, format_listing, fsck_report, region_states
from .scan import RecordInfo, scan_region

__all__ = ["ImageSurvey", "survey_image", "CardImage", "read_image_file", "open_card_image",
           "FSCK_HELP", "repair_image", "main"]


# -- images: what a file holds, which configuration wrote it ---------------------------------

#: Erased-medium byte values: an image of only these (per file) holds no record.
_ERASED = (0x00, 0xFF)


@dataclass
class ImageSurvey:
    """What :func:`survey_image` found in an image file, before any configuration is chosen.

    ``headers``: sectors beginning with the record magic; ``intact``: of those, the ones whose
    header passes its CRC and version checks and whose stored config fields give back the
    stored digest, as ``{digest: (config, [lba, ...])}``; ``damaged``: the other magic
    sectors; ``blank``: the file holds only one erased value (0x00 or 0xFF).
    """
    size: int
    blank: bool
    headers: list
    intact: dict
    damaged: list

    @property
    def sectors(self) -> int:
        return self.size // SECTOR


def _config_of(buf) -> RingKVConfig | None:
    """The configuration a header sector states, when its fields are a valid configuration
    whose digest is the stored one (else ``None``)."""
    h = decode_fields(buf)
    try:
        config = RingKVConfig(**h.config_fields)
        RecordLayout(config)
    except (ValueError, TypeError):
        return None
    return config if config.digest() == h.config_digest else None


def survey_image(data) -> ImageSurvey:
    """Find every record header in ``data`` (bytes or a read-only ``numpy`` view of an image
    file, a whole number of sectors): sectors that begin with the magic, sorted into intact
    headers (by configuration) and damaged ones. Reads each sector's first 8 bytes, and whole
    sectors only where the magic is."""
    buf = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
    size = len(buf)
    sectors = buf[:size - size % SECTOR].reshape(-1, SECTOR)
    magic = np.frombuffer(MAGIC, dtype=np.uint8)
    hits = np.flatnonzero((sectors[:, :8] == magic).all(axis=1)) if len(sectors) else []
    intact, damaged = {}, []
    for lba in map(int, hits):
        sector = bytes(sectors[lba])
        h = decode_fields(sector)
        config = _config_of(sector)
        if (h.header_crc_ok and h.version == VERSION and h.header_bytes == SECTOR
                and config is not None):
            intact.setdefault(config.digest(), (config, []))[1].append(lba)
        else:
            damaged.append(lba)
    blank = size == 0 or any(bool((buf == v).all()) for v in _ERASED if buf[0] == v)
    return ImageSurvey(size, blank, [int(x) for x in hits], intact, damaged)


@dataclass
class CardImage:
    """An image file read as a card: its configuration, where its regions start, how many
    there are, and why that configuration (``source``)."""
    path: Path
    data: object
    config: RingKVConfig
    base_lba: int
    regions: int
    source: str
    notes: list

    def read(self, lba: int, n: int) -> bytes:
        """Sectors ``lba .. lba+n-1``; short (or empty) past the image's end: a record cut by
        the end of the image is a torn record, never zero padding taken for data."""
        return bytes(self.data[lba * SECTOR:(lba + n) * SECTOR])

    def scan(self, keys=None) -> list[RecordInfo]:
        return [scan_region(self.config, lambda lba, n: self.read(self.base_lba + lba, n), r,
                            keys)
                for r in range(self.regions)]


def _describe(config: RingKVConfig) -> str:
    return (f"layers={config.layers} Hq={config.q_heads} Hkv={config.kv_heads} "
            f"d={config.head_dim} W={config.window} max_tokens={config.max_tokens} "
            f"{config.numerics} (digest {config.digest().hex()[:16]})")


def read_image_file(path) -> np.ndarray:
    """The bytes of an image file, memory-mapped read-only (an empty array for an empty
    file). A file that cannot be read is a :class:`~ringkv.host.errors.UsageError`."""
    path = Path(path)
    try:
        if path.is_dir():
            raise IsADirectoryError(21, "Is a directory")
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return np.zeros(0, dtype=np.uint8)
            return np.memmap(f, dtype=np.uint8, mode="r", shape=(size,))
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}", param="image") from None


def open_card_image(path, config: RingKVConfig | None = None, *,
                    numerics: str | None = None) -> CardImage:
    """Read ``path`` as a card image.

    The configuration comes from the records themselves: the one stated by the intact headers
    (header CRC good, fields and digest agreeing), by most headers when several are found; the
    regions start at the offset (modulo a region's sectors) those headers sit at. With no
    intact header, a damaged header whose fields and digest still agree names it. ``config``
    (``--config``) is honoured when it has the image's region layout (records of another
    configuration then show as foreign) and refused (:class:`ConfigError`) when the image's
    records were written with another layout; ``numerics`` (``--numerics``) changes the
    configuration's numerics (given or found).

    Raises :class:`NotACardImage` for an empty file, one that is not a whole number of
    sectors, or one with no record header that is not blank (text, random bytes, another
    format); a blank file (all 0x00 or all 0xFF) is a card image with no records, read with
    ``config`` (or the default configuration).
    """
    path = Path(path)
    data = read_image_file(path)
    size = len(data)
    if size == 0:
        raise NotACardImage(f"{path} is empty (0 bytes): not a RingKV card image",
                            hint="'ringkv sim --image FILE' makes a card image")
    if size % SECTOR:
        raise NotACardImage(f"{path} is {size} bytes, not a whole number of {SECTOR}-byte "
                            f"sectors: not a RingKV card image (truncated?)")
    survey = survey_image(data)
    notes = []
    try:
        given = with_numerics(config, numerics) if config is not None else None
    except ValueError as e:
        raise ConfigError(str(e), param="numerics") from None
    found = sorted(survey.intact.values(), key=lambda cl: -len(cl[1]))
    if given is None and numerics is not None and found:
        try:
            given = with_numerics(found[0][0], numerics)
        except ValueError as e:
            raise ConfigError(str(e), param="numerics") from None
    if given is None and not found and survey.damaged:
        for lba in survey.damaged:
            guess = _config_of(bytes(data[lba * SECTOR:(lba + 1) * SECTOR]))
            if guess is not None:
                found = [(guess, [lba])]
                notes.append("configuration read from a damaged header (its fields and "
                             "digest agree)")
                break
    if not survey.headers and not survey.blank:
        raise NotACardImage(f"{path} is not a RingKV card image: no record header in its "
                            f"{survey.sectors} sectors, and it is not blank",
                            hint="check the file name; 'ringkv sim --image NEW' makes a "
                                 "card image")
    if given is not None:
        chosen = given
        source = "as given (--config)" if config is not None else (
            f"from its records, numerics {numerics} as given")
        ours = survey.intact.get(given.digest(), (given, []))[1]
        spr = RecordLayout(given).sectors_per_region
        others = [(c, lbas) for c, lbas in found if c.digest() != given.digest()]
        if not ours and others and RecordLayout(others[0][0]).sectors_per_region != spr:
            c = others[0][0]
            raise ConfigError(f"{path} was written by a device of another configuration "
                              f"({_describe(c)}), with another region layout, not "
                              f"{_describe(given)}",
                              fields=c.diff(given), param="config",
                              hint="leave out --config and --numerics to read it as "
                                   "written")
        lbas = ours or [lba for _, ls in others for lba in ls]
    elif found:
        chosen, lbas = found[0][0], found[0][1]
        source = "from its records"
        if len(found) > 1:
            notes.append(f"records of {len(found) - 1} other configuration(s) found: "
                         + "; ".join(f"{len(ls)} of {_describe(c)}" for c, ls in found[1:]))
    elif survey.headers:
        raise RingKVError(f"{path}: no intact record header states the configuration "
                          f"({len(survey.damaged)} damaged header(s))",
                          hint="give it with --config (default, demo or JSON fields)")
    else:
        chosen, lbas, source = DEFAULT_CONFIG, [], "blank image: no records"
    lay = RecordLayout(chosen)
    spr = lay.sectors_per_region
    residues = [lba % spr for lba in lbas]
    base = max(set(residues), key=residues.count) if residues else 0
    # every whole region, and a last partial one whose header sector is there (a torn record)
    regions = max(0, -(-(survey.sectors - base) // spr))
    stray = [lba for lba in survey.headers if (lba - base) % spr or lba < base]
    if stray:
        notes.append(f"{len(stray)} record header(s) off this layout's region starts "
                     f"(sectors {', '.join(map(str, stray[:4]))}{' ...' if len(stray) > 4 else ''})"
                     ": left over from another configuration, the device never reads them")
    return CardImage(path, data, chosen, base, regions, source, notes)


FSCK_HELP = ("exit status: 0 clean (superseded records are normal), 1 repairable (foreign, "
             "torn or corrupt regions, which the device frees at power-on; --repair erases "
             "their headers; with --key-file also sealed records whose tag fails, or whose key "
             "is not in the file), 2 usage or an unreadable file, 3 --config refused or a bad "
             "key file, 5 not a card image.")


def repair_image(card: CardImage, infos: list[RecordInfo]) -> list[int]:
    """Erase the header sector of every region in a :data:`REPAIRABLE_STATES` state (with the
    image's erased value), so that no scan finds them again; returns those regions. The only
    writes ``storage fsck --repair`` makes."""
    states = region_states(infos)
    bad = [r for r, st in sorted(states.items()) if st in REPAIRABLE_STATES]
    if not bad:
        return []
    lay = RecordLayout(card.config)
    erased = bytes(SECTOR)
    with open(card.path, "r+b") as f:
        for r in bad:
            f.seek((card.base_lba + lay.region_lba(r)) * SECTOR)
            f.write(erased)
        f.flush()
        os.fsync(f.fileno())
    return bad


def main(argv=None) -> int:
    """``python -m ringkv.host.record IMAGE [--config C] [--numerics N] [--all | --fsck
    [--repair]]``: list the records in an image (its configuration read from the records), or
    check it (``--fsck``); exit status as :data:`FSCK_HELP`."""
    from ringkv.defs.config import named_config

    from ..errors import ArgumentParser
    parser = ArgumentParser(prog="ringkv storage", description="List (or --fsck: check) the "
                            "snapshot records in a card image", epilog=FSCK_HELP)
    parser.add_argument("image", type=Path)
    parser.add_argument("--all", action="store_true", help="also list empty regions")
    parser.add_argument("--regions", type=int, default=None,
                        help="scan only the first REGIONS regions (default: every region the "
                             "image holds)")
    parser.add_argument("--fsck", action="store_true",
                        help="check instead of list; exit 1 if a region is foreign, torn or "
                             "corrupt")
    parser.add_argument("--repair", action="store_true",
                        help="with --fsck: erase the headers of the foreign, torn and corrupt "
                             "regions (the only change fsck ever makes)")
    parser.add_argument("--config", default=None,
                        help="read the image as this configuration ('default', 'demo' or "
                             "fields as JSON) instead of the one its records state")
    parser.add_argument("--numerics", default=None, choices=sorted(NUMERICS_TABLE),
                        help="the numerics of the configuration (given or found)")
    parser.add_argument("--key-file", type=Path, default=None,
                        help="with --fsck: verify sealed records' tags with the keys in this "
                             "file (lines 'key_id hex', mode 0600)")
    args = parser.parse_args(argv)
    if args.repair and not args.fsck:
        raise UsageError("--repair goes with fsck", param="repair")
    if args.key_file is not None and not args.fsck:
        raise UsageError("--key-file goes with fsck", param="key_file")
    keys = None
    if args.key_file is not None:
        from ..keys import read_key_file
        keys = read_key_file(args.key_file).keys()
    config = None
    if args.config is not None:
        try:
            config = named_config(args.config, args.numerics)
        except (ValueError, TypeError) as e:
            raise UsageError(f"--config {args.config!r}: {e}", param="config") from None
    if args.regions is not None and args.regions < 1:
        raise UsageError(f"--regions must be a positive number, not {args.regions}",
                         param="regions")
    card = open_card_image(args.image, config, numerics=args.numerics)
    if args.regions is not None:
        card.regions = min(card.regions, args.regions)
    started = time.monotonic()
    infos = card.scan(keys)
    print(f"{card.path}: {card.regions} regions of {_describe(card.config)}, "
          f"configuration {card.source}"
          + (f", regions from sector {card.base_lba}" if card.base_lba else ""))
    for note in card.notes:
        print(f"note: {note}")
    if keys is not None:
        sealed = sum(1 for i in infos if i.key_id != KEY_ID_NONE)
        print(f"tags checked with key ids {sorted(keys)}: {sealed} sealed record(s) found")
    if not args.fsck:
        print(format_listing(infos, show_empty=args.all))
        print(f"scanned in {time.monotonic() - started:.2f} s")
        return 0
    report, problems = fsck_report(infos)
    print(report)
    if problems and args.repair:
        erased = repair_image(card, infos)
        print(f"repaired: erased the headers of region(s) {', '.join(map(str, erased))}")
        _, problems = fsck_report(CardImage(card.path, read_image_file(card.path), card.config,
                                            card.base_lba, card.regions, card.source,
                                            []).scan(keys))
    return 1 if problems else 0

"""``ringkv storage ls|fsck``: list or check the records of a card image
(:func:`ringkv.host.record.main`, its configuration read from the records themselves), or
``storage fsck --link URL``: the deep check of a device over its link (read only), or
``storage info --link URL``: the device's storage as ``STORAGE_INFO`` reports it (the medium,
and the SDRAM hot tier: its slots and how many hold a record).

The command parses its own arguments (:func:`storage_parser`) with argparse's
``parse_intermixed_args``, so that options go anywhere, before or after ``IMAGE`` (``storage ls
--config demo IMAGE``: a plain subparser would take ``ls`` and an empty ``IMAGE`` together
before the option, then refuse ``IMAGE``).
"""

import argparse

from ringkv.host.errors import ArgumentParser, UsageError

from .common import (
    NUMERICS_CHOICES,
    base_config,
    device_config,
    global_options,
    trained_or_none,
    wait_device,
)

__all__ = ["add_parser", "storage_parser", "run", "run_fsck_link", "run_info_link"]


def add_parser(sub, common):
    """``ringkv storage`` on the subparsers ``sub``: it parses its own options
    (:func:`storage_parser`)."""
    sub.add_parser("storage", help="list (ls) or check (fsck) a card image, or a device's "
                                   "storage (info --link)", add_help=False)


def storage_parser() -> argparse.ArgumentParser:
    """``ringkv storage``'s parser (the global options after the command too)."""
    common = ArgumentParser(add_help=False)
    global_options(common, default=argparse.SUPPRESS)
    p = ArgumentParser(
        prog="ringkv storage", parents=[common],
        description="List or check the records of a card image (its configuration read from "
                    "the records themselves), or check a device over its link.",
        epilog="ls lists every region: status, count, prefix hash, commit sequence, age, kind "
               "('turn' or 'checkpoint'), key ('open' or a sealed record's key id) and state: "
               "live, superseded (an older commit of a "
               "snapshot: normal), foreign (another configuration), torn (a write cut short) "
               "or corrupt. fsck reports what a rebuild keeps and frees; it changes nothing "
               "unless --repair. info --link URL: the device's medium and its SDRAM hot tier "
               "(slots, how many hold a record). " + _fsck_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["ls", "fsck", "info"])
    p.add_argument("image", nargs="?", help="the image (or --link)")
    p.add_argument("--link", help="fsck a device over its link (socket://HOST:PORT or a "
                   "serial port): every record read with SECTOR_READ and checked in depth "
                   "(header, config, payload CRC), nothing written")
    p.add_argument("--config", default=None,
                   help="an image: read it as this configuration ('default', 'demo' or fields "
                        "as JSON) instead of the one its records state (refused when the "
                        "records have another region layout); --link: the device's "
                        "(default or demo; default: default)")
    p.add_argument("--numerics", default=None, choices=NUMERICS_CHOICES,
                   help="the configuration's numerics (an image: default its records'; "
                        "--link: default ringkv-fx1c with the trained weights' scales, as the "
                        "board build)")
    p.add_argument("--all", action="store_true", help="ls: also list empty regions")
    p.add_argument("--regions", type=int, default=None,
                   help="scan only the first REGIONS regions")
    p.add_argument("--repair", action="store_true",
                   help="fsck: erase the headers of the foreign, torn and corrupt regions (the "
                        "device would free them at power-on); the only change fsck makes")
    p.add_argument("--key-file", default=None,
                   help="fsck of an image: verify sealed records' tags with the keys in this "
                        "file (one 'key_id hex' line per key; mode 0600 or stricter). Keys are "
                        "never taken from the command line")
    p.add_argument("--timeout", type=float, default=60.0, help="--link: seconds per request")
    return p


def _fsck_help() -> str:
    from ringkv.host.record.image import FSCK_HELP
    return "fsck " + FSCK_HELP


def run(args, rest) -> int:
    """``ringkv storage``: the options checked together, then the image's listing or check
    (:func:`ringkv.host.record.main`), or the check of a device (:func:`run_fsck_link`).
    ``rest``: the command's arguments (``args``, the top-level options, is not used)."""
    args = storage_parser().parse_intermixed_args(rest)
    if args.action == "info":
        if not args.link or args.image is not None:
            raise UsageError("info needs --link URL (a device), not an image", param="link")
        return run_info_link(args)
    if args.link:
        if args.action != "fsck":
            raise UsageError("--link goes with fsck or info", param="link")
        if args.image is not None:
            raise UsageError("give an IMAGE or --link, not both", param="link")
        if args.config not in (None, "default", "demo"):
            raise UsageError("--config with --link is 'default' or 'demo'", param="config")
        if args.repair:
            raise UsageError("--repair works on an image file; a device frees those regions "
                             "itself at power-on", param="repair")
        if args.key_file:
            raise UsageError("--key-file works on an image file", param="key_file")
        return run_fsck_link(args)
    if args.image is None:
        raise UsageError("storage needs an IMAGE (or fsck --link URL)", param="image")
    if args.action == "ls" and args.repair:
        raise UsageError("--repair goes with fsck", param="repair")
    if args.action == "ls" and args.key_file:
        raise UsageError("--key-file goes with fsck", param="key_file")
    from ringkv.host.record.image import main as record_main
    argv = [args.image] + (["--fsck"] if args.action == "fsck" else [])
    for flag, value in (("--config", args.config), ("--numerics", args.numerics),
                        ("--regions", args.regions), ("--key-file", args.key_file)):
        if value is not None:
            argv += [flag, str(value)]
    argv += ["--all"] * args.all + ["--repair"] * args.repair
    return record_main(argv)


def run_info_link(args) -> int:
    """``ringkv storage info --link URL``: ``STORAGE_INFO`` in words (read only)."""
    from ringkv.host.device.board_check import describe_storage, describe_tier
    from ringkv.host.device.fpga import FpgaDevice
    from ringkv.host.device.link import Link
    base = base_config(args.config or "default")
    config = device_config(base, args.numerics, trained_or_none(base))
    device = FpgaDevice(Link(args.link, timeout=args.timeout), config)
    with device.link:
        info = device.storage_info()
    print(describe_storage(info).split("; SDRAM hot tier")[0])
    print(describe_tier(info))
    return 0


def run_fsck_link(args) -> int:
    """``ringkv storage fsck --link URL``: the deep check over the link (read only)."""
    from ringkv.host.device.fpga import DeviceNotReady
    from ringkv.host.record.listing import fsck_report
    base = base_config(args.config or "default")
    config = device_config(base, args.numerics, trained_or_none(base))
    from ringkv.host.device.fpga import FpgaDevice
    from ringkv.host.device.link import Link
    device = FpgaDevice(Link(args.link, timeout=args.timeout), config)
    with device.link:
        device.check_config()
        try:
            st = wait_device(device, args.link)
            print(f"device recovery: {st['scanned']} regions, {st['live']} live, "
                  f"{st['freed']} freed, next commit {st['next_seq']}, {st['cycles']} clocks")
        except DeviceNotReady as e:
            print(f"device recovery failed: {e} (the deep check reads the card anyway)")
        infos, _ = device.check()
    report, problems = fsck_report(infos)
    print(report)
    return 1 if problems else 0


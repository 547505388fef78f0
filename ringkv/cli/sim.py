"""``ringkv sim``: the simulated device behind a TCP socket (:mod:`ringkv.sim.harness`), or
with ``--board ulx3s-85f`` the board top at its pins (:mod:`ringkv.sim.board_harness`). Those
modules parse the command's options; this one only chooses between them.
"""

from ringkv.host.errors import UsageError

__all__ = ["add_parser", "run"]


def add_parser(sub, common):
    """``ringkv sim`` on the subparsers ``sub``: its options are the harness's own."""
    sub.add_parser("sim", help="run the simulated device behind a TCP socket "
                               "('ringkv sim --help')", add_help=False)


def run(args, rest) -> int:
    """``ringkv sim ARGS``: the harness's ``main(ARGS)``."""
    if any(a == "--board" or a.startswith("--board=") for a in rest):
        if "--sealed" in rest:
            raise UsageError("--sealed is not available with --board: the pin-level board "
                             "simulation is an open build",
                             hint="ringkv sim --sealed (without --board) simulates the sealed "
                                  "RingKVTop", param="sealed")
        from ringkv.sim.board_harness import main as board_main
        return board_main(rest)
    from ringkv.sim.harness import main as sim_main
    return sim_main(rest)

"""``ringkv`` command line: demo, chat, serve, sim, bench, build, board, storage.

``demo`` runs the end-to-end scenario against simulated FPGAs (Verilator) — ``demo
--software`` the same host against the software device (golden models in the FPGA's place),
``demo --board ulx3s-85f`` against the pin-level simulation of the board top; ``board check
--link URL`` runs the bring-up self-test of a device (the board's serial port or ``ringkv
sim``'s socket); ``chat`` talks to the software device, or to a device at ``--link URL``
(``socket://`` for ``ringkv sim``, ``/dev/ttyUSB0`` for the board), greedy or sampled
(``--temperature``, ``--top-p``, ``--top-k``, ``--seed``, ``--max-tokens``, ``--stop``);
``serve`` is the OpenAI-compatible server (:mod:`ringkv.serve`); ``sim`` starts the
simulated device (``sim --board ulx3s-85f``: the board top at its pins), ``build``
the board bitstream, ``storage ls`` lists the records in a card image and ``storage fsck``
checks it, ``bench`` the benchmarks.

Modules: :mod:`~ringkv.cli.entry` (:func:`main`: the top-level parser, the dispatch, errors
to exit codes), one module per command with its parser setup and its run function
(:mod:`~ringkv.cli.demo`, :mod:`~ringkv.cli.chat` with chat's whole loop,
:mod:`~ringkv.cli.serve`, :mod:`~ringkv.cli.sim`, :mod:`~ringkv.cli.bench`,
:mod:`~ringkv.cli.build`, :mod:`~ringkv.cli.board`, :mod:`~ringkv.cli.storage`), and
:mod:`~ringkv.cli.common`, what several commands share (model loading, device configurations,
opening a device).

Layer: the command line may import everything (``ringkv.defs``, ``ringkv.hw``,
``ringkv.host``, ``ringkv.sim``, ``ringkv.boards``, ``ringkv.serve``); no other layer
imports it (only ``python -m ringkv``). Heavy modules are imported inside the functions that
need them, so that ``ringkv --help`` starts quickly.
"""

from .entry import main

__all__ = ["main"]

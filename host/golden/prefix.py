"""Golden model of ``QUERY_PREFIX`` (``hw/commands/prefix.py``): the longest prefix with a directory
entry, bit-exact, cycles included.

:func:`query_prefix` takes what the device holds -- its token memory, its hash seed
(:func:`ringkv.defs.hash.hash_seed` of the configuration) and its directory as a
:class:`~ringkv.host.golden.directory.GoldenDirectory` -- and answers what the gateware answers:
the status and every field of :data:`ringkv.defs.protocol.PREFIX_RESPONSE`.

Cycles, from the request's header to its answer (the response's ``cycles``)::

    cycles = QUERY_PREFIX_FIXED + sum over k = 1..n of cost(k)
    cost(k) = 1           if the bucket of prefix k's hash is empty
              3 + 2c(k)   otherwise, c(k) = links compared: j + 1 for a hit at chain position
                          j (0 = the bucket's head), the chain's length for a miss (two clocks
                          a link: the directory's walk reads at a registered address)

:data:`QUERY_PREFIX_FIXED` clocks are the constant part: the argument check, the first key's way
through token memory, the hash engine's input slice, the hash engine and key FIFO, the
directory's command handshake and answer, and the dispatcher's answer state. The directory
is the pipeline's bottleneck (it takes at most one key per clock, the hash engine delivers one
per clock and the key FIFO keeps the next on offer), so no other term appears:
``tests/hw/top/test_prefix.py`` checks the formula exactly against the gateware.
"""

from ringkv.defs.protocol import Status

from .directory import GoldenDirectory
from .hash import prefix_hashes

__all__ = ["query_prefix", "prefix_keys", "QUERY_PREFIX_FIXED"]

#: Constant clocks of a QUERY_PREFIX besides its keys' costs (see the module docstring): the
#: dispatcher's length check, four argument bytes, its decode clock and dispatch (7), then the
#: pipeline's fill up to the directory taking the first key (token memory read, the register
#: slice before the hash engine, the hash engine, the key FIFO's write and registered output,
#: the directory's PR_NEXT) and, after the last key, the directory's answer, the dispatcher
#: taking it and computing ``cycles`` (8).
QUERY_PREFIX_FIXED = 15


def prefix_keys(tokens, seed, n) -> list[tuple[int, int]]:
    """``[(count, hash)]`` of the prefixes of lengths ``1 .. n`` of ``tokens``."""
    hashes = prefix_hashes(list(tokens[:n]), seed)
    return [(k + 1, h) for k, h in enumerate(hashes)]


def query_prefix(tokens, seed, n, directory: GoldenDirectory, *, ready=True) -> tuple[Status,
                                                                                      dict]:
    """``(status, response fields)`` of ``QUERY_PREFIX n`` on a device whose token memory holds
    ``tokens`` and whose directory is ``directory`` (unchanged: a probe is not a use).

    ``ready=False``: the device's recovery has not ended (``NOT_READY``, no fields). ``n`` of 0
    or beyond the token memory (an empty one too) is ``BAD_ARG`` with no fields. Otherwise
    ``HIT`` with the longest ``count <= n`` whose ``(count, hash)`` has a directory entry, or
    ``MISS`` with ``count`` 0.
    """
    if not ready:
        return Status.NOT_READY, {}
    if not 1 <= n <= len(tokens):
        return Status.BAD_ARG, {}
    r, clocks = directory.probe(prefix_keys(tokens, seed, n))
    fields = {name: r[name] for name in ("count", "hash", "link", "region", "probes")}
    fields["cycles"] = QUERY_PREFIX_FIXED + clocks
    return (Status.HIT if r["status"] == 0 else Status.MISS), fields

"""Chained prefix-hash engine: one token per clock, the hash of every prefix out.

See :mod:`ringkv.host.golden.hash` for the function and its golden model.
"""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ringkv.defs.checks import check_int
from ringkv.defs.hash import ROUND_CONSTANTS, check_params

__all__ = ["HashEngine", "hash_input_layout", "hash_output_layout"]


def hash_input_layout(token_width: int) -> data.StructLayout:
    return data.StructLayout({"token": token_width, "first": 1, "last": 1})


def hash_output_layout(hash_width: int, count_width: int) -> data.StructLayout:
    return data.StructLayout({"hash": hash_width, "count": count_width, "last": 1})


class HashEngine(wiring.Component):
    """Chained prefix hash over a token stream, ``h_{i+1} = f(h_i, t_i)``
    (``docs/CONVENTIONS.md#hash``).

    Parameters
    ----------
    token_width : int
        Bits per token, 1 to ``hash_width // 2``.
    hash_width : int
        64, 96 or 128. The state is two words of ``hash_width // 2`` bits.
    count_width : int
        Width of the emitted token count (prefix length); it wraps modulo ``2**count_width``.
    seed : int
        ``h_0``; use :func:`ringkv.defs.hash.hash_seed` to fold in the config digest.
    seed_input : bool
        Take ``h_0`` from the ``seed_in`` port instead (a run-time seed: a sealed device's tenant
        seed, chosen per request); ``seed`` is then only the chain's value after reset.
    rounds : int
        ARX rounds per token (1 to 4; default 2).

    Ports
    -----
    i : ``In(stream.Signature({token, first, last}))``
        Tokens. ``first`` restarts the chain from ``seed`` at this token; a stream that never
        says ``first`` continues from ``seed`` after reset. ``last`` is passed through.
    o : ``Out(stream.Signature({hash, count, last}))``
        After each token, the hash and length of the prefix ending with it.

    Latency, throughput, backpressure
    ---------------------------------
    One clock from input transfer to output ``valid``; one token per clock sustained while
    ``o.ready`` is high (``i.ready = ~o.valid | o.ready``, a combinational path from
    ``o.ready`` to ``i.ready``). Under backpressure the output register holds its value and
    the input stalls; nothing is dropped.

    Cost and why this function
    --------------------------
    The chain is a loop: ``h_{i+1}`` needs ``h_i`` in the same clock, so ``f`` must fit one
    cycle. A multiply-based mixer would need ten or more MULT18X18D for a 64-bit product and a
    long carry path; an ARX round (rotate: wiring, add: one carry chain of ``w`` bits on
    ECP5's CCU2C cells, XOR: one LUT level) is cheap and well studied (Speck). Two rounds keep
    the loop at two ``w``-bit carry chains plus XORs. Mixing, measured by
    ``tests/hw/store/test_hash_engine.py``: flipping one bit of the last token changes about 12 of
    64 output bits and always changes the low 10 bits (the directory's bucket index), and each
    further token diffuses the difference across the whole state. Collision resistance is
    not needed for correctness: a hit also compares the stored tokens.
    """

    def __init__(self, *, token_width=16, hash_width=64, count_width=24, seed=0, rounds=2,
                 seed_input=False):
        check_params(token_width, hash_width, rounds)
        check_int("Count width", count_width, low=1, high=64, unit=" bits")
        check_int("Seed", seed)
        if not 0 <= seed < 2 ** hash_width:
            raise ValueError(f"Seed must fit in {hash_width} bits, not {seed!r}")
        self._token_width = token_width
        self._hash_width = hash_width
        self._count_width = count_width
        self._seed = seed
        self._rounds = rounds
        if not isinstance(seed_input, bool):
            raise TypeError(f"seed_input must be a bool, not {seed_input!r}")
        self._seed_input = seed_input
        ports = {
            "i": In(stream.Signature(hash_input_layout(token_width))),
            "o": Out(stream.Signature(hash_output_layout(hash_width, count_width))),
        }
        if seed_input:
            ports["seed_in"] = In(hash_width)
        super().__init__(ports)

    token_width = property(lambda self: self._token_width)
    hash_width = property(lambda self: self._hash_width)
    count_width = property(lambda self: self._count_width)
    seed = property(lambda self: self._seed)
    rounds = property(lambda self: self._rounds)
    seed_input = property(lambda self: self._seed_input)

    def elaborate(self, platform):
        m = Module()
        w = self._hash_width // 2
        mask = (1 << w) - 1

        state = Signal(self._hash_width, init=self._seed)
        count = Signal(self._count_width)
        last = Signal()

        h0 = self.seed_in if self._seed_input else self._seed
        base = Mux(self.i.payload.first, h0, state)
        x = base[:w]
        y = base[w:] ^ self.i.payload.token
        for r in range(self._rounds):
            x = (x.rotate_right(8) + y)[:w] ^ (ROUND_CONSTANTS[r] & mask)
            y = y.rotate_left(3) ^ x
        next_state = Cat(x, y)
        next_count = Mux(self.i.payload.first, 0, count) + 1

        m.d.comb += [
            self.i.ready.eq(~self.o.valid | self.o.ready),
            self.o.payload.hash.eq(state),
            self.o.payload.count.eq(count),
            self.o.payload.last.eq(last),
        ]
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [
                state.eq(next_state),
                count.eq(next_count),
                last.eq(self.i.payload.last),
                self.o.valid.eq(1),
            ]
        with m.Elif(self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        return m

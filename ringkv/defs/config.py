"""The device/model configuration every part of RingKV agrees on, and its digest.

A snapshot record is only usable by a device with the same configuration: the record header stores
:meth:`RingKVConfig.digest` and the fields themselves, so a foreign record is refused with a message
naming the differing field. The hash engine's seed folds in the same digest
(``docs/CONVENTIONS.md#hash``, :func:`ringkv.defs.hash.hash_seed`), so prefix hashes of different
configurations never match.
"""

import hashlib
import json
from dataclasses import asdict, dataclass, fields

from .checks import check_int
from .numerics import NUMERICS_TABLE, layer_score_consts

__all__ = ["RingKVConfig", "DEFAULT_CONFIG", "DEMO_CONFIG", "TRAINED_FRACS", "TRAINED_CONFIG",
           "TRAINED_DEMO_FRACS", "TRAINED_DEMO_CONFIG", "with_numerics", "named_config"]


@dataclass(frozen=True)
class RingKVConfig:
    """Model shape and arithmetic as the FPGA sees it.

    ``numerics`` names the fixed-point scheme of the attention core (formats and scales:
    :mod:`ringkv.defs.numerics`); two devices whose numerics differ must not share snapshots.
    ``qkv_fracs`` are the per-layer ``(Fq, Fk, Fv)`` fraction bits of a per-layer numerics
    (``ringkv-fx1c``: one triple per layer), empty for the others. The digest covers them; an
    empty ``qkv_fracs`` is left out of the canonical encoding, so the digests of ``ringkv-fx1``
    and ``ringkv-fx2`` configurations are the ones they always had.
    """

    layers: int = 4
    q_heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    window: int = 128
    token_width: int = 16
    max_tokens: int = 16384
    numerics: str = "ringkv-fx1"
    qkv_fracs: tuple = ()

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type is int or f.type == "int":
                check_int(f.name, value, low=1)
        if self.q_heads % self.kv_heads:
            raise ValueError(f"q_heads ({self.q_heads}) must be a multiple of kv_heads "
                             f"({self.kv_heads})")
        try:                                    # lists (JSON) become tuples: one hashable form
            fracs = tuple(tuple(t) for t in self.qkv_fracs)
        except TypeError:
            raise ValueError(f"qkv_fracs must be (Fq, Fk, Fv) per layer, not "
                             f"{self.qkv_fracs!r}") from None
        object.__setattr__(self, "qkv_fracs", fracs)
        nx = NUMERICS_TABLE.get(self.numerics)
        if nx is not None:                      # an unknown numerics is refused where it is used
            layer_score_consts(nx, self.head_dim, self.layers, fracs)

    @property
    def group(self) -> int:
        """Query heads per KV head (GQA group size G)."""
        return self.q_heads // self.kv_heads

    def canonical(self) -> bytes:
        d = asdict(self)
        if not self.qkv_fracs:
            del d["qkv_fracs"]                  # the encoding of configurations before it
        return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()

    def digest(self) -> bytes:
        """32-byte BLAKE2b digest of the canonical field encoding."""
        return hashlib.blake2b(self.canonical(), digest_size=32,
                               person=b"ringkv-config").digest()

    def diff(self, other: "RingKVConfig") -> list[str]:
        """Names and values of the fields that differ, for error messages."""
        return [f"{f.name}: {getattr(self, f.name)!r} != {getattr(other, f.name)!r}"
                for f in fields(self) if getattr(self, f.name) != getattr(other, f.name)]


DEFAULT_CONFIG = RingKVConfig()

#: The end-to-end demo's device: small enough that a Verilator simulation of the whole top
#: answers a token in well under a second, large enough to wrap the ring many times.
DEMO_CONFIG = RingKVConfig(layers=2, q_heads=4, kv_heads=2, head_dim=16, window=32,
                           max_tokens=1024)


#: The per-layer ``(Fq, Fk, Fv)`` of the trained model shipped for the default shape
#: (``host/model/weights/kjv-L4-Hq4-Hkv2-d64-W128.npz``, which stores them as ``qkv_fracs``),
#: chosen by :func:`ringkv.host.model.calibrate.calibrate_fracs` on the training split;
#: ``tests/host/model/test_calibrate.py`` checks that the calibration still gives them.
TRAINED_FRACS = ((4, 4, 6), (4, 4, 5), (4, 4, 5), (4, 4, 5))
#: The device for the shipped trained model: the default shape, int8 K/V with its calibrated
#: per-layer scales (``ringkv-fx1c``). The board build's default.
TRAINED_CONFIG = RingKVConfig(numerics="ringkv-fx1c", qkv_fracs=TRAINED_FRACS)
#: The same for the demo shape's trained model (``kjv-L2-Hq4-Hkv2-d16-W32.npz``).
TRAINED_DEMO_FRACS = ((4, 4, 6), (4, 4, 6))
TRAINED_DEMO_CONFIG = RingKVConfig(layers=2, q_heads=4, kv_heads=2, head_dim=16, window=32,
                                   max_tokens=1024, numerics="ringkv-fx1c",
                                   qkv_fracs=TRAINED_DEMO_FRACS)


def with_numerics(config: RingKVConfig, numerics: str | None) -> RingKVConfig:
    """``config`` in ``numerics`` (``None``: as it is). ``ringkv-fx1c`` takes the shipped
    trained model's fractions for ``config``'s shape (:data:`TRAINED_CONFIG`,
    :data:`TRAINED_DEMO_CONFIG`); a shape without them is a ``ValueError``. A numerics with
    fixed scales drops the fractions."""
    from dataclasses import replace
    if numerics is None:
        return config
    nx = NUMERICS_TABLE.get(numerics)
    if nx is None or not nx.per_layer:
        return replace(config, numerics=numerics, qkv_fracs=())
    shape = [f.name for f in fields(config) if f.name not in ("numerics", "qkv_fracs")]
    for trained in (TRAINED_CONFIG, TRAINED_DEMO_CONFIG):
        if all(getattr(config, k) == getattr(trained, k) for k in shape):
            return trained
    raise ValueError(f"{numerics} needs calibrated fractions: none ship for this shape "
                     f"(layers={config.layers}, d={config.head_dim}, W={config.window}); "
                     f"give the configuration as JSON with qkv_fracs")


def named_config(name: str | None, numerics: str | None = None) -> RingKVConfig:
    """The device configuration a command line names: ``"board"``/``"default"`` (or ``None``)
    the default shape, ``"demo"`` the demo shape, in ``numerics`` (default ``ringkv-fx1c``
    with the shipped trained model's fractions: :data:`TRAINED_CONFIG`, the board build's, and
    :data:`TRAINED_DEMO_CONFIG`); anything else is the fields as JSON, as given (``numerics``
    overrides theirs)."""
    if name in (None, "board", "default", "demo"):
        base = DEMO_CONFIG if name == "demo" else DEFAULT_CONFIG
        return with_numerics(base, numerics or "ringkv-fx1c")
    return with_numerics(RingKVConfig(**json.loads(name)), numerics)

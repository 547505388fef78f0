"""``ringkv.host.model``: the small Mistral-style model the host runs in numpy -- the network
and its attention backends (:mod:`.transformer`), sampling (:mod:`.sampling`), log
probabilities (:mod:`.logprobs`), the byte vocabulary as text and its Hugging Face tokenizer
files (:mod:`.vocab`, ``weights/tokenizer/``), the ``fx1c`` calibration (:mod:`.calibrate`), the
training corpus (:mod:`.corpus`) and the shipped trained weights (``weights/``).

It may import the standard library, numpy, ``ringkv.defs``, ``ringkv.host.golden`` (the
attention datapath a backend runs) and ``ringkv.host.errors``; never a device driver
(``tests/repo/test_layers.py``).

The network's names are re-exported here from :mod:`.transformer`, so ``from
ringkv.host.model import Model`` works as it did when the network was the module
``ringkv.host.model``.
"""

from .transformer import (
    BOS,
    VOCAB,
    WEIGHTS_DIR,
    AttentionBackend,
    FixedBackend,
    Float64Backend,
    Model,
    decode_text,
    encode_text,
    limit_blas_threads,
    rms_norm,
    rope,
    show_text,
    weights_path,
)

__all__ = ["AttentionBackend", "Float64Backend", "FixedBackend", "Model", "BOS", "VOCAB",
           "encode_text", "decode_text", "show_text", "rms_norm", "rope", "limit_blas_threads",
           "weights_path", "WEIGHTS_DIR"]

"""The byte vocabulary as text: tokens 0..255 are the bytes of UTF-8 text, 256 is BOS
(:mod:`ringkv.host.model.transformer`), and the Hugging Face tokenizer files that reproduce it
for tools that tokenize on their own (lm-evaluation-harness, guidellm, ``transformers``'
``AutoTokenizer``), shipped in :data:`TOKENIZER_DIR` (``ringkv tokenizer`` prints its path).

* :func:`encode`: text to tokens, its UTF-8 bytes; the text ``<BOS>`` (:data:`BOS_STR`) is the
  BOS token, as a special token's text is in a Hugging Face tokenizer (and so in vLLM's
  ``/tokenize`` and string prompts); ``add_special_tokens`` puts a BOS in front (the
  tokenizer's post-processor; a completion's string prompt gets it).
* :func:`decode`: tokens to text, bytes as UTF-8 (an invalid or incomplete sequence becomes
  U+FFFD, as Python's and the tokenizer's lossy decoding), BOS as ``<BOS>`` unless
  ``skip_special_tokens`` (generated text skips it, as vLLM's default).
  ``encode(decode(tokens)) == tokens`` for every sequence of whole UTF-8 characters and BOS.
* :func:`token_str`, :func:`token_bytes`: a token on its own, as the API shows it in
  ``logprobs``: 0..127 their ASCII character, 128..255 (a byte of a multi-byte character, no
  character by itself) ``bytes:\\xNN`` as the OpenAI API writes such tokens, BOS ``<BOS>``
  with no bytes.
* :func:`text_offsets`: where each token's text starts in the decoded text (the legacy
  ``logprobs.text_offset``): characters decoded before it, so every byte of a multi-byte
  character has the character's offset.

``tokenizer.json``: a byte-level BPE with no merges (each byte is one token, through the
GPT-2 byte-to-character table of the ``ByteLevel`` pre-tokenizer and decoder, without its
word-splitting regular expression and without a prefix space), ``<BOS>`` an added special
token with id 256 and a post-processor that puts it in front when special tokens are added;
``tokenizer_config.json`` names the class (``PreTrainedTokenizerFast``), the BOS token (also
the end of text: a generated BOS ends a text) and the chat template of
:mod:`ringkv.serve.template` in Jinja.
"""

import codecs
from pathlib import Path

from .transformer import BOS, VOCAB

__all__ = ["encode", "decode", "token_str", "token_bytes", "text_offsets", "BOS_STR",
           "TOKENIZER_DIR", "TOKENIZER_CLASS", "CHAT_TEMPLATE", "tokenizer_json",
           "tokenizer_config", "byte_chars"]

BOS_STR = "<BOS>"
#: ``tokenizer.json`` and ``tokenizer_config.json`` (next to the trained weights)
TOKENIZER_DIR = Path(__file__).resolve().parent / "weights" / "tokenizer"
TOKENIZER_CLASS = "PreTrainedTokenizerFast"

#: :mod:`ringkv.serve.template`'s chat template in Jinja (``tokenizer_config.json``,
#: ``/tokenizer_info``): what ``apply_chat_template`` renders is the server's chat prompt
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] in ['system', 'developer'] %}System"
    "{% elif message['role'] == 'user' %}User"
    "{% elif message['role'] == 'assistant' %}Assistant"
    "{% else %}{{ raise_exception('a role is system, developer, user or assistant') }}"
    "{% endif %}: "
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] is not none %}"
    "{% for part in message['content'] %}{{ part['text'] }}{% endfor %}{% endif %}"
    "{{ '\\n\\n' }}{% endfor %}{% if add_generation_prompt %}Assistant: {% endif %}")


def encode(text: str, add_special_tokens: bool = False) -> list[int]:
    """``text``'s tokens (module docstring)."""
    out = [BOS] if add_special_tokens else []
    for i, part in enumerate(text.split(BOS_STR)):
        if i:
            out.append(BOS)
        out += part.encode("utf-8")
    return out


def decode(tokens, skip_special_tokens: bool = False) -> str:
    """``tokens`` as text (module docstring)."""
    out, run = [], bytearray()
    for t in tokens:
        if t < BOS:
            run.append(t)
            continue
        out.append(run.decode("utf-8", errors="replace"))
        run = bytearray()
        if not skip_special_tokens:
            out.append(BOS_STR)
    out.append(run.decode("utf-8", errors="replace"))
    return "".join(out)


def token_bytes(token: int) -> bytes:
    """The bytes a token stands for (BOS: none)."""
    return b"" if token >= BOS else bytes((token,))


def token_str(token: int) -> str:
    """A token as the API shows it on its own (module docstring)."""
    if not 0 <= token < VOCAB:
        raise ValueError(f"a token id is 0..{VOCAB - 1}, not {token!r}")
    if token == BOS:
        return BOS_STR
    if token < 0x80:
        return chr(token)
    return f"bytes:\\x{token:02x}"


def text_offsets(tokens, start: int = 0) -> list[int]:
    """For each token, the offset in characters where its text starts in the text the tokens
    decode to (BOS skipped), counted from ``start``."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    offsets, at = [], start
    for t in tokens:
        offsets.append(at)
        if t < BOS:
            at += len(decoder.decode(bytes((t,))))
    return offsets


def byte_chars() -> list[str]:
    """The character the ``ByteLevel`` pre-tokenizer writes for each byte (GPT-2's table:
    printable Latin-1 characters stand for themselves, the other bytes for 256 + n)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1),
            *range(ord("\xae"), ord("\xff") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def tokenizer_json() -> dict:
    """The content of the shipped ``tokenizer.json`` (module docstring)."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                  "use_regex": False}
    vocab = {c: b for b, c in enumerate(byte_chars())}
    vocab[BOS_STR] = BOS
    bos = {"SpecialToken": {"id": BOS_STR, "type_id": 0}}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": BOS, "content": BOS_STR, "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": False,
                          "special": True}],
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {BOS_STR: {"id": BOS_STR, "ids": [BOS], "tokens": [BOS_STR]}}},
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }


def tokenizer_config() -> dict:
    """The content of the shipped ``tokenizer_config.json`` (module docstring); the server's
    ``/tokenizer_info`` adds ``model_max_length`` (its token memory)."""
    return {"tokenizer_class": TOKENIZER_CLASS, "bos_token": BOS_STR, "eos_token": BOS_STR,
            "add_bos_token": True, "add_eos_token": False,
            "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE}

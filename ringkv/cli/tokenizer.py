"""``ringkv tokenizer``: where the Hugging Face tokenizer files of the byte vocabulary are
(:mod:`ringkv.host.model.vocab`), for tools that tokenize on their own and would otherwise
download a tokenizer named after the model: ``AutoTokenizer.from_pretrained(DIR)``,
lm-evaluation-harness' ``tokenizer=DIR``, guidellm's ``--processor DIR``.
"""

from ringkv.host.model.vocab import TOKENIZER_DIR

from .common import no_rest

__all__ = ["add_parser", "run"]


def add_parser(sub, common):
    p = sub.add_parser("tokenizer", parents=[common],
                       help="print the directory of the model's Hugging Face tokenizer files",
                       description="Print the directory holding tokenizer.json and "
                                   "tokenizer_config.json for the byte vocabulary (tokens "
                                   "0..255 the UTF-8 bytes, 256 BOS), to pass to tools that "
                                   "load a Hugging Face tokenizer (AutoTokenizer, "
                                   "lm-evaluation-harness' tokenizer=, guidellm's "
                                   "--processor): they then need no download.")
    p.add_argument("--file", action="store_true",
                   help="print the path of tokenizer.json instead of its directory")


def run(args, rest) -> int:
    no_rest(rest, "tokenizer")
    print(TOKENIZER_DIR / "tokenizer.json" if args.file else TOKENIZER_DIR)
    return 0

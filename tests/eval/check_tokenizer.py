"""Run in the eval venv (``make eval``; no ringkv there): load the shipped tokenizer with
``transformers.AutoTokenizer`` offline and check it against the cases on standard input (JSON:
``{"dir", "encode": [[text, ids, ids with special tokens], ...], "decode": [[ids, text],
...], "chat": [messages, ids]}``, made by ringkv's own functions); prints ``ok``."""

import json
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"

from transformers import AutoTokenizer  # noqa: E402


def main() -> int:
    cases = json.load(sys.stdin)
    tok = AutoTokenizer.from_pretrained(cases["dir"])
    assert (tok.bos_token, tok.bos_token_id, tok.eos_token_id, len(tok)) == ("<BOS>", 256, 256,
                                                                             257)
    for text, ids, special in cases["encode"]:
        assert tok.encode(text, add_special_tokens=False) == ids, (text, ids)
        assert tok.encode(text) == special, (text, special)
        assert tok.decode(ids) == text, text
    for ids, text in cases["decode"]:
        got = tok.decode(ids)
        assert got == text, (ids, got, text)
    messages, ids = cases["chat"]
    assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        tok.decode(ids)
    assert list(tok.apply_chat_template(messages, add_generation_prompt=True,
                                        return_dict=True)["input_ids"]) == ids
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Log probabilities (host/model/logprobs.py), the scheduler's ``logprobs`` and
``prompt_logprobs``, ``min_tokens`` and ``ignore_eos`` in the sampler and the text stream, and
the byte vocabulary as text with its shipped Hugging Face tokenizer files
(host/model/vocab.py)."""

import json

import numpy as np
import pytest

from ringkv.defs.config import DEMO_CONFIG
from ringkv.host.device.software import SoftwareDevice
from ringkv.host.model import vocab
from ringkv.host.model.logprobs import log_softmax, prompt_logprobs, token_logprob
from ringkv.host.model.sampling import Sampler, SamplingParams
from ringkv.host.model.transformer import BOS, FixedBackend, Model
from ringkv.host.scheduler import Scheduler, plain_run
from ringkv.serve.template import TextStream


def _logits(seed=0):
    return np.random.default_rng(seed).standard_normal(257) * 4


def test_log_softmax_is_normalized_and_shift_invariant():
    z = _logits(1)
    lp = log_softmax(z)
    assert lp.dtype == np.float64 and np.isclose(np.logaddexp.reduce(lp), 0.0, atol=1e-12)
    assert np.allclose(lp, z - np.log(np.exp(z).sum()), atol=1e-12)
    assert np.allclose(log_softmax(z + 1000.0), lp, atol=1e-9)       # no overflow
    rows = np.stack([_logits(2), _logits(3)])
    assert np.array_equal(log_softmax(rows)[1], log_softmax(rows[1]))


def test_token_logprob_ranks_and_breaks_ties_by_the_lower_id():
    z = np.zeros(257)
    z[[40, 7, 9]] = [1.0, 5.0, 5.0]
    info = token_logprob(z, 40, top_n=3)
    assert info.token == 40 and info.rank == 3
    assert [t for t, _ in info.top] == [7, 9, 40]
    assert info.top[0][1] == info.top[1][1] == pytest.approx(log_softmax(z)[7])
    assert info.logprob == log_softmax(z)[40]
    assert token_logprob(z, 9).rank == 2 and token_logprob(z, 9).top == ()
    assert token_logprob(z, 0, 20).rank == 4      # the first of the 254 equal ones
    with pytest.raises(ValueError):
        token_logprob(z, 0, 300)


def test_prompt_logprobs_read_row_i_for_token_i_plus_1():
    rows = np.stack([_logits(i) for i in range(4)])
    tokens = [256, 5, 6, 7]
    out = prompt_logprobs(rows, tokens, 2)
    assert out[0] is None and len(out) == 4
    assert [o.logprob for o in out[1:]] == [log_softmax(rows[i])[tokens[i + 1]]
                                          for i in range(3)]
    assert prompt_logprobs(rows[:3], tokens)[3].logprob == out[3].logprob   # last row unused
    assert prompt_logprobs(rows[:0], [9]) == [None]
    with pytest.raises(ValueError):
        prompt_logprobs(rows[:2], tokens)


def _sched(model):
    return Scheduler(model, SoftwareDevice(DEMO_CONFIG, attention=FixedBackend(DEMO_CONFIG)),
                     chunk=16)


def test_scheduler_gives_each_tokens_logprob_the_same_whatever_was_reused():
    """A generated token's logprob from a prompt imported from the store equals the one from
    a run that computed everything (the bit-exact backend: equal, not close), and the prompt's
    logprobs (echo) equal the logits of a plain forward pass."""
    model = Model(DEMO_CONFIG, hidden=64, ffn=128, seed=3)
    prompt = [BOS] + list(b"In the beginning God created the heaven and the earth. And")
    sampler = Sampler(SamplingParams(temperature=0))
    first, again = [], []
    a = _sched(model)
    out = a.request("x", prompt, 6, logprobs=3, sample=sampler, checkpoints=[len(prompt) - 1],
                    on_token=lambda t, i: first.append(i) and False)
    assert out == plain_run(model, [(0, prompt, 6)], lambda: FixedBackend(DEMO_CONFIG))[0]
    assert [i.token for i in first] == out and all(len(i.top) == 3 for i in first)
    assert all(i.rank == 1 for i in first)           # greedy: the most likely each time
    # a new session with the same prompt: imported from the store (all but its last token,
    # the checkpoint the server marks on a completion's prompt), the last token decoded
    out2 = a.request("y", prompt, 6, logprobs=3, sample=sampler,
                     on_token=lambda t, i: again.append(i) and False)
    assert a.events[-1]["path"] == "prefix" and a.events[-1]["reused"] == len(prompt) - 1
    assert out2 == out and again == first
    # echo: every prompt token's logprob, nothing reused, the same again
    b = _sched(model)
    b.request("p", prompt, 0, prompt_logprobs=2)
    echo = b.events[-1]["prompt_logprobs"]
    b.request("q", prompt, 0, prompt_logprobs=2)
    assert b.events[-1]["path"] == "first" and b.events[-1]["reused"] == 0
    assert b.events[-1]["prompt_logprobs"] == echo
    assert echo[0] is None and [e.token for e in echo[1:]] == prompt[1:]
    backend = FixedBackend(DEMO_CONFIG)
    rows = np.concatenate([model.forward(prompt[c:c + 16], c, backend)
                           for c in range(0, len(prompt), 16)])
    assert echo == prompt_logprobs(rows, prompt, 2)
    with pytest.raises(ValueError, match="new session"):
        b.request("q", [65], 1, prompt_logprobs=0)


def test_a_tokens_logprob_is_the_same_from_the_resident_rings_as_recomputed():
    """The hot tier: a session continued in the rings it left (path ``continue``) gives each
    generated token the logprob a new session computing the whole stream gives."""
    model = Model(DEMO_CONFIG, hidden=64, ffn=128, seed=3)
    first, rest = [BOS] + list(b"And God said,"), list(b" Let there be light")
    sampler = Sampler(SamplingParams(temperature=0))
    a, hot = _sched(model), []
    out1 = a.request("s", first, 3, sample=sampler)
    a.request("s", rest, 5, logprobs=4, sample=sampler,
              on_token=lambda t, i: hot.append(i) and False)
    assert a.events[-1]["path"] == "continue"
    cold = []
    _sched(model).request("t", first + out1 + rest, 5, logprobs=4, sample=sampler,
                          on_token=lambda t, i: cold.append(i) and False)
    assert hot == cold


def test_batched_requests_give_the_logprobs_of_a_request_alone():
    """The batching scheduler: requests running together (one with ``logprobs``, one with
    ``prompt_logprobs``, one plain, another with both) give the logprobs each gives alone on
    the one-at-a-time scheduler, bit for bit."""
    from ringkv.host.batch import BatchScheduler
    from ringkv.host.model.transformer import RingPool
    model = Model(DEMO_CONFIG, hidden=64, ffn=128, seed=3)
    prompts = [[BOS] + list(t) for t in (b"And God said, Let there be light", b"In the",
                                         b"The LORD is my shepherd; I shall not want.",
                                         b"Blessed are the meek")]
    opts = [dict(logprobs=2), dict(prompt_logprobs=3), {}, dict(logprobs=0, prompt_logprobs=1)]

    def run(sched, batched):
        got = [[] for _ in prompts]

        def hook(i):
            return lambda t, info=None: got[i].append((t, info)) and False
        kws = [dict(sample=Sampler(SamplingParams(temperature=0)), on_token=hook(i), **o)
               for i, o in enumerate(opts)]
        if batched:
            reqs = [sched.submit(f"s{i}", p, 5, **kw) for i, (p, kw) in
                    enumerate(zip(prompts, kws))]
            while sched.busy:
                sched.step()
            echo = [r.event.get("prompt_logprobs") for r in reqs]
            assert sched.max_batch >= 4
        else:
            echo = []
            for i, (p, kw) in enumerate(zip(prompts, kws)):
                sched.request(f"s{i}", p, 5, **kw)
                echo.append(sched.events[-1].get("prompt_logprobs"))
        return got, echo

    dev = SoftwareDevice(DEMO_CONFIG, attention=FixedBackend(DEMO_CONFIG),
                         hot_bytes=4 * RingPool.slot_bytes(DEMO_CONFIG))
    batched = run(BatchScheduler(model, dev, chunk=16), True)
    alone = run(_sched(model), False)
    assert batched == alone
    got, echo = batched
    assert [e is None for e in echo] == [True, False, True, False]
    assert all(info is None for _, info in got[1]) and len(got[0][0][1].top) == 2


def test_min_tokens_masks_bos_and_ignore_eos_keeps_going():
    z = np.zeros(257)
    z[BOS] = 50.0
    s = Sampler(SamplingParams(temperature=0, min_tokens=2, max_tokens=4))
    assert [s(z), s(z), s(z)] == [0, 0, BOS]
    s = Sampler(SamplingParams(temperature=1.0, seed=1, min_tokens=3, max_tokens=3))
    assert BOS not in [s(z) for _ in range(3)]
    # the text: a stop sequence counts from the min_tokens-th token on, BOS likewise
    t = TextStream(("ab",), min_tokens=4)
    pieces = [t.push(x) for x in b"abxab"]
    assert [p[1] for p in pieces] == [False, False, False, False, True]
    assert t.full_text == "abx"
    t = TextStream(("ab",), min_tokens=2)
    assert t.push(ord("a")) == ("", False) and t.push(ord("b")) == ("", True)
    t = TextStream(min_tokens=2)
    assert t.push(BOS) == ("", False) and t.push(65) == ("A", False)
    assert t.push(BOS) == ("", True)
    t = TextStream(("\n\n",), ignore_eos=True)
    assert [t.push(x)[1] for x in (65, BOS, 66)] == [False, False, False]
    assert t.finish() == "" and t.full_text == "AB"


def test_vocab_encode_decode_offsets_and_token_strings():
    text = "héllo <BOS>wörld ✓"
    tokens = vocab.encode(text)
    assert tokens[:6] == list("héllo".encode())
    assert BOS in tokens and vocab.encode(text, add_special_tokens=True) == [BOS, *tokens]
    assert vocab.decode(tokens) == text
    assert vocab.decode(tokens, skip_special_tokens=True) == text.replace("<BOS>", "")
    assert vocab.decode([0xE2, 0x9C]) == "\ufffd" and vocab.decode([0xFF, 65]) == "\ufffdA"
    assert [vocab.token_str(t) for t in (65, 0x20, 0xC3, BOS)] == \
        ["A", " ", "bytes:\\xc3", "<BOS>"]
    assert vocab.token_bytes(BOS) == b"" and vocab.token_bytes(0xC3) == b"\xc3"
    # é is two bytes, one character: both bytes at its offset; BOS has no text
    assert vocab.text_offsets([BOS, 104, 0xC3, 0xA9, 108], 5) == [5, 5, 6, 6, 7]
    with pytest.raises(ValueError):
        vocab.token_str(257)


def test_the_shipped_tokenizer_files_are_the_vocabulary_s():
    files = {"tokenizer.json": vocab.tokenizer_json(),
             "tokenizer_config.json": vocab.tokenizer_config()}
    for name, content in files.items():
        assert json.loads((vocab.TOKENIZER_DIR / name).read_text()) == content, name
    chars = vocab.byte_chars()
    assert len(set(chars)) == 256 and chars[ord("A")] == "A" and chars[ord(" ")] == "\u0120"
    model = files["tokenizer.json"]["model"]
    assert model["merges"] == [] and model["vocab"]["<BOS>"] == BOS
    assert sorted(model["vocab"].values()) == list(range(257))
    config = files["tokenizer_config.json"]
    assert config["bos_token"] == config["eos_token"] == "<BOS>"
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"


def test_the_chat_template_in_jinja_renders_the_servers_prompt():
    jinja2 = pytest.importorskip("jinja2")
    from ringkv.serve.template import chat_prompt
    msgs = [{"role": "system", "content": "Speak."},
            {"role": "user", "content": [{"type": "text", "text": "Who "},
                                         {"type": "text", "text": "art thou?"}]},
            {"role": "assistant", "content": "I am."}, {"role": "user", "content": "Ah."}]
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)    # as transformers'
    text = env.from_string(vocab.CHAT_TEMPLATE).render(messages=msgs, bos_token="<BOS>",
                                                       add_generation_prompt=True)
    assert vocab.encode(text) == list(chat_prompt(msgs).tokens)

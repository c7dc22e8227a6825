"""Plan files (socllm.plan_files): a plan written as JSON is read back by the commands that take
--plan, and a bad file is refused naming the file."""

from __future__ import annotations

import json

import pytest
import socllm
from socllm.cli import main
from socllm.errors import FormatError, InvalidArgumentError, MissingFileError
from socllm.plan_files import read_plan, write_plan

COMPOSED = "edgeflow:bits=5,partition=solver,attention=shadow-attn:keep=0.3"


def test_a_written_plan_reads_back_as_the_same_plan(tmp_path):
    path = write_plan(tmp_path / "p.json", COMPOSED, about="the best TTFT under 0.05 nats")
    raw = json.loads(path.read_text())
    assert raw["_about"] == "the best TTFT under 0.05 nats"
    want = socllm.Plan(COMPOSED).to_json()
    for spec in (f"@{path}", str(path)):
        assert socllm.Plan(read_plan(spec)).to_json() == want
    # plan text is passed through untouched, JSON text too
    assert read_plan(COMPOSED) == COMPOSED
    assert read_plan('{"name": "w8a8"}') == '{"name": "w8a8"}'


def test_simulate_and_eval_take_a_plan_file(tmp_path, capsys):
    """`socllm simulate --plan FILE` times the plan in the file: the same summary as the plan's
    text; `socllm eval` accepts it among its plans."""
    path = write_plan(tmp_path / "rec.json", "w8a8:chunk_len=256")
    argv = ["simulate", "--config", "qwen2-0.5b", "--prompt-len", "256", "--json", "-"]
    assert main([*argv, "--plan", "w8a8:chunk_len=256", "--quiet"]) == 0
    from_text = json.loads(capsys.readouterr().out)
    assert main([*argv, "--plan", f"@{path}", "--quiet"]) == 0
    from_file = json.loads(capsys.readouterr().out)
    assert from_file["prefill_ms"] == from_text["prefill_ms"] > 0
    assert from_file["energy_mj"] == from_text["energy_mj"]
    # a file whose plan differs gives a different timeline (the file is read, not its name)
    other = write_plan(tmp_path / "other.json", "fp32")
    assert main([*argv, "--plan", str(other), "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["prefill_ms"] != from_text["prefill_ms"]


@pytest.mark.parametrize(
    "content, error, words",
    [
        (None, MissingFileError, "does not exist"),
        ("{not json", FormatError, "is not JSON"),
        ("[1, 2]", FormatError, "holds a list"),
        ('{"name": "w8a8", "bogus": 1}', InvalidArgumentError, "bogus"),
        ('{"name": "no-such-plan"}', InvalidArgumentError, "no-such-plan"),
    ],
)
def test_a_bad_plan_file_is_refused_naming_it(tmp_path, content, error, words):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(error, match=words) as e:
        read_plan(f"@{path}")
    assert str(path) in str(e.value)


def test_a_bad_plan_file_fails_the_command_before_work(tmp_path, capsys):
    path = tmp_path / "missing.json"
    assert main(["simulate", "--config", "qwen2-0.5b", "--plan", str(path)]) == 2
    assert "missing.json" in capsys.readouterr().err
    with pytest.raises(InvalidArgumentError, match="no path after '@'"):
        read_plan("@")

"""Atomic writes (socllm.io.files): all or nothing, and the permissions a plain write gives."""

from __future__ import annotations

import os
import stat
import sys

import pytest
from socllm.io.files import atomic_path, atomic_write_text, emit_json, make_temp_dir

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX permissions")


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002, 0o000])
def test_new_file_gets_umask_mode(tmp_path, umask, mask):
    umask(mask)
    atomic_write_text(tmp_path / "a.txt", "hi\n")
    assert _mode(tmp_path / "a.txt") == 0o666 & ~mask
    with atomic_path(tmp_path / "sub" / "b.bin") as tmp:
        assert _mode(tmp) == 0o666 & ~mask  # the writer sees the final mode already
        tmp.write_bytes(b"\0")
    assert _mode(tmp_path / "sub" / "b.bin") == 0o666 & ~mask
    # the same as a plain (non-atomic) write
    (tmp_path / "plain.txt").write_text("x")
    assert _mode(tmp_path / "a.txt") == _mode(tmp_path / "plain.txt")


def test_replacing_keeps_the_existing_mode(tmp_path, umask):
    umask(0o022)
    dest = tmp_path / "r.json"
    dest.write_text("old")
    os.chmod(dest, 0o640)
    atomic_write_text(dest, "new")
    assert dest.read_text() == "new" and _mode(dest) == 0o640
    umask(0o077)
    os.chmod(dest, 0o664)
    emit_json({"a": 1}, str(dest))
    assert dest.read_text() == '{\n  "a": 1\n}\n' and _mode(dest) == 0o664


def test_failed_write_leaves_nothing(tmp_path):
    dest = tmp_path / "x.txt"
    dest.write_text("keep")
    with pytest.raises(RuntimeError), atomic_path(dest) as tmp:
        tmp.write_text("partial")
        raise RuntimeError("interrupted")
    assert dest.read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.txt"]


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_temp_dir_gets_umask_mode(tmp_path, umask, mask):
    umask(mask)
    d = make_temp_dir(tmp_path)
    assert d.is_dir() and d.parent == tmp_path and d.name.startswith(".tmp-")
    assert _mode(d) == 0o777 & ~mask
    assert make_temp_dir(tmp_path) != d


def test_emit_json_to_stdout(capsys, tmp_path):
    emit_json({"b": [1, 2]}, "-")
    assert capsys.readouterr().out == '{\n  "b": [\n    1,\n    2\n  ]\n}\n'
    emit_json({"b": 1}, None)
    assert capsys.readouterr().out == ""

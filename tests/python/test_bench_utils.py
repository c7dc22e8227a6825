"""socllm.eval.bench_utils.source_commit: the commit of a socllm checkout, never another
repository's."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from socllm.eval import bench_utils

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _repo(root: Path, package: str) -> tuple[Path, str]:
    """A git repository at ``root`` with a module file at ``package``/eval/bench_utils.py (where
    the real one is), committed."""
    pkg = root / package / "eval"
    pkg.mkdir(parents=True)
    (pkg / "bench_utils.py").write_text("# stand-in\n")
    env = ["-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "."], check=True)
    subprocess.run(["git", "-C", str(root), *env, "commit", "-qm", "c"], check=True)
    head = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return pkg / "bench_utils.py", head


@pytest.fixture(autouse=True)
def fresh_commit_cache():
    """source_commit is read once per process: each case starts and ends without a value."""
    bench_utils.source_commit.cache_clear()
    yield
    bench_utils.source_commit.cache_clear()


def test_source_commit_of_a_checkout_and_dirty_flag(tmp_path, monkeypatch):
    module, head = _repo(tmp_path / "socllm", "python/socllm")
    monkeypatch.setattr(bench_utils, "__file__", str(module))
    assert bench_utils.source_commit() == head
    module.write_text("# edited\n")
    assert bench_utils.source_commit() == head  # once per process: the code it imported
    bench_utils.source_commit.cache_clear()
    assert bench_utils.source_commit() == head + "+dirty"


def test_no_commit_inside_another_repository_or_outside_git(tmp_path, monkeypatch):
    # a wheel in a virtualenv that lives inside some project's repository
    module, _ = _repo(tmp_path / "project", ".venv/lib/site-packages/socllm")
    monkeypatch.setattr(bench_utils, "__file__", str(module))
    assert bench_utils.source_commit() is None
    bench_utils.source_commit.cache_clear()
    plain = tmp_path / "plain" / "python" / "socllm" / "eval" / "bench_utils.py"
    plain.parent.mkdir(parents=True)
    plain.write_text("")
    monkeypatch.setattr(bench_utils, "__file__", str(plain))
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    assert bench_utils.source_commit() is None


def test_source_commit_of_this_checkout():
    """Not a stand-in: the module where it is (socllm/eval/) finds its own checkout's commit."""
    root = Path(bench_utils.__file__).resolve().parents[3]
    if not (root / ".git").exists():
        pytest.skip("socllm is not imported from a git checkout")
    head = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert bench_utils.source_commit() in (head, head + "+dirty")

#!/usr/bin/env bash
# The whole test suite: sets up (idempotent), then C++ tests (ctest) and Python tests (pytest).
# Extra arguments go to pytest (e.g. --runslow for the long evaluations).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=${PYTHON:-python3}
build_dir=$("$PY" -c "import glob,os; d=[p for p in glob.glob('build/*') if os.path.exists(p+'/CTestTestfile.cmake')]; print(max(d, key=os.path.getmtime) if d else '')")
if [ -z "$build_dir" ]; then echo "[test] no C++ build directory found" >&2; exit 1; fi
echo "[test] ctest in $build_dir"
ctest --test-dir "$build_dir" --output-on-failure -j2
echo "[test] ruff"
"$PY" -m ruff check python tests scripts calibration
"$PY" -m ruff format --check python tests scripts calibration
# The C++ sources in the style of .clang-format, with the clang-format pinned in pyproject.toml
# (the `test` extra), not whichever is on PATH. To fix: clang-format -i <files>.
clang_format() { "$PY" -c "import clang_format; clang_format.clang_format()" "$@"; }
echo "[test] $(clang_format --version)"
mapfile -d '' cpp_sources < <(find cpp \( -name '*.h' -o -name '*.cpp' \) -print0 | sort -z)
clang_format --dry-run --Werror "${cpp_sources[@]}"
echo "[test] pytest"
# the slowest tests in the log: the default tier's time budget is about 8 minutes on 2 cores.
# Test files run in SOCLLM_TEST_WORKERS processes (pytest-xdist; default 2, 0: one process): much
# of a file's time is imports, model loads and subprocesses that leave a core idle (8 min 40 s
# -> 7 min 30 s on a 2-core Zen 4). A file stays in one worker, with its module fixtures.
workers=${SOCLLM_TEST_WORKERS:-2}
# numpy asks for transparent huge pages on every array over 4 MB (madvise); where the kernel
# then compacts memory in the faulting thread (defrag "madvise", the VMs of CI), a fresh
# [544, 262144] logits temporary took up to 7.4 s to touch, 0.7-0.8 s without huge pages. The
# tests make many such temporaries: without huge pages test_gemma3 takes half the time.
export NUMPY_MADVISE_HUGEPAGE=${NUMPY_MADVISE_HUGEPAGE:-0}
"$PY" -m pytest -q -n "$workers" --dist loadfile --durations=20 "$@"

#!/usr/bin/env bash
# socllm under AddressSanitizer + UndefinedBehaviorSanitizer: builds the core, the C++ tests and
# the module in their own tree (build/sanitized; the editable install is not touched), runs the
# C++ tests (ctest), then the Python smoke run (scripts/sanitized_smoke.py: every plan, chunked
# prefill, generate, KV-cache decode, perplexity, simulate, calibration save/load, the GGUF and
# HDF5 loaders on the real default model), the fuzz tests (tests/python/test_fuzz.py: the saved
# corpus and the short campaigns) and the hardening and loader tests (threads on one KV cache,
# Ctrl-C, sizes, corrupt files: test_hardening.py, test_errors.py) on the sanitized module.
#
# Environment: SOCLLM_SANITIZE (default address,undefined,float-cast-overflow), SOCLLM_NATIVE
# (ON), JOBS (2), BUILD_DIR (build/sanitized), PYTHON (python3), CXX (g++: its libasan is
# preloaded). Arguments go to sanitized_smoke.py. A sanitizer finding stops the step it is in
# with the report on stderr; the script exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(command -v "${PYTHON:-python3}")
CXX=${CXX:-g++}
BUILD_DIR=${BUILD_DIR:-build/sanitized}
SANITIZE=${SOCLLM_SANITIZE:-address,undefined,float-cast-overflow}
t_start=$(date +%s)
elapsed() { echo "$(($(date +%s) - t_start)) s"; }

echo "[sanitized] configure $BUILD_DIR (SOCLLM_SANITIZE=$SANITIZE)"
cmake -S . -B "$BUILD_DIR" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER="$CXX" \
  -DSOCLLM_SANITIZE="$SANITIZE" \
  -DSOCLLM_NATIVE="${SOCLLM_NATIVE:-ON}" \
  -DPython_EXECUTABLE="$PY" \
  -Dpybind11_DIR="$("$PY" -m pybind11 --cmakedir)" >/dev/null
echo "[sanitized] build (-j${JOBS:-2})"
cmake --build "$BUILD_DIR" -j "${JOBS:-2}"
echo "[sanitized] built after $(elapsed)"

# Python leaks by design (interned objects, caches): no leak check in Python processes. The C++
# tests get LeakSanitizer. A report aborts (abort_on_error) so the exit status says it.
# No use-after-return checks (ASan's fake stack): GCC 12's ASan places a 64-byte-aligned local
# 32 bytes off alignment in a fake-stack frame, and -march=native on an AVX-512 CPU makes such
# locals (any 64-byte aggregate, the AMX tile buffers) and aligned zmm loads of them. On Zen 4 a
# test's initializer list faulted in `vmovdqa64` that way; on the real stack it is aligned.
asan_common="abort_on_error=1:halt_on_error=1:detect_stack_use_after_return=0:strict_string_checks=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"

echo "[sanitized] ctest"
ASAN_OPTIONS="$asan_common:detect_leaks=1" \
  ctest --test-dir "$BUILD_DIR" --output-on-failure -j "${JOBS:-2}"
echo "[sanitized] ctest passed after $(elapsed)"

# The sanitized module is imported from an overlay: a copy of python/socllm with the sanitized
# _core*.so in it, first on PYTHONPATH. The editable install's import hook (site-packages/
# _editable_skbc_socllm.py, a sys.meta_path finder ahead of PYTHONPATH) would still map socllm to
# python/socllm and socllm._core to the installed module; it steps aside for the build directory
# named in SKBUILD_EDITABLE_SKIP (its switch for builds that import the package).
overlay=$(mktemp -d "${TMPDIR:-/tmp}/socllm-sanitized.XXXXXX")
trap 'rm -rf "$overlay"' EXIT
cp -r python/socllm "$overlay/socllm"
find "$overlay" \( -name __pycache__ -o -name '_core*.so' \) -prune -exec rm -rf {} +
core_so=$(find "$BUILD_DIR/cpp" -maxdepth 1 -name '_core*.so' | head -n1)
[ -n "$core_so" ] || { echo "[sanitized] no _core*.so in $BUILD_DIR/cpp" >&2; exit 1; }
cp "$core_so" "$overlay/socllm/"
editable_build=$("$PY" -c "import sys; print(next((f.path for f in sys.meta_path if type(f).__name__ == 'ScikitBuildRedirectingFinder' and f.path), ''))")

libasan=$("$CXX" -print-file-name=libasan.so)
[ -f "$libasan" ] || { echo "[sanitized] $CXX has no libasan.so" >&2; exit 1; }
# libstdc++ is preloaded too: Python does not link it, and ASan resolves its __cxa_throw
# interceptor at start-up, so without it the first C++ exception aborts ("CHECK failed:
# real___cxa_throw").
libstdcxx=$("$CXX" -print-file-name=libstdc++.so)
run_py() {
  LD_PRELOAD="$libasan:$libstdcxx" \
    ASAN_OPTIONS="$asan_common:detect_leaks=0" \
    SKBUILD_EDITABLE_SKIP="$editable_build" \
    PYTHONPATH="$overlay${PYTHONPATH:+:$PYTHONPATH}" \
    SOCLLM_EXPECT_CORE="$overlay/socllm/$(basename "$core_so")" \
    "$PY" "$@"
}

echo "[sanitized] Python smoke run"
run_py scripts/sanitized_smoke.py --expect-module "$overlay/socllm/$(basename "$core_so")" "$@"
echo "[sanitized] smoke passed after $(elapsed)"

echo "[sanitized] fuzz tests (corpus and short campaigns) and the hardening and loader tests"
run_py -m pytest -q -p no:cacheprovider tests/python/test_fuzz.py tests/python/test_hardening.py \
  tests/python/test_errors.py
echo "[sanitized] all passed after $(elapsed)"

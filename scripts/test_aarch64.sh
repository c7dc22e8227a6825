#!/usr/bin/env bash
# The C++ core on AArch64: cross-compiles the ctest suite (socllm_tests) with Debian's cross
# toolchain and runs it under qemu-user once per emulated CPU, so that run-time detection takes
# every Arm path of the exact INT8 GEMMs:
#   cortex-a53  Armv8.0: Neon only (no sdot)
#   cortex-a76  Armv8.2: Neon + Dotprod (sdot), no i8mm
#   max         Neon + Dotprod + I8mm (smmla)
# and once more on `max` with SOCLLM_MAX_ISA=dotprod (the cap). Each run asserts the detected
# paths (GemmS8.DetectedPathsAreTheExpectedOnes), and the GEMM tests compare every path with
# the scalar reference bit for bit.
#
# Installs, only what is missing (apt-get; root): the arm64 foreign architecture,
# crossbuild-essential-arm64, qemu-user, and the :arm64 libc, libstdc++, libgomp, OpenBLAS
# (OpenMP build), spdlog (+fmt), GoogleTest, zlib and HDF5 runtime packages; nlohmann-json3-dev
# and libeigen3-dev (headers, any architecture). libhdf5-dev cannot be installed for two
# architectures at once, so its arm64 headers are unpacked (apt-get download, dpkg-deb -x) into
# the build directory. Adding the arm64 architecture may upgrade amd64 libraries (libc6, ...) to
# the archive's current versions, which a :arm64 package of the same source must match.
#
# Usage: bash scripts/test_aarch64.sh [extra gtest arguments, e.g. --gtest_filter=GemmS8.*]
# Environment: SOCLLM_AARCH64_BUILD (build directory, default build/aarch64), JOBS (default 2),
# SOCLLM_AARCH64_CPUS (default "cortex-a53 cortex-a76 max").
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${SOCLLM_AARCH64_BUILD:-$root/build/aarch64}
jobs=${JOBS:-2}
cpus=${SOCLLM_AARCH64_CPUS:-cortex-a53 cortex-a76 max}
start=$SECONDS

# ---- dependencies -------------------------------------------------------------------------
packages=(crossbuild-essential-arm64 qemu-user libc6:arm64 libstdc++6:arm64 libgomp1:arm64
  libopenblas-openmp-dev:arm64 libspdlog-dev:arm64 libgtest-dev:arm64 zlib1g-dev:arm64
  libhdf5-103-1:arm64 nlohmann-json3-dev libeigen3-dev)
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
missing=()
for p in "${packages[@]}"; do installed "$p" || missing+=("$p"); done
if ((${#missing[@]})); then
  echo "test_aarch64: installing ${missing[*]}"
  dpkg --print-foreign-architectures | grep -qx arm64 || dpkg --add-architecture arm64
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
for tool in cmake ninja; do
  command -v "$tool" >/dev/null || python3 -m pip install -q "$tool"
done

deps=$build/deps
hdf5_root=$deps/hdf5  # include/ (arm64 headers) and lib/libhdf5.so (the :arm64 runtime library)
if [[ ! -e $hdf5_root/include/hdf5.h ]]; then
  mkdir -p "$deps/debs" "$hdf5_root/lib"
  (cd "$deps/debs" && rm -f libhdf5-dev_*_arm64.deb &&
    { apt-get download -qq -o APT::Sandbox::User=root libhdf5-dev:arm64 ||
      { apt-get update -qq && apt-get download -qq -o APT::Sandbox::User=root libhdf5-dev:arm64; }; })
  dpkg-deb -x "$deps"/debs/libhdf5-dev_*_arm64.deb "$deps/root"
  ln -sfn "$deps/root/usr/include/hdf5/serial" "$hdf5_root/include"
fi
ln -sf "$(readlink -f /usr/lib/aarch64-linux-gnu/libhdf5_serial.so.103)" "$hdf5_root/lib/libhdf5.so"

# ---- cross build --------------------------------------------------------------------------
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_TOOLCHAIN_FILE="$root/cmake/aarch64-linux-gnu.cmake" \
  -DSOCLLM_BUILD_PYTHON=OFF -DSOCLLM_BUILD_TESTS=ON -DSOCLLM_NATIVE=OFF \
  -DHDF5_ROOT="$hdf5_root" >"$build.cmake.log" 2>&1 || { cat "$build.cmake.log"; exit 1; }
ninja -C "$build" -j "$jobs" socllm_tests
built=$SECONDS
echo "test_aarch64: cross build took $((built - start)) s"

# ---- tests under qemu-user ----------------------------------------------------------------
# The multiarch libc6:arm64, not the cross toolchain's /usr/aarch64-linux-gnu copy, under which
# the first pthread_create (OpenMP's workers) hangs in qemu-user 7.2 (cmake/aarch64-linux-gnu.cmake).
export QEMU_LD_PREFIX=/
export SOCLLM_DEVICE_DIR=$root/python/socllm/devices
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
expected_isas() {
  case $1 in
    cortex-a53 | cortex-a57 | cortex-a72) echo scalar,neon ;;
    cortex-a76 | neoverse-n1) echo scalar,neon,dotprod ;;
    max) echo scalar,neon,dotprod,i8mm ;;
    *) echo "" ;;
  esac
}
passed=0 failed=0
run() {  # run NAME CPU [VAR=VALUE ...] -- [gtest arguments]
  local name=$1 cpu=$2 t0=$SECONDS
  shift 2
  local vars=()
  while [[ $1 != -- ]]; do vars+=("$1"); shift; done
  shift
  echo "test_aarch64: === $name (qemu-aarch64 -cpu $cpu) ==="
  if env "${vars[@]}" QEMU_CPU="$cpu" SOCLLM_EXPECT_ISAS="$(expected_isas "$cpu")" \
    qemu-aarch64 "$build/cpp/socllm_tests" --gtest_brief=1 "$@"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
  fi
  echo "test_aarch64: $name took $((SECONDS - t0)) s"
}
for cpu in $cpus; do run "$cpu" "$cpu" -- "$@"; done
run "max, SOCLLM_MAX_ISA=dotprod" max SOCLLM_MAX_ISA=dotprod SOCLLM_EXPECT_BEST_ISA=dotprod -- \
  --gtest_filter='GemmS8.*:GemmGroupedS8.*' "$@"

echo "test_aarch64: $((SECONDS - start)) s in all (build $((built - start)) s)"
echo "aarch64: $passed passed, $failed failed"
((failed == 0))

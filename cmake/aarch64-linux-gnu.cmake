# Cross build for AArch64 Linux on a Debian host: Debian's cross compiler
# (crossbuild-essential-arm64) and the :arm64 multiarch libraries in /usr/lib/aarch64-linux-gnu.
# Binaries run under qemu-user, which is also how CMake runs them at build time (gtest's test
# discovery) and under ctest. Used by scripts/test_aarch64.sh.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

# Run with the multiarch libc6:arm64 (/lib/ld-linux-aarch64.so.1), not the cross toolchain's own
# copy under /usr/aarch64-linux-gnu: with that one (libc6-arm64-cross 2.36-8cross1) the first
# pthread_create spins forever under qemu-user 7.2, so any OpenMP region hangs.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /)

# pkg-config (OpenBLAS) must see the arm64 .pc files only, never the host's.
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")

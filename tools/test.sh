#!/usr/bin/env bash
# Installs what is missing, builds everything and runs every test; exits non-zero if any step fails.
#   MT_BUILD_DIR   build folder (default: build)
#   MT_CMAKE_ARGS  extra configure arguments, e.g. "-DCMAKE_CUDA_ARCHITECTURES=89"
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
start=$SECONDS
report_failure() {
  local rc=$?
  if ((rc)); then echo "test.sh: FAILED (exit $rc) after $((SECONDS - start)) s"; fi
}
trap report_failure EXIT

tools/setup.sh
build="${MT_BUILD_DIR:-build}"
jobs="$(nproc)"

# Ninja only for a fresh build folder: CMake refuses to switch generators in an existing one.
generator=()
if [[ ! -f "$build/CMakeCache.txt" ]] && command -v ninja >/dev/null; then generator=(-G Ninja); fi
# MT_CMAKE_ARGS is split on whitespace on purpose: it carries several -D flags.
read -r -a extra <<<"${MT_CMAKE_ARGS:-}"

# C++ through ccache where it is installed. Most translation units preprocess to the same text
# with and without CUDA (only the op dispatchers test MT_WITH_CUDA), so a CPU-only build after a
# CUDA one (.ci/run) compiles little. The cache ignores the build folder's name (NOHASHDIR),
# which -g would otherwise put in every hash; it is then only wrong in those objects' debug info.
launcher=()
cache_dir="$(command -v ccache >/dev/null && ccache --get-config cache_dir 2>/dev/null || true)"
if [[ -n "$cache_dir" ]] && mkdir -p "$cache_dir" 2>/dev/null && [[ -w "$cache_dir" ]]; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-true}"
fi

# The portable build (no -march=native), said explicitly: tools/demo.sh may have configured the
# same folder for this machine's instruction set. MT_CMAKE_ARGS can still turn it on.
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMT_CPU_NATIVE=OFF "${launcher[@]}" \
  "${extra[@]}"
cmake --build "$build" -j"$jobs"
# OpenMP threads sleep when idle: ctest runs several test programs at once on few cores.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
# A run that finds no test is a broken test registration, not a pass.
ctest --test-dir "$build" --output-on-failure --no-tests=error -j"$jobs"

echo "test.sh: done in $((SECONDS - start)) s"

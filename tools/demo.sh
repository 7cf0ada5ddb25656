#!/usr/bin/env bash
# Installs what is missing, builds the demo targets and runs the main job, on the GPU if there is one.
# Extra arguments go to the job, e.g. `tools/demo.sh --steps 200`.
#   MT_BUILD_DIR   build folder (default: build)
#   MT_CMAKE_ARGS  extra configure arguments
#   DEMO_TARGETS   targets to build (default: mlp)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
start=$SECONDS

tools/setup.sh
build="${MT_BUILD_DIR:-build}"
targets="${DEMO_TARGETS:-mlp}"

generator=()  # Ninja only for a fresh build folder (see tools/test.sh)
if [[ ! -f "$build/CMakeCache.txt" ]] && command -v ninja >/dev/null; then generator=(-G Ninja); fi
read -r -a extra <<<"${MT_CMAKE_ARGS:-}"
read -r -a target_list <<<"$targets"

cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo "${extra[@]}"
cmake --build "$build" -j"$(nproc)" --target "${target_list[@]}"

device=cpu
if nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then device=cuda; fi
echo "demo.sh: running $build/examples/mlp on $device"
"$build/examples/mlp" --device "$device" "$@"

echo "demo.sh: done in $((SECONDS - start)) s"

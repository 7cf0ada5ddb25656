#!/usr/bin/env bash
# Installs what the build needs and is missing; safe to run again and again.
#   MT_SETUP_SKIP=1               do nothing (you manage the dependencies yourself)
#   MT_CUDNN_FRONTEND_VERSION=X   cudnn-frontend release to fetch (default below)
# Never fails for want of a network: when everything needed is already there it just says so,
# and when something cannot be installed it warns and goes on (the build then reports what it lacks).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ "${MT_SETUP_SKIP:-0}" == 1 ]]; then
  echo "setup: skipped (MT_SETUP_SKIP=1)"
  exit 0
fi

# --- Debian/Ubuntu packages -------------------------------------------------------------------
# build-essential brings g++; googletest brings the sources that libgtest-dev's CMake config uses.
# clang builds the fuzz targets (tools/fuzz.sh): libclang-rt-dev holds libFuzzer and the sanitizer
# runtimes (only recommended by clang, and recommends are not installed), libomp-dev is OpenMP for clang.
# ccache lets tools/test.sh's second configuration reuse the first one's C++ objects (see there).
# libprotobuf-dev and protobuf-compiler: TensorBoard event files (train/tensorboard.h; optional, the
# build says when they are missing); python3-venv: .ci/run's venv with TensorBoard for checking them.
# python3-matplotlib (Debian's package) draws tools/plot_metrics.py's plots of the metrics files.
# libpcre2-dev, libsentencepiece-dev, libutf8proc-dev: the tokenizers' pattern engine, SentencePiece models
# and Unicode normalization (tokenizers/; each optional, the build says which are missing).
packages=(build-essential cmake ninja-build pkg-config libeigen3-dev libcli11-dev nlohmann-json3-dev
          libgtest-dev googletest libopenmpi-dev openmpi-bin clang-format clang libclang-rt-dev libomp-dev ccache
          libprotobuf-dev protobuf-compiler python3-venv python3-matplotlib
          libpcre2-dev libsentencepiece-dev libutf8proc-dev)

install_packages() {
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]} == 0)); then
    echo "setup: packages present"
    return
  fi

  local sudo=()
  if ((EUID != 0)); then
    if ! command -v sudo >/dev/null; then
      echo "setup: WARNING: not root and no sudo; cannot install: ${missing[*]}"
      return
    fi
    sudo=(sudo)
  fi
  if ! command -v apt-get >/dev/null; then
    echo "setup: WARNING: no apt-get; install these yourself: ${missing[*]}"
    return
  fi

  echo "setup: installing ${missing[*]}"
  # Quiet on success; on failure (typically no network) show apt's last words and go on.
  local log
  log=$(mktemp)
  if "${sudo[@]}" apt-get update >"$log" 2>&1 &&
     "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
       apt-get install -y --no-install-recommends "${missing[@]}" >>"$log" 2>&1; then
    echo "setup: packages installed"
  else
    tail -n 5 "$log" | sed 's/^/setup:   /'
    echo "setup: WARNING: could not install: ${missing[*]} (no network?); continuing without them"
  fi
  rm -f "$log"
}

# --- cudnn-frontend headers (CUDA builds only) --------------------------------------------------
# cuDNN's fused attention is reached through NVIDIA's header-only cudnn-frontend. PyPI publishes it
# only as wheels (no sdist), but every wheel carries the same C++ headers in a top-level include/
# folder, so we fetch one wheel for a fixed tag (the headers do not depend on it) and keep include/.
# The folder is git-ignored; tools/device_check.sh expects it to be carried to the GPU machine.
cfe_version="${MT_CUDNN_FRONTEND_VERSION:-1.32.0}"
cfe_dir=third_party/cudnn-frontend

fetch_cudnn_frontend() {
  if ! command -v nvcc >/dev/null && [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
    echo "setup: no CUDA compiler; cudnn-frontend not needed"
    return
  fi
  if [[ -f "$cfe_dir/include/cudnn_frontend.h" ]]; then
    echo "setup: cudnn-frontend headers present in $cfe_dir/include ($(cfe_installed_version))"
    return
  fi
  if ! python3 -m pip --version >/dev/null 2>&1; then
    echo "setup: WARNING: no python3 pip to fetch cudnn-frontend; the cuDNN frontend path will be disabled"
    return
  fi

  mkdir -p third_party
  local tmp
  tmp=$(mktemp -d third_party/.cudnn-frontend.XXXXXX)
  # Short timeout and few retries: on a machine without network this must fail fast, not hang.
  if python3 -m pip download --quiet --no-deps --only-binary :all: \
       --platform manylinux_2_28_x86_64 --python-version 3.12 --implementation cp --abi cp312 \
       --timeout 30 --retries 1 -d "$tmp" "nvidia-cudnn-frontend==$cfe_version" >"$tmp/pip.log" 2>&1 &&
     python3 - "$tmp" <<'EOF'
import glob, sys, zipfile
tmp = sys.argv[1]
with zipfile.ZipFile(glob.glob(tmp + "/*.whl")[0]) as whl:
    headers = [m for m in whl.infolist() if m.filename.startswith("include/") and not m.is_dir()]
    if not any(m.filename == "include/cudnn_frontend.h" for m in headers):
        sys.exit("no include/cudnn_frontend.h in the wheel")
    whl.extractall(tmp + "/pkg", members=headers)
EOF
  then
    # Rename into place in one step, so an interrupted run never leaves half a header tree.
    mkdir -p "$cfe_dir"
    rm -rf "$cfe_dir/include"
    mv "$tmp/pkg/include" "$cfe_dir/include"
    echo "setup: cudnn-frontend headers in $cfe_dir/include ($(cfe_installed_version))"
  else
    tail -n 3 "$tmp/pip.log" 2>/dev/null | sed 's/^/setup:   /'
    echo "setup: WARNING: could not fetch cudnn-frontend $cfe_version; the cuDNN frontend path will be disabled"
  fi
  rm -rf "$tmp"
}

cfe_installed_version() {
  local h="$cfe_dir/include/cudnn_frontend_version.h"
  [[ -f "$h" ]] || { echo "version unknown"; return; }
  awk '/define CUDNN_FRONTEND_(MAJOR|MINOR|PATCH)_VERSION /{v = v (v ? "." : "") $3} END{print "version " v}' "$h"
}

if command -v dpkg-query >/dev/null; then
  install_packages
else
  echo "setup: WARNING: not a Debian/Ubuntu system; make sure these are installed: ${packages[*]}"
fi
fetch_cudnn_frontend

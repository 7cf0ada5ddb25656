#!/usr/bin/env bash
# Runs the given command only where a GPU is visible (at least MT_NEED_GPUS of them, default 1);
# otherwise exits 77, which ctest reports as skipped (SKIP_RETURN_CODE), with the reason.
need="${MT_NEED_GPUS:-1}"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "skipped: no CUDA device visible on this machine"
  exit 77
fi
have=$(nvidia-smi -L | grep -c '^GPU ')
if ((have < need)); then
  echo "skipped: $have CUDA device(s) visible, this test needs $need"
  exit 77
fi
exec "$@"

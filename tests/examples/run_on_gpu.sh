#!/usr/bin/env bash
# Runs the given command only where a GPU is visible; otherwise exits 77, which
# ctest reports as skipped (SKIP_RETURN_CODE), with the reason.
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "skipped: no CUDA device visible on this machine"
  exit 77
fi
exec "$@"

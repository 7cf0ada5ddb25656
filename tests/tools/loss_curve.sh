#!/usr/bin/env bash
# tools/parity/loss_curve.py on the CPU in f32 where the python (MT_PYTHON, default python3) has
# torch and transformers; skipped (77) elsewhere.
#   loss_curve.sh <train_steps> <workdir> [loss_curve.py flags: the model and its size]
set -euo pipefail
python=${MT_PYTHON:-python3}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if ! "$python" -c "import torch, transformers, safetensors" 2>/dev/null; then
  echo "loss_curve: $python lacks torch, transformers or safetensors; skipped"
  exit 77
fi
exec "$python" "$here/tools/parity/loss_curve.py" --bin "$1" --workdir "$2" --device cpu --amp off "${@:3}"

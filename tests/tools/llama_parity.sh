#!/usr/bin/env bash
# tools/parity/llama_parity.py where the python (MT_PYTHON, default python3) has torch and
# transformers; skipped (77) elsewhere.
#   llama_parity.sh <llama_logits> <devices>
set -euo pipefail
python=${MT_PYTHON:-python3}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if ! "$python" -c "import torch, transformers, safetensors" 2>/dev/null; then
  echo "llama_parity: $python lacks torch, transformers or safetensors; skipped"
  exit 77
fi
exec "$python" "$here/tools/parity/llama_parity.py" --bin "$1" --devices "$2"

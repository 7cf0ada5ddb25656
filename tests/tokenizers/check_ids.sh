#!/usr/bin/env bash
# Our ids on the fixture cases against Hugging Face's tokenizers and SentencePiece run now, from
# the committed fixture files (tests/fixtures/tokenizers/check_ids.py). Skipped (77) where the
# python (MT_PYTHON, default python3) lacks tokenizers or sentencepiece, or mixtrain was built
# without PCRE2 or SentencePiece.
#   check_ids.sh <tokenize_cases> <fixture dir> <work dir>
set -euo pipefail
program=$1 fixtures=$2 work=$3
python=${MT_PYTHON:-python3}
mkdir -p "$work"
if ! "$program" "$fixtures" >"$work/ours.jsonl" 2>"$work/errors.txt"; then
  cat "$work/errors.txt"
  grep -q "has no PCRE2\|has no SentencePiece" "$work/errors.txt" && { echo "check_ids: skipped"; exit 77; }
  exit 1
fi
exec "$python" "$fixtures/check_ids.py" --fixtures "$fixtures" --ours "$work/ours.jsonl" --require-all

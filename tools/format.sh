#!/usr/bin/env bash
# Formats the C++/CUDA sources with the repository's .clang-format.
#   tools/format.sh          reformat in place
#   tools/format.sh --check  change nothing; exit 1 listing the files that need formatting
# Exits 77 when clang-format is missing, so a ctest that runs the check can mark itself skipped.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

check=0
case "${1:-}" in
  "") ;;
  --check) check=1 ;;
  *) echo "usage: tools/format.sh [--check]" >&2; exit 2 ;;
esac

if ! command -v clang-format >/dev/null; then
  echo "format.sh: clang-format is not installed (tools/setup.sh installs it); skipping"
  exit 77
fi

# Tracked and untracked-but-not-ignored sources; skip tracked files deleted from the work tree.
files=()
while IFS= read -r f; do
  [[ -f "$f" ]] && files+=("$f")
done < <(git ls-files -co --exclude-standard -- '*.h' '*.cpp' '*.cu' '*.cuh' | sort -u)
((${#files[@]})) || { echo "format.sh: no sources"; exit 0; }

if ((!check)); then
  clang-format -i "${files[@]}"
  echo "format.sh: formatted ${#files[@]} files"
  exit 0
fi

bad=()
for f in "${files[@]}"; do
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "format.sh: ${#bad[@]} of ${#files[@]} files need tools/format.sh:"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
echo "format.sh: ${#files[@]} files formatted correctly ($(clang-format --version | grep -o 'version [0-9.]*'))"

#!/usr/bin/env bash
# Formats the C++ sources with the checked-in .clang-format; --check only reports.
set -euo pipefail
cd "$(dirname "$0")/.."
tool=$(command -v clang-format-14 || command -v clang-format || true)
if [ -z "$tool" ]; then
  echo "format.sh: clang-format not found (scripts/install-deps.sh installs it)" >&2
  exit 1
fi
mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh')
[ ${#files[@]} -eq 0 ] && exit 0
if [ "${1:-}" = "--check" ]; then
  "$tool" --dry-run --Werror "${files[@]}"
  echo "format: ${#files[@]} files are formatted"
else
  "$tool" -i "${files[@]}"
fi

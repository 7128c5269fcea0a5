#!/usr/bin/env bash
# format.sh — clang-format the tree's C sources with the root .clang-format.
#
#   bash scripts/format.sh            rewrite every tracked *.c / *.h in place
#   bash scripts/format.sh --check    change nothing; list the files that
#                                     differ and exit 1 if there are any
#   bash scripts/format.sh [--check] FILE...   only these files
#
# CLANG_FORMAT names the binary (default clang-format; the configuration is
# written for version 14, Debian 12's).
set -euo pipefail
cd "$(dirname "$0")/.."
CF=${CLANG_FORMAT:-clang-format}
check=0
if [ "${1:-}" = "--check" ]; then
    check=1
    shift
fi
command -v "$CF" >/dev/null || { echo "format.sh: $CF not found (scripts/setup.sh installs it)" >&2; exit 2; }

if [ $# -gt 0 ]; then
    files=("$@")
else
    mapfile -t files < <(git ls-files '*.c' '*.h')
fi
# no files (not a git checkout): say so rather than read stdin or pass unchecked
[ ${#files[@]} -gt 0 ] || { echo "format.sh: no C files to check (run it in a git checkout or name files)" >&2; exit 2; }

if [ $check = 0 ]; then
    "$CF" -i --style=file "${files[@]}"
    exit 0
fi
bad=0
for f in "${files[@]}"; do
    if ! "$CF" --style=file --dry-run --Werror "$f" >/dev/null 2>&1; then
        echo "$f"
        bad=$((bad + 1))
    fi
done
if [ $bad -gt 0 ]; then
    echo "format.sh: $bad file(s) differ from .clang-format (bash scripts/format.sh to fix)" >&2
    exit 1
fi

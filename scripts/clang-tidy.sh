#!/usr/bin/env bash
# Runs clang-tidy (the checks of .clang-tidy) over our .cc files, two at a
# time, with the compile_commands.json of a configured and built tree
# (CMAKE_EXPORT_COMPILE_COMMANDS; generated headers such as the protobuf
# ones must exist). Fails on any finding (.clang-tidy: WarningsAsErrors).
#
#   bash scripts/clang-tidy.sh BUILD_DIR                  # every .cc file
#   bash scripts/clang-tidy.sh BUILD_DIR server client    # those folders
#   bash scripts/clang-tidy.sh BUILD_DIR server/postgres/pg_pool.cc
#
# Our files are those git tracks (no generated code, no build trees) that
# the tree compiles: fuzz/ is only in an IDEM_FUZZ tree, and the files a
# tree does not compile are named and skipped. CLANG_TIDY picks the binary
# (default clang-tidy-14, else clang-tidy); IDEM_TIDY_JOBS the parallelism
# (default 2).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if (($# < 1)) || [[ ! -f "$1/compile_commands.json" ]]; then
  echo "usage: bash scripts/clang-tidy.sh BUILD_DIR [PATH...]" >&2
  echo "BUILD_DIR must hold compile_commands.json (configure it with cmake)" >&2
  exit 2
fi
build="$(cd "$1" && pwd)"
shift

tidy="${CLANG_TIDY:-}"
if [[ -z "$tidy" ]]; then
  if command -v clang-tidy-14 >/dev/null; then
    tidy=clang-tidy-14
  elif command -v clang-tidy >/dev/null; then
    tidy=clang-tidy
  else
    echo "clang-tidy not found: apt-get install clang-tidy-14" >&2
    exit 1
  fi
fi

# Tracked .cc files under the given paths (default: all of them).
mapfile -t tracked < <(git -C "$root" ls-files -- "${@:-.}" |
  grep -E '\.cc$' | grep -vE '(^|/)build[^/]*/' || true)
if ((${#tracked[@]} == 0)); then
  echo "no .cc files under: ${*:-.}" >&2
  exit 2
fi
# Of them, those the tree compiles.
mapfile -t compiled < <(python3 - "$build/compile_commands.json" <<'PY'
import json, os, sys
for entry in json.load(open(sys.argv[1])):
    print(os.path.realpath(os.path.join(entry["directory"], entry["file"])))
PY
)
declare -A in_tree=()
for f in "${compiled[@]}"; do in_tree["$f"]=1; done
files=()
skipped=()
for f in "${tracked[@]}"; do
  if [[ -n "${in_tree["$root/$f"]:-}" ]]; then
    files+=("$root/$f")
  else
    skipped+=("$f")
  fi
done
if ((${#skipped[@]})); then
  echo "not compiled in $build, skipped: ${skipped[*]}"
fi
if ((${#files[@]} == 0)); then
  echo "nothing to check" >&2
  exit 2
fi

echo "$tidy: ${#files[@]} files"
# Headers: only ours (not the generated ones under the build tree, nor
# anything installed).
header_filter="^$root/(server|client|common|statemachine|bench|tests|tsan|fuzz)/"
status=0
printf '%s\0' "${files[@]}" |
  xargs -0 -n1 -P"${IDEM_TIDY_JOBS:-2}" "$tidy" -p "$build" --quiet \
    "--header-filter=$header_filter" || status=$?
if ((status != 0)); then
  echo "clang-tidy found problems (or could not run): see above" >&2
  exit 1
fi
echo "clang-tidy: no findings"

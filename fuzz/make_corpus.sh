#!/usr/bin/env bash
# Regenerates the seed corpora fuzz/corpus/<fuzzer>/ from
# fuzz/make_seeds_main.cc (regressions/ is left alone). Needs a fuzz tree:
#   bash fuzz/make_corpus.sh [BUILD_DIR]     # default build-fuzz
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build-fuzz}"
cmake --build "$build" --target idem_fuzz_seeds
for dir in "$root"/fuzz/corpus/*; do
  [[ "$(basename "$dir")" == regressions ]] || rm -rf "$dir"
done
ASAN_OPTIONS=detect_leaks=1 "$build/fuzz/idem_fuzz_seeds" "$root/fuzz/corpus"
for dir in "$root"/fuzz/corpus/*_fuzzer; do
  echo "$(basename "$dir"): $(find "$dir" -type f | wc -l) seeds"
done

#!/usr/bin/env bash
# Self-test of scripts/commit-msg (CTest: commit_msg_test): feeds it good and
# bad messages and checks its exit codes.
set -euo pipefail

hook="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/commit-msg"
tmp="$(mktemp -d /tmp/commit-msg-test.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

failures=0
n=0
# check WANT DESCRIPTION MESSAGE: runs the hook on MESSAGE (written as is;
# pass real newlines) and compares its exit code with WANT.
check() {
  local want="$1" what="$2" msg="$3" got=0
  n=$((n + 1))
  printf '%s' "$msg" >"$tmp/msg"
  bash "$hook" "$tmp/msg" >/dev/null 2>&1 || got=$?
  if [[ "$got" != "$want" ]]; then
    echo "FAIL: $what: exit $got, want $want"
    failures=$((failures + 1))
  else
    echo "ok: $what"
  fi
}

long72="$(printf 'A%.0s' {1..72})"
long73="$(printf 'A%.0s' {1..73})"

check 0 "subject and body" $'Add a retry limit\n\nCallers spun forever when the store was down.\n'
check 0 "subject only" $'Add a retry limit\n'
check 0 "subject without a newline" 'Add a retry limit'
check 0 "72 characters" "$long72"$'\n'
check 0 "72 characters, not bytes" "Explain é$(printf 'x%.0s' {1..63})"$'\n'
check 0 "comments are ignored" $'# Please enter the commit message\nFix the reaper\n# a comment\n\nWhy.\n'
check 0 "leading blank lines" $'\n\nFix the reaper\n\nWhy.\n'
check 0 "below the scissors" $'Fix the reaper\n\nWhy.\n# ------------------------ >8 ------------------------\ndiff --git a/x b/x.\n'
check 0 "merge" "Merge branch 'standalone-docs' into main with a very long subject line that git wrote"$'\n'
check 0 "revert" "Revert \"$long72\""$'\n\nThis reverts commit abc.\n'
check 0 "fixup" "fixup! $long72"$'\n'
check 0 "squash" $'squash! Fix the reaper\n'
check 1 "73 characters" "$long73"$'\n'
check 1 "empty" ''
check 1 "blank lines only" $'\n\n  \n'
check 1 "comments only" $'# Please enter the commit message\n#\n'
check 1 "final period" $'Fix the reaper.\n\nWhy.\n'
check 1 "text on line 2" $'Fix the reaper\nbecause it spun\n'
check 1 "text on line 2 after a comment" $'Fix the reaper\n# c\nbecause it spun\n'
# A missing file is a usage error (exit 2), not a bad message.
n=$((n + 1))
got=0
bash "$hook" "$tmp/does-not-exist" >/dev/null 2>&1 || got=$?
if [[ "$got" != 2 ]]; then
  echo "FAIL: missing file: exit $got, want 2"
  failures=$((failures + 1))
else
  echo "ok: missing file"
fi

echo "$n checks, $failures failed"
[[ "$failures" -eq 0 ]]

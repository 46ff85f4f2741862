#!/usr/bin/env bash
# Runs browser_test.js (the operator console in Debian's chromium), after
# installing the locked npm packages of this folder when they are not yet.
# tests/console_pgtest.cc starts the sidecar and sets the environment.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=examples/npm-install.sh
source "$here/../../examples/npm-install.sh"
idem_npm_install "$here"
exec node "$here/browser_test.js"

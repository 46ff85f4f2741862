#!/usr/bin/env bash
# Runs the Node walkthrough against a sidecar: examples/node/run.sh HOST:PORT
#
# Needs node (18 or later) and npm (Debian packages nodejs and npm). Installs
# the locked dependencies into examples/node/node_modules with `npm ci` unless
# they are already installed from the same package-lock.json.
set -euo pipefail

if (($# != 1)); then
  echo "usage: $0 HOST:PORT" >&2
  exit 2
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=examples/npm-install.sh
source "$here/../npm-install.sh"
idem_npm_install "$here"
exec node "$here/walkthrough.js" "$1"

#!/usr/bin/env bash
# These checks are done by hand-written code because no Debian 12 package
# can do them (the top of validate.js and render.js says why).
#
# Installs the validator's npm packages (npm ci, from package-lock.json) and
# runs it on deploy/k8s/shared, pod-sidecar and pod-gateway, then its self-test
# (broken copies of the layouts must be rejected).
#
#   bash deploy/k8s/validate/run.sh [--sidecar BIN] [--idemctl BIN] [LAYOUT_DIR...]
#
# Arguments go to validate.js (see its header). IDEM_VALIDATE_WORKDIR: where
# node_modules is installed (default: this directory; CTest uses the build
# tree). Fails, never skips, when node, npm or the packages are missing.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
workdir="${IDEM_VALIDATE_WORKDIR:-$here}"

die() { echo "deploy/k8s/validate/run.sh: $*" >&2; exit 1; }

command -v node >/dev/null 2>&1 ||
  die "node not found: install Node.js 18 or newer (Debian: apt-get install nodejs npm)"
command -v npm >/dev/null 2>&1 ||
  die "npm not found: install it (Debian: apt-get install npm)"
node_major="$(node -p 'process.versions.node.split(".")[0]')"
((node_major >= 18)) || die "node $(node --version) is too old: need 18 or newer"

mkdir -p "$workdir"
if [[ "$workdir" != "$here" ]]; then
  cp "$here/package.json" "$here/package-lock.json" "$workdir/"
fi
# npm ci from the lock file, unless node_modules was installed from this very
# lock file already (npm records it as node_modules/.package-lock.json).
stamp="$workdir/node_modules/.idem-lock.sha256"
want="$(sha256sum "$here/package-lock.json" | cut -d' ' -f1)"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  echo "== npm ci in $workdir"
  (cd "$workdir" && npm ci --no-audit --no-fund --prefer-offline --loglevel=error) ||
    die "npm ci failed: the validator's packages (package-lock.json) could not be installed from the npm registry"
  echo "$want" >"$stamp"
fi
for pkg in kubernetes-models js-yaml; do
  [[ -f "$workdir/node_modules/$pkg/package.json" ]] ||
    die "npm package $pkg missing from $workdir/node_modules after npm ci"
done

export NODE_PATH="$workdir/node_modules"
echo "== validate"
node "$here/validate.js" "$@"
echo "== selftest"
node "$here/selftest.js"

# shellcheck shell=bash
# Sourced by the Node examples' run.sh scripts.

# idem_npm_install DIR: makes sure DIR/node_modules holds exactly what
# DIR/package-lock.json locks. Runs `npm ci` only when the lock file changed
# since the last install (npm ci deletes node_modules first, which would pull
# the modules from under a running example), holding a lock on the lock file so
# that concurrent run.sh calls install once. Fails with a clear message when
# node or npm is missing.
idem_npm_install() {
  local dir="$1" tool fd
  for tool in node npm; do
    if ! command -v "$tool" >/dev/null; then
      echo "error: $tool not found; install the Debian packages nodejs and npm" >&2
      return 1
    fi
  done
  exec {fd}<"$dir/package-lock.json"
  flock "$fd"
  if ! cmp -s "$dir/package-lock.json" "$dir/node_modules/.idem-installed-lock"; then
    echo "installing npm packages into $dir/node_modules" >&2
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error) >&2
    cp "$dir/package-lock.json" "$dir/node_modules/.idem-installed-lock"
  fi
  exec {fd}<&-
}

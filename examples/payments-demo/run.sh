#!/usr/bin/env bash
# Starts the payments demo: examples/payments-demo/run.sh
#
# Environment: IDEM_ADDR (the sidecar, host:port), DEMO_POSTGRES (libpq
# conninfo of the demo's own database), DEMO_LISTEN (host:port to serve HTTP
# on); optional DEMO_IDEMPOTENCY (sidecar, the default, or off: no
# idempotency code, for running behind the sidecar's HTTP gateway; IDEM_ADDR
# is then unused), DEMO_TENANT, DEMO_LEASE_MS, DEMO_SLOW_MS,
# DEMO_PROBE_LISTEN (serve idempotency.v1.Reconciler there) and DEMO_CRASH
# (see server.js).
# Needs node (18 or later) and npm; installs the locked npm packages of this
# demo and of the Node client in ../node (whose gRPC packages the probe uses
# too) when they are not installed yet.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=examples/npm-install.sh
source "$here/../npm-install.sh"
idem_npm_install "$here/../node"
idem_npm_install "$here"
exec node "$here/server.js"

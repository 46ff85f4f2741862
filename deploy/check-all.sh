#!/usr/bin/env bash
# Every check of deploy/, as CI runs it (CTest test deploy_check):
#   1. deploy/docker/check.sh       the Dockerfile's rules, Debian 12 package
#                                   names, and ldd of the built binaries
#                                   covered by the runtime stage's packages
#   2. deploy/k8s/validate/run.sh   the three kustomize layouts rendered and
#                                   validated against the Kubernetes API
#                                   schemas and the deployment policies,
#                                   checked against the built binaries, and
#                                   the validator's self-test
#
#   bash deploy/check-all.sh SIDECAR_BINARY [IDEMCTL_BINARY]
#
# Runs both even if the first fails; exits 1 if either failed.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

if (($# < 1 || $# > 2)); then
  echo "usage: bash deploy/check-all.sh SIDECAR_BINARY [IDEMCTL_BINARY]" >&2
  exit 2
fi
sidecar="$1"
idemctl="${2:-}"
for bin in "$sidecar" ${idemctl:+"$idemctl"}; do
  if [[ ! -x "$bin" ]]; then
    echo "deploy/check-all.sh: $bin is not an executable (build it first)" >&2
    exit 1
  fi
done

binaries=("$sidecar")
validate_args=(--sidecar "$sidecar")
if [[ -n "$idemctl" ]]; then
  binaries+=("$idemctl")
  validate_args+=(--idemctl "$idemctl")
fi

failed=()
echo "===== deploy/docker/check.sh"
bash "$here/docker/check.sh" "${binaries[@]}" || failed+=("deploy/docker/check.sh")
echo "===== deploy/k8s/validate/run.sh"
bash "$here/k8s/validate/run.sh" "${validate_args[@]}" || failed+=("deploy/k8s/validate/run.sh")

if ((${#failed[@]})); then
  echo "deploy/check-all.sh: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "deploy/check-all.sh: all deploy checks passed"

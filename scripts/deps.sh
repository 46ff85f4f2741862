# shellcheck shell=bash
# The one list of Debian packages the project needs to build, test and run
# locally, `idem_install_deps`, which installs the missing ones, and
# `idem_install_citus DIR`, which installs a Citus build from DIR. Sourced by
# scripts/test.sh, scripts/ci-sanitizers.sh, scripts/run-local.sh and .ci/run.

IDEM_APT_PACKAGES=(
  build-essential cmake pkg-config g++
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libpqxx-dev libhiredis-dev libabsl-dev libgtest-dev libgmock-dev
  libgoogle-perftools-dev
  redis-server postgresql-15
  # The *_bouncer_pgtest entries run through PgBouncer's transaction pooling.
  pgbouncer
  # faults_patroni: three PostgreSQL nodes under Patroni, etcd its store.
  patroni etcd-server
  libyaml-cpp-dev nlohmann-json3-dev libcli11-dev prometheus-cpp-dev
  # The HTTP gateway (server/gateway/): Boost.Beast and Asio, headers only.
  libboost-dev
  # Its tests' client and the gateway benchmark's load (h2load --h1).
  curl nghttp2-client
  # The operator console: Chart.js, embedded in the binary at build time,
  # and the browser its test drives (tests/console/).
  libjs-chart.js chromium
  python3-grpcio clang-format nodejs faketime
  # scripts/ci-sanitizers.sh: clang and libFuzzer with clang's sanitizer
  # runtimes, llvm-symbolizer for readable stacks (g++'s come with g++);
  # clang-tidy for scripts/clang-tidy.sh (its asan step).
  clang-14 libclang-rt-14-dev llvm-14 clang-tidy-14
)

# Prints the packages of IDEM_APT_PACKAGES that are not installed, one a line.
idem_missing_deps() {
  local pkg
  for pkg in "${IDEM_APT_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}\n' "$pkg" 2>/dev/null |
        grep -q '^install ok installed$'; then
      echo "$pkg"
    fi
  done
  # Debian's nodejs has npm separately; NodeSource's nodejs bundles it.
  command -v npm >/dev/null 2>&1 || echo npm
}

# Installs the missing packages with apt-get (root only); does nothing, and
# needs no root, when all are installed.
idem_install_deps() {
  local missing
  mapfile -t missing < <(idem_missing_deps)
  if ((${#missing[@]} == 0)); then
    return 0
  fi
  if [[ "$(id -u)" != 0 ]]; then
    echo "missing packages: ${missing[*]}" >&2
    echo "install them as root: apt-get install ${missing[*]}" >&2
    return 1
  fi
  echo "installing: ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
}

# Citus, for the *_citus_pgtest entries and faults_citus: Debian 12 does not
# package it. `idem_install_citus DIR` installs a build of it for PostgreSQL
# 15 from DIR (a folder holding its install.sh) when DIR has one and Citus is
# not installed yet (root only); otherwise it does nothing (the Citus tests
# then skip, or fail under CI=true). docs/scaling.md says how to build one.
idem_install_citus() {
  local dir="${1:-}"
  if [[ -e /usr/lib/postgresql/15/lib/citus.so || -z "$dir" ||
        ! -f "$dir/install.sh" ]]; then
    return 0
  fi
  if [[ "$(id -u)" != 0 ]]; then
    echo "Citus is not installed: as root, run $dir/install.sh" >&2
    return 0
  fi
  bash "$dir/install.sh"
}

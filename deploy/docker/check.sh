#!/usr/bin/env bash
# Checks deploy/docker/Dockerfile without a Docker engine (hadolint is not in
# Debian 12; this covers the rules that matter for this image).
#
#   bash deploy/docker/check.sh [--dockerfile FILE] [BINARY...]
#
# Rules:
#   - multi-stage: at least two FROM lines; every base image is Debian 12
#     (debian:12.N[-slim], debian:bookworm-YYYYMMDD[-slim], or either major
#     tag pinned by @sha256 digest); no "latest", no untagged image
#   - the final stage runs as a numeric non-root USER, has ENTRYPOINT the
#     sidecar and EXPOSEs 50051, 9464 and 8080; there is no HEALTHCHECK
#   - every `apt-get install` runs with -y and --no-install-recommends, in the
#     same RUN as `apt-get update` and `rm -rf /var/lib/apt/lists/*`
#   - every package installed in any stage exists in Debian 12 (apt-cache
#     show on this Debian 12 host)
#   - for each BINARY (the freshly built idempotency-sidecar, idemctl): every
#     library `ldd` resolves belongs (dpkg -S) to a package that the final
#     stage installs or that those packages depend on, recursively; and every
#     library the binary links directly (readelf NEEDED) belongs to a package
#     the final stage names explicitly
# Exits 0 when all pass; otherwise prints every failure and exits 1.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dockerfile="$here/Dockerfile"
binaries=()
while (($#)); do
  case "$1" in
    --dockerfile) dockerfile="$2"; shift 2 ;;
    -h | --help) sed -n '2,25p' "${BASH_SOURCE[0]}"; exit 0 ;;
    -*) echo "check.sh: unknown option $1" >&2; exit 2 ;;
    *) binaries+=("$1"); shift ;;
  esac
done

failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
ok() { echo "ok:   $*"; }

[[ -r "$dockerfile" ]] || { echo "FAIL: cannot read $dockerfile" >&2; exit 1; }
echo "== checking $dockerfile"

# ---- parse: one instruction per line (continuations joined, comments and
# blank lines dropped), prefixed with its stage index.
instructions="$(awk '
  /^[[:space:]]*#/ { next }
  {
    line = $0
    sub(/[[:space:]]+$/, "", line)
    if (line ~ /\\$/) { sub(/\\$/, "", line); buf = buf line " "; next }
    buf = buf line
    if (buf ~ /^[[:space:]]*$/) { buf = ""; next }
    sub(/^[[:space:]]+/, "", buf)
    gsub(/[[:space:]]+/, " ", buf)
    split(buf, w, " ")
    if (toupper(w[1]) == "FROM") stage++
    print stage "\t" buf
    buf = ""
  }' "$dockerfile")"
stages="$(awk -F'\t' 'END { print $1 + 0 }' <<<"$instructions")"
final_stage="$stages"
instr_of() { # stage|all, keyword -> the instructions' text
  awk -F'\t' -v s="$1" -v k="$2" '
    (s == "all" || $1 == s) {
      split($2, w, " ")
      if (toupper(w[1]) == k) print $2
    }' <<<"$instructions"
}

# ---- stages and base images
if ((stages >= 2)); then
  ok "multi-stage: $stages stages"
else
  fail "not multi-stage: $stages FROM line(s); build and runtime must be separate stages"
fi
stage_names=()
while IFS= read -r from; do
  [[ -n "$from" ]] || continue
  read -r -a w <<<"$from"
  image="" alias=""
  for ((i = 1; i < ${#w[@]}; i++)); do
    [[ "${w[i]}" == --* ]] && continue
    image="${w[i]}"
    if ((i + 2 < ${#w[@]})) && [[ "${w[i+1],,}" == as ]]; then
      alias="${w[i+2]}"
    fi
    break
  done
  earlier_stage=0
  for s in "${stage_names[@]}"; do
    [[ "$image" == "$s" ]] && earlier_stage=1
  done
  [[ -n "$alias" ]] && stage_names+=("$alias")
  if ((earlier_stage)); then
    ok "FROM $image (an earlier stage)"
  elif [[ "$image" == *latest* ]]; then
    fail "FROM $image: 'latest' is not a pinned tag"
  elif [[ "$image" =~ ^debian:(12\.[0-9]+|bookworm-[0-9]{8})(-slim)?(@sha256:[0-9a-f]{64})?$ ]] ||
       [[ "$image" =~ ^debian:(12|bookworm)(-slim)?@sha256:[0-9a-f]{64}$ ]]; then
    ok "FROM $image (Debian 12, pinned)"
  elif [[ "$image" =~ ^debian:(12|bookworm)(-slim)?$ ]]; then
    fail "FROM $image: pin a point release (debian:12.N-slim) or a digest (@sha256:...)"
  else
    fail "FROM $image: the base image must be Debian 12 (debian:12.N[-slim] or debian:bookworm-YYYYMMDD[-slim])"
  fi
done < <(instr_of all FROM)
if grep -Eiq -- '--from=[^ ]*:latest' <<<"$instructions"; then
  fail "a COPY --from uses a 'latest' image"
fi

# ---- final stage: user, entrypoint, ports; no HEALTHCHECK anywhere
last_user="$(instr_of "$final_stage" USER | tail -n 1 | awk '{print $2}')"
uid="${last_user%%:*}"
gid=""
[[ "$last_user" == *:* ]] && gid="${last_user#*:}"
if [[ -z "$last_user" ]]; then
  fail "final stage has no USER: it would run as root"
elif ! [[ "$uid" =~ ^[0-9]+$ ]]; then
  fail "USER $last_user: use a numeric uid so Kubernetes can verify runAsNonRoot"
elif ((uid == 0)) || { [[ -n "$gid" ]] && [[ "$gid" == 0 || "$gid" == root ]]; }; then
  fail "USER $last_user: the final stage must not run as root (uid or gid 0)"
else
  ok "final stage USER $last_user (numeric, non-root)"
fi
if [[ -n "$(instr_of all HEALTHCHECK)" ]]; then
  fail "HEALTHCHECK present: Kubernetes gRPC probes do health checking (deploy/k8s/)"
else
  ok "no HEALTHCHECK"
fi
entrypoint="$(instr_of "$final_stage" ENTRYPOINT | tail -n 1)"
if [[ "$entrypoint" =~ ^ENTRYPOINT\ \[\ *\"[^\"]*/idempotency-sidecar\" ]]; then
  ok "$entrypoint (exec form)"
else
  fail "final stage ENTRYPOINT must be the sidecar in exec form, got: ${entrypoint:-none}"
fi
exposed=" $(instr_of "$final_stage" EXPOSE | cut -d' ' -f2- | tr '\n' ' ') "
for port in 50051 9464 8080; do
  if [[ "$exposed" =~ [[:space:]]$port(/tcp)?[[:space:]] ]]; then
    ok "EXPOSE $port"
  else
    fail "final stage does not EXPOSE $port"
  fi
done

# ---- apt hygiene, and the package lists of each stage
declare -A stage_packages=()
while IFS=$'\t' read -r stage text; do
  read -r -a w <<<"$text"
  [[ "${w[0]^^}" == RUN ]] || continue
  [[ "$text" == *"apt-get install"* || "$text" == *"apt install"* ]] || continue
  [[ "$text" == *"apt install"* ]] && fail "stage $stage: use apt-get, not apt, in scripts"
  [[ "$text" == *"--no-install-recommends"* ]] ||
    fail "stage $stage: apt-get install without --no-install-recommends"
  [[ "$text" =~ apt-get\ install\ ([^&;|]*\ )?(-y|--yes|-[a-z]*y[a-z]*)\  ]] ||
    fail "stage $stage: apt-get install without -y"
  [[ "$text" == *"apt-get update"* ]] ||
    fail "stage $stage: apt-get install without apt-get update in the same RUN (stale lists)"
  [[ "$text" == *"rm -rf /var/lib/apt/lists/*"* ]] ||
    fail "stage $stage: apt lists not removed in the same RUN (rm -rf /var/lib/apt/lists/*)"
  pkgs="$(awk '{
      for (i = 1; i <= NF; i++) if ($i == "install" && $(i-1) == "apt-get") {
        for (j = i + 1; j <= NF; j++) {
          if ($j ~ /^(&&|;|\||\|\|)$/) break
          if ($j !~ /^-/) print $j
        }
      }
    }' <<<"$text")"
  stage_packages[$stage]+="$pkgs"$'\n'
done <<<"$instructions"
if [[ -z "${stage_packages[$final_stage]:-}" ]]; then
  fail "final stage installs no packages (it needs the runtime libraries)"
else
  ok "apt-get hygiene (-y, --no-install-recommends, update and list cleanup in one RUN)"
fi
mapfile -t runtime_pkgs < <(sed '/^$/d' <<<"${stage_packages[$final_stage]:-}" | sort -u)
mapfile -t all_pkgs < <(printf '%s' "${stage_packages[@]}" | sed '/^$/d' | sort -u)
for pkg in "${all_pkgs[@]}"; do
  if [[ "$pkg" =~ [=*] ]]; then
    fail "package '$pkg': name packages plainly (no version pins or globs) so they can be checked"
  fi
done
# -dev packages must never reach the runtime stage.
for pkg in "${runtime_pkgs[@]}"; do
  [[ "$pkg" == *-dev ]] && fail "final stage installs a -dev package: $pkg"
done

# ---- every package exists in Debian 12
# shellcheck source=/dev/null
. /etc/os-release 2>/dev/null || true
if [[ "${ID:-}" != debian || "${VERSION_ID:-}" != 12 ]]; then
  fail "this host is ${PRETTY_NAME:-unknown}, not Debian 12: cannot check package names against Debian 12"
else
  # One apt-cache call (it is slow per call); it prints a stanza for each
  # real package and nothing for unknown or purely virtual names.
  declare -A known=()
  while read -r field name; do
    [[ "$field" == Package: ]] && known[$name]=1
  done < <(apt-cache show --no-all-versions "${all_pkgs[@]}" 2>/dev/null || true)
  missing=()
  for pkg in "${all_pkgs[@]}"; do
    [[ -n "${known[$pkg]:-}" ]] || missing+=("$pkg")
  done
  if ((${#missing[@]})); then
    fail "not (real) packages in this host's Debian 12 lists: ${missing[*]} (if the lists are empty, run apt-get update)"
  else
    ok "all ${#all_pkgs[@]} packages exist in Debian 12 (${#runtime_pkgs[@]} in the final stage)"
  fi
fi

# ---- ldd of the binaries is covered by the final stage's packages
# owner[path] = the package that ships the file, for every library the
# binaries load, asked of dpkg in one call (it is slow per call). Each path is
# also tried in its other /usr-merged spelling and resolved through links.
declare -A owner=()
map_owners() {
  local -a paths=()
  local f real
  for f in "$@"; do
    real="$(readlink -f "$f")"
    paths+=("$f" "$real" "/usr${f#/usr}" "${f#/usr}" "/usr${real#/usr}" "${real#/usr}")
  done
  local line pkgs path
  while IFS= read -r line; do
    [[ "$line" == diversion* || "$line" != *": /"* ]] && continue
    pkgs="${line%%: /*}"
    path="/${line#*: /}"
    pkgs="${pkgs%%,*}"
    owner[$path]="${pkgs%%:*}"
  done < <(dpkg-query -S "${paths[@]}" 2>/dev/null || true)
}
owner_of() {
  local f="$1" real cand
  real="$(readlink -f "$f")"
  for cand in "$f" "$real" "/usr${f#/usr}" "${f#/usr}" "/usr${real#/usr}" "${real#/usr}"; do
    if [[ -n "${owner[$cand]:-}" ]]; then
      echo "${owner[$cand]}"
      return 0
    fi
  done
  return 1
}
if ((${#binaries[@]})) && ((${#runtime_pkgs[@]})); then
  mapfile -t closure < <(apt-cache depends --recurse --no-recommends --no-suggests \
      --no-conflicts --no-breaks --no-replaces --no-enhances "${runtime_pkgs[@]}" 2>/dev/null |
    grep -v '^ ' | tr -d '<>' | sort -u)
  declare -A in_closure=() explicit=()
  for p in "${closure[@]}"; do in_closure[$p]=1; done
  for p in "${runtime_pkgs[@]}"; do explicit[$p]=1; in_closure[$p]=1; done
  mapfile -t all_libs < <(for bin in "${binaries[@]}"; do
      [[ -x "$bin" ]] && ldd "$bin" 2>/dev/null
    done | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// && $2 ~ /^\(/ { print $1 }' | sort -u)
  map_owners "${all_libs[@]}"
  for bin in "${binaries[@]}"; do
    if [[ ! -x "$bin" ]]; then
      fail "binary $bin: not found or not executable (build it first)"
      continue
    fi
    name="$(basename "$bin")"
    ldd_out="$(ldd "$bin" 2>&1)" || { fail "$name: ldd failed: $ldd_out"; continue; }
    if grep -q 'not found' <<<"$ldd_out"; then
      fail "$name: unresolved libraries on this host: $(grep 'not found' <<<"$ldd_out" | awk '{print $1}' | tr '\n' ' ')"
    fi
    declare -A lib_pkg=()
    bad=0 libs=0
    while read -r lib path; do
      libs=$((libs + 1))
      if ! pkg="$(owner_of "$path")"; then
        fail "$name: $lib ($path) belongs to no Debian package: it would be missing from the image"
        bad=1
        continue
      fi
      lib_pkg[$lib]="$pkg"
      if [[ -z "${in_closure[$pkg]:-}" ]]; then
        fail "$name: $lib is in package $pkg, which the final stage neither installs nor gets as a dependency"
        bad=1
      fi
    done < <(awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 } $1 ~ /^\// && $2 ~ /^\(/ { print $1, $1 }' <<<"$ldd_out")
    direct=0
    declare -A unnamed=()
    while read -r needed; do
      [[ -n "$needed" ]] || continue
      direct=$((direct + 1))
      pkg="${lib_pkg[$needed]:-}"
      if [[ -z "$pkg" ]]; then
        fail "$name: directly needed $needed was not resolved by ldd"
        bad=1
      elif [[ -z "${explicit[$pkg]:-}" ]]; then
        unnamed[$pkg]+=" $needed"
        bad=1
      fi
    done < <(readelf -d "$bin" | awk '/\(NEEDED\)/ { gsub(/[][]/, "", $5); print $5 }')
    for pkg in "${!unnamed[@]}"; do
      fail "$name: links${unnamed[$pkg]} directly; name their package $pkg in the final stage's apt-get install"
    done
    unset lib_pkg unnamed
    if ((!bad)); then
      ok "$name: $libs libraries (ldd) covered by the final stage's packages; its $direct direct ones named explicitly"
    fi
  done
elif ((${#binaries[@]} == 0)); then
  echo "note: no binary given: the ldd coverage check was not run" >&2
fi

if ((failures)); then
  echo "deploy/docker/check.sh: $failures failure(s) in $dockerfile" >&2
  exit 1
fi
echo "deploy/docker/check.sh: all checks passed"

#!/usr/bin/env bash
# Copies the example handlers and CRDs into deploy/examples, where kustomize may read them:
#   scripts/examples/*.lua          -> deploy/examples/scripts/   (the luaop-scripts ConfigMap)
#   scripts/examples/crds/*.y{a,}ml -> deploy/examples/crds/      (resources)
# and rewrites the two generated blocks of deploy/examples/kustomization.yaml (between the
# "# BEGIN <name>" and "# END <name>" markers) to list exactly those files, because
# kustomize takes neither globs nor folders in configMapGenerator files.
#
# kustomize's default load restrictor (LoadRestrictionsRootOnly) refuses files above
# the kustomization folder, and symlinks out of it, so the copies are committed and
# deploy/examples/check-sync.sh fails when they drift from scripts/examples.
#
#   deploy/examples/sync-scripts.sh          update deploy/examples in place
#   deploy/examples/sync-scripts.sh OUT_DIR  write scripts/, crds/ and update OUT_DIR/kustomization.yaml
#                                   (check-sync.sh uses this on a scratch copy)
set -euo pipefail
export LC_ALL=C  # the same glob order, hence the same kustomization.yaml, everywhere
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="$(cd "$here/../../scripts/examples" && pwd)"
out="${1:-$here}"
kust="$out/kustomization.yaml"

die() { echo "sync-scripts: $*" >&2; exit 1; }
[ -f "$kust" ] || die "$kust does not exist"

shopt -s nullglob
luas=("$src"/*.lua)
crds=("$src"/crds/*.yaml "$src"/crds/*.yml)
shopt -u nullglob
[ ${#luas[@]} -gt 0 ] || die "no *.lua in $src"

# ConfigMap keys must match [-._a-zA-Z0-9]+ (the file name becomes the key).
for f in "${luas[@]}"; do
  name="$(basename "$f")"
  [[ "$name" =~ ^[-._a-zA-Z0-9]+$ ]] || die "$name cannot be a ConfigMap key: rename it (allowed: letters, digits, - _ .)"
done

# fresh copies: files removed from scripts/examples disappear from deploy/examples too
rm -rf "$out/scripts" "$out/crds"
mkdir -p "$out/scripts" "$out/crds"
script_entries=()
for f in "${luas[@]}"; do
  cp "$f" "$out/scripts/"
  script_entries+=("scripts/$(basename "$f")")
done
crd_entries=()
for f in "${crds[@]}"; do
  cp "$f" "$out/crds/"
  crd_entries+=("crds/$(basename "$f")")
done

# fill_block NAME ENTRY... : replaces the lines between "# BEGIN NAME" and "# END NAME"
# with one "- ENTRY" line each, at the indentation of the BEGIN marker.
fill_block() {
  local name="$1"; shift
  grep -q "^[[:space:]]*# BEGIN $name\b" "$kust" && grep -q "^[[:space:]]*# END $name\b" "$kust" \
    || die "$kust lacks the '# BEGIN $name' / '# END $name' markers"
  local tmp="$kust.tmp.$$"
  printf '%s\n' "$@" | awk -v name="$name" '
    FNR == NR { if ($0 != "") entries[++n] = $0; next }
    $0 ~ "^[[:space:]]*# BEGIN " name "([[:space:]]|$)" {
      print; inside = 1
      indent = $0; sub(/[^[:space:]].*$/, "", indent)
      for (i = 1; i <= n; i++) print indent "- " entries[i]
      next
    }
    $0 ~ "^[[:space:]]*# END " name "([[:space:]]|$)" { inside = 0 }
    !inside { print }
  ' - "$kust" > "$tmp"
  mv "$tmp" "$kust"
}
fill_block scripts "${script_entries[@]}"
fill_block crds "${crd_entries[@]+"${crd_entries[@]}"}"

[ "$out" = "$here" ] && echo "sync-scripts: ${#luas[@]} script(s), ${#crds[@]} CRD file(s) copied into $out" >&2
exit 0

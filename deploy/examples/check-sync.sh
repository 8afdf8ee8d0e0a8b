#!/usr/bin/env bash
# Exits non-zero when deploy/examples/scripts, deploy/examples/crds or the generated
# blocks of deploy/examples/kustomization.yaml differ from what
# deploy/examples/sync-scripts.sh would produce from scripts/examples; prints the
# difference and the fix. Needs only bash and coreutils.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

cp "$here/kustomization.yaml" "$tmp/"
"$here/sync-scripts.sh" "$tmp"

status=0
for d in scripts crds; do
  if [ ! -d "$here/$d" ]; then
    echo "check-sync: deploy/examples/$d is missing" >&2; status=1; continue
  fi
  diff -ru "$here/$d" "$tmp/$d" >&2 || status=1
done
diff -u "$here/kustomization.yaml" "$tmp/kustomization.yaml" >&2 || status=1

if [ $status -ne 0 ]; then
  echo "check-sync: deploy/examples is out of sync with scripts/examples; run deploy/examples/sync-scripts.sh and commit the result" >&2
  exit 1
fi
echo "check-sync: deploy/examples is in sync with scripts/examples" >&2

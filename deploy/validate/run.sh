#!/usr/bin/env bash
# ctest deploy_validate: deploy/k8s must validate offline (validate.mjs), and
# every broken manifest in cases/ must be caught with its expected message,
# so the validator is known to fail when it should.
set -u
cd "$(dirname "$0")"
command -v node >/dev/null || { echo "SKIP: node is not installed"; exit 77; }
if [ ! -d node_modules/kubernetes-models ] || [ ! -d node_modules/yaml ]; then
    echo "FAIL: deploy/validate/node_modules is missing: run scripts/install-deps.sh (npm ci here)"
    exit 1
fi
rc=0
# deploy/Dockerfile (docker cannot run here): its COPY sources exist, and
# it runs as the user the manifests' securityContext names
for src in $(sed -n 's/^COPY \([^-][^ ]*\) .*/\1/p' ../Dockerfile); do
    [ -e "../../$src" ] || { echo "FAIL: deploy/Dockerfile COPY source '$src' does not exist"; rc=1; }
done
grep -q '^USER 10001' ../Dockerfile || { echo "FAIL: deploy/Dockerfile does not run as uid 10001"; rc=1; }
for f in ../k8s/router.yaml ../k8s/prefill.yaml ../k8s/decode.yaml; do
    grep -q 'runAsUser: 10001' "$f" || { echo "FAIL: $f does not run as uid 10001 (the image's user)"; rc=1; }
done
node validate.mjs ../k8s || rc=1
node validate.mjs --cases cases || rc=1
# a manifest left out of kustomization.yaml (it would never be applied) is caught
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
cp ../k8s/*.yaml "$tmp"/ && sed -i '/- prometheus.yaml/d' "$tmp/kustomization.yaml"
out=$(node validate.mjs "$tmp")
if grep -q "prometheus.yaml is not in resources" <<<"$out"; then
    echo "ok   kustomization without prometheus.yaml: caught"
else
    echo "FAIL: a manifest missing from kustomization.yaml was not caught: $out"; rc=1
fi
exit $rc

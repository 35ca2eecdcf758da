#!/usr/bin/env bash
# Installs the Debian packages kvseal needs to build and test, only those
# that are missing (so it is quick when everything is there). Run as root
# or with sudo available.
set -euo pipefail
# libsystemd-dev: sd_notify readiness for packaging/kvseal.service (optional to the build)
# libucx-dev: the UCX data plane (src/pd/ucx.c; required)
# libcurl4-openssl-dev: kvseal pull's downloads from Hugging Face (src/cli/cmd_pull.c)
# libhiredis-dev: tenant limits shared between routers (--limits-redis); redis-server: its e2e test
pkgs=(pkg-config libpcre2-dev libjansson-dev libmicrohttpd-dev libsodium-dev libxxhash-dev libssl-dev
      libsystemd-dev libucx-dev libhiredis-dev libcurl4-openssl-dev redis-server)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# tools are looked up as commands: a machine may have them from elsewhere
# (e.g. a node build that bundles npm, which Debian's npm package conflicts with)
# openssl (the CLI): test_https.sh makes its test CA and certificate with it
# ip and tc (iproute2): the netns tests (tests/e2e/netns.sh) put cluster nodes in namespaces
# chromium: the web pages' browser test (tests/e2e/test_webui.sh, through puppeteer-core)
for c in cmake:cmake make:make gcc:gcc clang:clang curl:curl node:nodejs npm:npm spin:spin jq:jq ip:iproute2 tc:iproute2 \
         openssl:openssl chromium:chromium; do
  command -v "${c%%:*}" >/dev/null 2>&1 || missing+=("${c#*:}")
done
# jinja2 is the oracle of the chat-template engine (tests/e2e/jinja_oracle.py):
# Debian's python3-jinja2, unless a python3 on the PATH already has it
if ! python3 -c 'import jinja2' >/dev/null 2>&1 && ! /usr/bin/python3 -c 'import jinja2' >/dev/null 2>&1; then
  missing+=(python3-jinja2)
fi
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "install-deps: installing ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# libFuzzer (clang -fsanitize=fuzzer, for tests/fuzz) is in the compiler-rt
# package of the clang version installed: libclang-rt-14-dev on bookworm
if ! echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return (int)(d && n && 0); }' |
     clang -x c -fsanitize=fuzzer -o /dev/null - >/dev/null 2>&1; then
  ver="$(clang -dumpversion | cut -d. -f1)"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "install-deps: installing libclang-rt-$ver-dev (libFuzzer)" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "libclang-rt-$ver-dev" >/dev/null
fi

# ThreadSanitizer (`make tsan`, CI) needs gcc's TSan runtime, libtsan2 for
# gcc 11-14 (usually already there: libgcc-N-dev depends on it)
if ! echo 'int main(void) { return 0; }' | gcc -x c -fsanitize=thread -o /dev/null - >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "install-deps: installing libtsan2 (ThreadSanitizer)" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends libtsan2 >/dev/null
fi

# the end-to-end tests drive the server with the official openai and
# @anthropic-ai/sdk npm clients, and the web pages with puppeteer-core (versions pinned in
# tests/e2e/js/package-lock.json); openai twice: 4.x as "openai", 6.x under the alias "openai6"
js="$(dirname "$0")/../tests/e2e/js"
if [ ! -d "$js/node_modules/openai" ] || [ ! -d "$js/node_modules/openai6" ] ||
  [ ! -d "$js/node_modules/@anthropic-ai/sdk" ] || [ ! -d "$js/node_modules/puppeteer-core" ]; then
  echo "install-deps: npm ci in tests/e2e/js" >&2
  (cd "$js" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi

# deploy/validate checks the Kubernetes manifests offline (ctest
# deploy_validate) with the kubernetes-models schemas and the yaml parser
# (versions pinned in deploy/validate/package-lock.json)
dv="$(dirname "$0")/../deploy/validate"
if [ ! -d "$dv/node_modules/kubernetes-models" ] || [ ! -d "$dv/node_modules/yaml" ]; then
  echo "install-deps: npm ci in deploy/validate" >&2
  (cd "$dv" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi

# Installs what the tests need, idempotently (sourced by scripts/test; scripts/demo needs less
# and installs it itself).
# Python venv with the package and its extras; npm packages; Debian's chromium for e2e tests;
# Debian's redis-server and HAProxy for the Redis store's and the multi-node tests.
step() { printf '\n== %s\n' "$*" >&2; }

setup_python() {
  step "Python environment (.venv)"
  if [[ ! -x .venv/bin/python ]]; then
    python3 -m venv .venv
  fi
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[core,test,lite]'
}

setup_node() {
  step "npm packages"
  if ! command -v npm >/dev/null; then
    echo "npm is missing: install Node.js 20+ (Debian: apt-get install nodejs npm)" >&2
    exit 1
  fi
  # Never let Playwright download a browser: we use Debian's chromium.
  PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error
}

apt_install() {
  if [[ $(id -u) == 0 ]]; then
    apt-get update -qq && apt-get install -y -qq "$@" >/dev/null
  else
    sudo apt-get update -qq && sudo apt-get install -y -qq "$@" >/dev/null
  fi
}

setup_chromium() {
  if [[ -x /usr/bin/chromium ]]; then
    return
  fi
  step "Debian's chromium"
  apt_install chromium
}

setup_redis() {
  if command -v redis-server >/dev/null; then
    return
  fi
  step "Debian's redis-server (the tests start their own, on loopback ports)"
  apt_install redis-server
}

setup_haproxy() {
  if command -v haproxy >/dev/null || [[ -x /usr/sbin/haproxy ]]; then
    return
  fi
  step "Debian's HAProxy (the multi-node tests start their own, on loopback ports)"
  apt_install haproxy
}

setup_python
setup_node
setup_redis
setup_haproxy
if [[ -f playwright.config.js ]]; then
  setup_chromium
fi

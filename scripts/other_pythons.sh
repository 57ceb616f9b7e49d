#!/usr/bin/env bash
# other_pythons.sh: the agent on Python releases other than the one the whole suite runs on.
#
#   bash scripts/other_pythons.sh setup   # once per machine (scripts/test_setup.sh runs it)
#   bash scripts/other_pythons.sh test    # scripts/test.sh runs it after the suite
#
# The suite runs on python3 (3.11 on Debian 12). pyproject.toml declares Python >= 3.10, and
# some libraries' current releases need a newer Python (Django 6: >= 3.12), so for each
# release in OTHER_PYTHONS (default: 3.10 3.12 3.13) found on the machine (pyenv's versions,
# or pythonX.Y on PATH) this keeps a virtual environment in ~/.cache/swmp-pythons/X.Y with the
# project's runtime and dev dependencies (not swmp itself: the tests run this checkout, its
# native modules built in place for that interpreter) and runs the tests below with it: the
# native core against orjson byte for byte, `swmp run` in both reporter modes, the thread
# reporter at exit, the web frameworks in process, a uWSGI master's forks under `swmp run`
# (uWSGI built for that interpreter: each release's fork protocol differs, see
# swmp/launcher.py). A release not on the machine is reported and skipped.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OTHER_PYTHONS=${OTHER_PYTHONS:-3.10 3.12 3.13}
CACHE=${SWMP_PYTHONS_DIR:-$HOME/.cache/swmp-pythons}
TESTS=(
  tests/test_native_json.py
  tests/test_spancore.py
  tests/test_agent_launcher.py
  tests/test_exit_threads.py
  tests/test_instrument_frameworks.py
  tests/test_instrument_web.py
  tests/test_uwsgi_master_forks.py
)
log() { echo "[other-pythons] $*"; }

interpreter() {  # the newest X.Y.* interpreter here, or nothing
  local v=$1 found=""
  if command -v pyenv > /dev/null 2>&1; then
    found=$(pyenv versions --bare 2> /dev/null | grep -E "^${v//./\\.}\.[0-9]+$" | sort -V | tail -1 || true)
    [ -n "$found" ] && found="$(pyenv root)/versions/$found/bin/python"
  fi
  [ -z "$found" ] && found=$(command -v "python$v" || true)
  echo "$found"
}

requirements() {  # the runtime and dev dependencies, from pyproject.toml (one place)
  "${PYTHON:-python3}" - "$ROOT/pyproject.toml" << 'EOF'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
print("\n".join(project["dependencies"] + project["optional-dependencies"]["dev"]))
EOF
}

setup_one() {
  local v=$1 py venv
  py=$(interpreter "$v")
  if [ -z "$py" ]; then
    log "Python $v: not on this machine; skipped"
    return 0
  fi
  venv="$CACHE/$v"
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
  log "Python $v: dependencies into $venv ($("$venv/bin/python" --version))"
  "$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar off -q \
    -r <(requirements)
}

test_one() {
  local v=$1 venv="$CACHE/$1"
  if [ ! -x "$venv/bin/python" ]; then
    log "Python $v: no environment (not on this machine); skipped"
    return 0
  fi
  log "Python $v: native modules built in place"
  (cd "$ROOT" && "$venv/bin/python" setup.py -q build_ext --inplace > /dev/null)
  # They are optional in an install (pure Python without a compiler); not here.
  (cd "$ROOT" && "$venv/bin/python" -c "import swmp._spancore, ipc._ringwrite, reporter_proc._encode_native")
  log "Python $v: ${TESTS[*]}"
  (cd "$ROOT" && PATH="$venv/bin:$PATH" PYTHONPATH="$ROOT" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
    "${TESTS[@]}")
}

case "${1:-}" in
  setup) for v in $OTHER_PYTHONS; do setup_one "$v"; done ;;
  test) for v in $OTHER_PYTHONS; do test_one "$v"; done ;;
  *) echo "usage: $0 setup|test" >&2; exit 2 ;;
esac

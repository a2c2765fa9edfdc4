#!/usr/bin/env bash
# README command 2: install what is needed (once), make sure a Redis answers, then lint, type-check
# and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh dev guard suites
export PYTHONUNBUFFERED=1
# The playground test drives a real headless Chromium; Debian's package is the one browser that installs
# here (Playwright's own download does not). Where it cannot be installed the test skips and says why.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "could not install chromium; the playground browser test will skip"
fi
# The compose test (tests/ops/test_compose_docker.py, marker `compose`) builds the image and runs
# docker-compose.yml: it needs a Docker daemon, docker-compose and debootstrap (the base images are made from
# Debian's packages where no registry answers). As root, install Debian's packages and start a daemon; where
# that cannot be done the test skips and says why. NEXTGUARD_COMPOSE=0 leaves it out.
if [ "${NEXTGUARD_COMPOSE:-1}" != 0 ] && [ "$(id -u)" = 0 ]; then
  DOCKER_DEBS=""
  command -v dockerd >/dev/null 2>&1 || DOCKER_DEBS="docker.io"
  command -v docker-compose >/dev/null 2>&1 || DOCKER_DEBS="$DOCKER_DEBS docker-compose"
  command -v debootstrap >/dev/null 2>&1 || DOCKER_DEBS="$DOCKER_DEBS debootstrap"
  if [ -n "$DOCKER_DEBS" ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $DOCKER_DEBS >/dev/null) \
      || echo "could not install $DOCKER_DEBS; the compose test will skip"
  fi
  if command -v dockerd >/dev/null 2>&1 && ! docker info >/dev/null 2>&1; then
    setsid dockerd >/var/log/nextguard-dockerd.log 2>&1 < /dev/null &
    for _ in $(seq 30); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || echo "dockerd did not start (/var/log/nextguard-dockerd.log); the compose test will skip"
  fi
fi
# Tests talk to a real Redis at 127.0.0.1:6379; start a private one if nothing answers there.
.venv/bin/python - <<'PY'
from pathlib import Path
from gateway.redis_local import ensure_local_redis, reachable
url = "redis://127.0.0.1:6379/0"
if not reachable(url):
    import subprocess, sys
    from gateway.redis_local import redis_server_binary
    exe = redis_server_binary()
    if exe is None:
        sys.exit("no Redis at 127.0.0.1:6379 and no redis-server binary")
    d = Path(".nextguard-test-redis"); d.mkdir(exist_ok=True)
    subprocess.run([exe, "--bind", "127.0.0.1", "--port", "6379", "--daemonize", "yes", "--dir", str(d.resolve()), "--save", ""], check=True)
    print("started a private redis-server on 127.0.0.1:6379")
PY
.venv/bin/ruff check .
.venv/bin/mypy
# Convert the embedded model once up front so the first test that needs it does not pay for it in its timeout.
.venv/bin/python -c 'from inference.embedded import ensure_embedded_model; ensure_embedded_model()'
# The compose test's image build (package downloads and unpacking, minutes) runs beside the rest of the suite, and
# the compose tests run last on the built image, their own build then a layer-cache hit. Only for a whole-suite
# run with options alone; given test paths, pytest runs as asked.
whole_suite=1
for a in "$@"; do case "$a" in -*) ;; *) whole_suite=0 ;; esac; done
if [ "$whole_suite" = 1 ] && [ "${NEXTGUARD_COMPOSE:-1}" != 0 ] && command -v docker >/dev/null 2>&1 \
    && docker info >/dev/null 2>&1; then
  NEXTGUARD_COMPOSE_PREBUILD=1 .venv/bin/python -m pytest -q tests/ops/test_compose_docker.py -k test_image_prebuild \
    > .nextguard-compose-build.log 2>&1 &
  prebuild=$!
  rc=0
  .venv/bin/python -m pytest --ignore=tests/ops/test_compose_docker.py "$@" || rc=$?
  if ! wait "$prebuild"; then
    echo "the image prebuild failed; the compose test builds it again:"
    tail -20 .nextguard-compose-build.log
  fi
  crc=0
  .venv/bin/python -m pytest tests/ops/test_compose_docker.py "$@" || crc=$?
  [ "$rc" != 0 ] && exit "$rc"
  exit "$crc"
fi
exec .venv/bin/python -m pytest "$@"

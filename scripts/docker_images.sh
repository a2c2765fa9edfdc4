#!/usr/bin/env bash
# Local stand-ins for the public images the compose file pulls, made from Debian's own packages, for machines
# that reach Debian's mirror but no container registry. Usage: scripts/docker_images.sh
#   nextguard-local/debian:bookworm        debootstrap (minbase + python3.11, venv, headers) -> docker import
#   nextguard-local/python:3.11-bookworm   that, trusting this machine's extra CA certificates; the
#                                          Dockerfile's PYTHON_IMAGE build arg
#   nextguard-local/redis, nextguard-local/nginx, nextguard-local/prometheus
#                                          Debian's redis-server, nginx and prometheus on that base; compose
#                                          takes them through NEXTGUARD_{REDIS,NGINX,PROMETHEUS}_IMAGE
# Images already present are kept (delete one to rebuild it). Needs root, docker and debootstrap.
set -euo pipefail
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
ROOTFS=nextguard-local/debian:bookworm
BASE=nextguard-local/python:3.11-bookworm
NICE=(nice -n 10)

have() { docker image inspect "$1" >/dev/null 2>&1; }

if ! have "$ROOTFS"; then
  root="$(mktemp -d)"
  trap 'rm -rf "$root"' EXIT
  "${NICE[@]}" debootstrap --variant=minbase \
    --include=python3,python3-venv,python3-dev,ca-certificates bookworm "$root" "$MIRROR" >/dev/null
  # as in Debian's published images: package scripts never try to start services inside a build, security
  # updates come with apt-get, and apt keeps no caches in the layers
  printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
  chmod +x "$root/usr/sbin/policy-rc.d"
  echo "deb ${MIRROR/\/debian/\/debian-security} bookworm-security main" >> "$root/etc/apt/sources.list"
  printf 'APT::Install-Recommends "false";\n' > "$root/etc/apt/apt.conf.d/90nextguard-no-recommends"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | docker import -c 'ENV LANG=C.UTF-8' -c 'CMD ["python3"]' - "$ROOTFS" >/dev/null
  rm -rf "$root"
  trap - EXIT
  echo "built $ROOTFS"
fi

# The base trusts what this machine trusts: its extra CA certificates (an egress proxy's, say) join Debian's
# bundle, which pip in the build reads through PIP_CERT as pip does here.
if ! have "$BASE"; then
  ctx="$(mktemp -d)"
  mkdir "$ctx/ca"
  cp /usr/local/share/ca-certificates/*.crt "$ctx/ca/" 2>/dev/null || true
  printf 'FROM %s\nCOPY ca/ /usr/local/share/ca-certificates/\nRUN update-ca-certificates >/dev/null\n' "$ROOTFS" \
    > "$ctx/Dockerfile"
  DOCKER_BUILDKIT=0 docker build -q -t "$BASE" "$ctx" >/dev/null
  rm -rf "$ctx"
  echo "built $BASE"
fi

build() {  # name, Dockerfile text
  have "$1" && return 0
  printf '%s\n' "$2" | DOCKER_BUILDKIT=0 "${NICE[@]}" docker build --network host -q -t "$1" - >/dev/null
  echo "built $1"
}

# redis:7-alpine: runs whatever command compose gives it, keeps its data in /data
build nextguard-local/redis "FROM $BASE
RUN apt-get update && apt-get install -y redis-server && rm -rf /var/lib/apt/lists/* \\
    && mkdir -p /data && chown redis:redis /data
WORKDIR /data
USER redis
EXPOSE 6379
CMD [\"redis-server\"]"

# nginx:1.27-alpine: conf.d/*.conf only (Debian's default site removed), wget for the healthcheck
build nextguard-local/nginx "FROM $BASE
RUN apt-get update && apt-get install -y nginx-light wget && rm -rf /var/lib/apt/lists/* \\
    && rm -f /etc/nginx/sites-enabled/default
CMD [\"nginx\", \"-g\", \"daemon off;\"]"

# prom/prometheus: the same entrypoint, config path and storage path as the public image
build nextguard-local/prometheus "FROM $BASE
RUN apt-get update && apt-get install -y prometheus wget && rm -rf /var/lib/apt/lists/* \\
    && mkdir -p /prometheus && chown prometheus:prometheus /prometheus
USER prometheus
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT [\"/usr/bin/prometheus\"]
CMD [\"--config.file=/etc/prometheus/prometheus.yml\", \"--storage.tsdb.path=/prometheus\"]"

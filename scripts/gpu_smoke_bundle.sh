#!/usr/bin/env bash
# Gather what a bare CUDA image (Python with torch, transformers and peft, and what they bring) lacks for
# `python -m benchmarks.gpu.smoke --trainer-only` into one folder under 64 MiB, to carry there and put on PYTHONPATH:
# this toolkit itself (with its entry points, through which the plugins register) and the dependencies of the
# smoke's path that torch, transformers and peft do not bring. Never torch, CUDA or triton (checked).
#
#   bash scripts/gpu_smoke_bundle.sh [FOLDER]            # default folder: build/gpu_smoke_bundle
#   PYTHON_VERSION=3.12 bash scripts/gpu_smoke_bundle.sh  # for an image whose Python is not this one's
#
# Then, on the GPU machine, from the repository root:
#   PYTHONPATH=FOLDER python -m benchmarks.gpu.smoke --trainer-only
# Versions are those of .venv where it has the package (the ones the tests ran with), else pip's newest. Most
# wheels are pure Python; pydantic-core is compiled, so it is fetched for PYTHON_VERSION (default: the version of
# .venv's Python, else python3's) and PLATFORM (default manylinux2014_x86_64). vLLM is not gathered (hundreds of
# MB with its own torch pin): the full smoke needs `pip install -e ".[vllm]"` on the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-build/gpu_smoke_bundle}
LIMIT_MIB=64
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
PYTHON_VERSION=${PYTHON_VERSION:-$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')}
PLATFORM=${PLATFORM:-manylinux2014_x86_64}
# what the smoke imports beyond torch/transformers/peft's own dependencies (pluggy, pydantic: the core; click,
# trueskill, radon: imported by the runs), and trl, which populora doctor counts as a core dependency
PURE=(pluggy pydantic annotated-types typing-inspection typing-extensions click trueskill six radon mando colorama trl)
COMPILED=(pydantic-core)

pin() {  # NAME -> NAME==the version in $PY where it has it
    local version
    version=$("$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1" 2>/dev/null) || version=
    echo "$1${version:+==$version}"
}
pure=(); for name in "${PURE[@]}"; do pure+=("$(pin "$name")"); done
compiled=(); for name in "${COMPILED[@]}"; do compiled+=("$(pin "$name")"); done

rm -rf "$OUT"
mkdir -p "$OUT"
"$PY" -m pip install --quiet --no-deps --target "$OUT" . "${pure[@]}"  # trueskill has no wheel: built here, pure
"$PY" -m pip install --quiet --no-deps --target "$OUT" --only-binary=:all: --implementation cp \
    --python-version "$PYTHON_VERSION" --platform "$PLATFORM" "${compiled[@]}"
rm -rf "$OUT/bin"  # console scripts whose first line names this machine's Python

for forbidden in torch nvidia triton vllm; do
    if [ -e "$OUT/$forbidden" ]; then
        echo "gpu_smoke_bundle: $OUT/$forbidden is there: the image's own must be used" >&2
        exit 1
    fi
done
native=$(find "$OUT" -name '*.so' -not -path "$OUT/pydantic_core/*")
if [ -n "$native" ]; then
    echo "gpu_smoke_bundle: compiled code beside pydantic-core, built for this machine, not the image: $native" >&2
    exit 1
fi
bytes=$(du -sb "$OUT" | cut -f1)
mib=$(( (bytes + 1048575) / 1048576 ))
echo "gpu_smoke_bundle: $OUT holds ${mib} MiB (limit ${LIMIT_MIB} MiB) for Python $PYTHON_VERSION on $PLATFORM:"
echo "  populora-toolkit (this tree) ${pure[*]} ${compiled[*]}"
if [ "$mib" -gt "$LIMIT_MIB" ]; then
    echo "gpu_smoke_bundle: over ${LIMIT_MIB} MiB" >&2
    exit 1
fi
echo "on the GPU machine, from the repository root: PYTHONPATH=$OUT python -m benchmarks.gpu.smoke --trainer-only"

#!/usr/bin/env bash
# Download the wheels benchmarks/gpu_check.py needs on a GPU machine whose Python has torch,
# transformers, peft, accelerate, nvidia-ml-py, psutil, rich, pyyaml (and pyarrow, pandas, xxhash,
# fsspec for datasets) but not steadytune's other needs. Carry the folder there, then:
#
#     python benchmarks/gpu_check.py --wheels gpu-wheels --out gpu-check
#
# usage: benchmarks/gpu_wheels.sh [DIR]          (default DIR: gpu-wheels)
#   PYVER=3.12     the GPU machine's Python (python3 -V there); pydantic-core and multiprocess
#                  are built per Python version. Default: this Python's.
#   PLATFORM=...   its platform tags (default: manylinux x86_64)
#   WITH_BNB=1     also bitsandbytes, for the QLoRA rows of check 3 and quant-check's int8/NF4 in check 6
#                  (a large binary wheel: leave it out when the folder must stay small; those rows are
#                  then reported as skipped)
#   WITH_UNSLOTH=1 also unsloth and the versions it pins (transformers <= 5.17, trl <= 1.15), into
#                  DIR/unsloth/: gpu_check.py installs those into a folder that only check 7 uses
#   PYTHON=python3 the Python whose installed versions are pinned (the ones this checkout was tested
#                  with); a package it lacks is fetched at its newest version.
#
# Only pure-Python wheels, plus pydantic-core and torchao (binary), and --no-deps: nothing else is pulled in.
set -euo pipefail

DIR=${1:-gpu-wheels}
PYTHON=${PYTHON:-python3}
PYVER=${PYVER:-$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')}
PLATFORM=${PLATFORM:-"manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64"}

# pydantic: the config; datasets (+ dill, multiprocess): the built-in runner's data path;
# torchao (an abi3 wheel of a few MB): quant-check's fp8 candidate in check 6.
PACKAGES="pydantic pydantic-core annotated-types typing-inspection typing-extensions datasets dill multiprocess torchao"
if [ "${WITH_BNB:-0}" = 1 ]; then
    PACKAGES="$PACKAGES bitsandbytes"
fi

platform_args=()
for p in $PLATFORM; do
    platform_args+=(--platform "$p")
done

mkdir -p "$DIR"
for name in $PACKAGES; do
    version=$("$PYTHON" -c 'import importlib.metadata as m, sys
try:
    print(m.version(sys.argv[1]))
except m.PackageNotFoundError:
    pass' "$name")
    spec=$name${version:+==$version}
    echo "== $spec (Python $PYVER)"
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYVER" \
        --implementation cp "${platform_args[@]}" -d "$DIR" "$spec"
done
if [ "${WITH_UNSLOTH:-0}" = 1 ]; then
    # unsloth imports bitsandbytes, tyro (with its own needs), msgspec and cut_cross_entropy as it loads;
    # the GPU machine's torch (and the triton it ships) stays.
    UNSLOTH="unsloth unsloth_zoo transformers==5.17.0 trl==1.15.0 peft accelerate datasets<5 bitsandbytes
             tyro docstring-parser shtab typeguard msgspec cut_cross_entropy hf_transfer json5 nest-asyncio
             structlog regex torchao"
    mkdir -p "$DIR/unsloth"
    for spec in $UNSLOTH; do
        echo "== unsloth: $spec (Python $PYVER)"
        "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYVER" \
            --implementation cp "${platform_args[@]}" -d "$DIR/unsloth" "$spec"
    done
fi
du -sh "$DIR"
ls -1 "$DIR"

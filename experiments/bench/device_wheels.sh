#!/usr/bin/env bash
# The wheels the accelerator check needs on the device machine, fetched here into .device_wheels/ (git-ignored).
#
# The device image has Python 3.12 and its own jax (0.11.2, CUDA) but not the project's pure-Python dependencies, and
# it reaches no package index: they travel with the working tree (the device tool's `carry`, 64 MiB at most in all).
# These are the missing ones, at the versions CI installs (so the device runs what CI tests): ml_collections, clu,
# gguf, openai and its dependencies (pydantic, pydantic_core, jiter, distro, sniffio, typing_inspection,
# annotated_types, typing_extensions, tqdm, httpx, httpcore, h11, anyio, idna, certifi), protobuf / grpcio new enough
# for the generated gRPC code (sao/transport/*_pb2*.py), and what ml_collections and clu.metrics import beyond
# jax / flax / numpy (absl-py, PyYAML, wrapt), in case the image lacks them. Installed with --no-deps, a wheel
# replaces the image's copy of the same package. The check's first record (`environment`) names every runtime
# dependency the image still lacks. Binary wheels for CPython 3.12 on x86-64 Linux, no dependency resolution (the
# list is the resolution): `pip download --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312
# --platform manylinux...  --no-deps`.
#
#   bash experiments/bench/device_wheels.sh            # → .device_wheels/*.whl, prints their total size
#
# The device run (not yet run on a GPU), from the repository root, one call of the device tool with
# carry=[".device_wheels"] and timeout_s=590 (docs/performance_accelerator.md):
#
#   PIP_BREAK_SYSTEM_PACKAGES=1 python -m pip install -q --no-index --no-deps .device_wheels/*.whl && \
#     PYTHONPATH=$PWD python experiments/bench/bench_accelerator.py --out=$OUT/accel.jsonl --cache_dir=.bench_cache/xla
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEST="${1:-$ROOT/.device_wheels}"

WHEELS=(
  ml_collections==1.1.0
  clu==0.0.12
  gguf==0.19.0
  openai==2.54.0
  pydantic==2.13.4
  pydantic_core==2.46.4
  jiter==0.19.0
  distro==1.9.0
  sniffio==1.3.1
  typing_inspection==0.4.2
  annotated_types==0.7.0
  typing_extensions==4.16.0
  tqdm==4.70.1
  httpx==0.29.0
  httpcore==1.0.9
  h11==0.16.0
  anyio==4.16.0
  idna==3.20
  certifi==2026.5.20
  protobuf==7.36.2
  grpcio==1.85.3
  absl-py==2.5.1
  PyYAML==6.0.3
  wrapt==2.1.2
)

mkdir -p "$DEST"
# manylinux_2_17 (= manylinux2014) and manylinux_2_28 tags: pip takes the newest wheel any of them names. Pure-Python
# wheels (py3-none-any) match every platform.
python -m pip download --quiet --no-input --dest "$DEST" --only-binary=:all: --no-deps \
  --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  "${WHEELS[@]}"

count=$(ls "$DEST"/*.whl | wc -l)
if [ "$count" -ne "${#WHEELS[@]}" ]; then
  echo "device_wheels: expected ${#WHEELS[@]} wheels in $DEST, found $count" >&2
  exit 1
fi
echo "device_wheels: $count wheels, $(du -ch "$DEST"/*.whl | tail -1 | cut -f1) in $DEST"

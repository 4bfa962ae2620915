#!/usr/bin/env bash
# Prepares .device_run/ (git-ignored) for `python -m bench.paper_comparison` on a lent GPU machine,
# whose image (Python 3.12, JAX 0.11.2, sentencepiece, flax, optax, orbax-checkpoint and chex of
# versions unknown here) lacks grain, ml_collections and tensorboardX and reaches no registry: their
# wheels (Python 3.12, manylinux x86-64), this project's pinned flax, orbax-checkpoint, optax and chex
# (installed ahead of the image's, so the run uses the versions the tests ran), and the two data
# files (../shared/data), about 20 MiB, carried by the device tool.
#
#   bash bench/prepare_device.sh
#   # then, through the device tool, with carry=[".device_run"] and timeout_s=420:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device_run/wheels/*.whl \
#     && PYTHONPATH=/tmp/site:. python3 -m bench.paper_comparison --out=$OUT 2>&1 | tee $OUT/log.txt
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.device_run
mkdir -p "$dest/wheels" "$dest/data"
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$dest/wheels" \
  grain==0.2.18 array-record==0.8.6 portpicker ml-collections==1.1.0 tensorboardX==2.6.5 \
  flax==0.12.8 orbax-checkpoint==0.12.8 optax==0.2.8 chex==0.1.92 nest-asyncio
cp ../shared/data/rocstories_spring2016_first45000.csv ../shared/data/storycloze_val_2016.csv "$dest/data/"
du -sh "$dest"

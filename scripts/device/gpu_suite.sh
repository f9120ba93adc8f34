#!/bin/bash
# The gpu-marked tests of tests/ops and tests/attention on the device, for results/gpu-tests/ (JUnit,
# summary with the kernel-source hash), packed into one file ($OUT returns a few files only).
# Usage: COMMIT=<sha> OUT=$OUT bash scripts/device/gpu_suite.sh
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1 LENX_GIT_COMMIT=$COMMIT
mkdir -p $OUT/g
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/g/gpu.txt
LENX_KERNEL_ERRORS=$OUT/g/errors.jsonl timeout 200 python3 -m pytest -q -n 12 -m gpu -p no:cacheprovider \
    --junitxml=$OUT/g/junit.xml tests/ops tests/attention 2>&1 | grep -v -i warn | tail -25 | tee $OUT/g/pytest.log
python3 scripts/device/gpu_summary.py $OUT/g/junit.xml $OUT/g/summary.json \
    "bash scripts/device/gpu_suite.sh (pytest -n 12 -m gpu tests/ops tests/attention)"
cd $OUT && tar czf gpu-tests.tar.gz g && rm -rf g

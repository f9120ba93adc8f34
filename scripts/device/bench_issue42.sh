#!/bin/bash
# Issue 42 on the device: the 125m training step at 512 x 32 of the query temperatures and PoPE beside
# their bases, and of MTA and FoX (chunked) beside Kerple and DAPE V2; packed into one file.
# Usage: COMMIT=<sha> OUT=$OUT bash scripts/device/bench_issue42.sh
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
mkdir -p $OUT/b
timeout 100 python3 -m lenx bench --train-step --methods kerple,ssmax-kerple,logn-kerple,rope,ssmax-rope,l4temp-rope,pope --batch 32 --seq-len 512 \
  --steps 6 --warmup 2 --profile-steps 2 --commit $COMMIT -o $OUT/b/train_step_temperatures_T512.json 2>&1 | grep -v -i warn | tail -16 | tee $OUT/b/temperatures.log
timeout 120 python3 -m lenx bench --train-step --methods kerple,dapev2-kerple,mta,mta-kerple,fox --batch 32 --seq-len 512 \
  --steps 6 --warmup 2 --profile-steps 2 --commit $COMMIT -o $OUT/b/train_step_mta_fox_T512.json 2>&1 | grep -v -i warn | tail -16 | tee $OUT/b/mta_fox.log
cd $OUT && tar czf bench42.tar.gz b && rm -rf b

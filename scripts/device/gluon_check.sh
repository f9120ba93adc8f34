#!/bin/bash
# One device call for the Gluon DAPE V2 forward (issue 17): the GPU test suite (gpu_check.sh, no bench),
# the forward timings against Triton and SDPA (k 1 and 3, T 8192-32768; d 128), and a whole `lenx eval`
# at 8192 of a (2-step) 125M dapev2-kerple run with the Triton forward and with the Gluon forward.
# Everything lands in $OUT/gluon_check.tgz (the device tool returns few files) plus $OUT/log.txt.
# Usage (repository root on the device, no install): COMMIT=<sha> OUT=/some/dir bash scripts/device/gluon_check.sh
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1 LENX_GIT_COMMIT=$COMMIT
W=/tmp/gluon_check
rm -rf $W && mkdir -p $W/bench $W/eval
{
COMMIT=$COMMIT OUT=$W BENCH=0 bash scripts/device/gpu_check.sh
timeout 150 python3 scripts/tune/time_gluon.py --lengths 8192,16384,32768 --ks 1,3 -o $W/bench/gluon_times.json 2>&1 | grep -v -i warn
timeout 60 python3 scripts/tune/time_gluon.py --lengths 8192,16384 --ks 3 --d128 -o $W/bench/d128_times.json 2>&1 | grep -v -i warn
timeout 60 python3 -m lenx train -c 125m --set data.corpus=synthetic --set train.steps=2 --set train.batch_size=8 \
    --set train.ckpt_every=2 -o /tmp/evalrun --no-progress 2>&1 | tail -2
for g in 0 1; do
    s=$(date +%s.%N)
    LENX_DAPE_V2_GLUON=$g timeout 120 python3 -m lenx eval /tmp/evalrun --lengths 8192 --no-progress 2>&1 | tail -4
    e=$(date +%s.%N)
    echo "{\"LENX_DAPE_V2_GLUON\": $g, \"wall_s\": $(python3 -c "print(round($e - $s, 2))"), \"command\": \"python3 -m lenx eval RUN --lengths 8192\"}" \
        | tee $W/eval/eval_time_gluon$g.json
    cp /tmp/evalrun/eval.json $W/eval/eval_gluon$g.json
done
cp /tmp/evalrun/config.toml $W/eval/
} 2>&1 | tee $W/log.txt
tar czf "$OUT/gluon_check.tgz" -C $W .
cp $W/log.txt "$OUT/log.txt"

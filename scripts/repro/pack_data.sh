#!/bin/bash
# Pack the tokenized tech and books corpora (lenx prepare tech / books) for the device: ~31 MB xz,
# under the 64 MiB a call may carry (tech's train split alone is 62 MB raw). Also records the commit
# and the jobs already done.
set -eu
mkdir -p carry
files=()
for corpus in tech books; do
  for f in manifest.json tokenizer.json train.bin train.idx.npy val.bin val.idx.npy test.bin test.idx.npy; do
    files+=("$corpus/$f")
  done
done
tar -C data -cf - "${files[@]}" | xz -T0 -6 > carry/data.tar.xz
git rev-parse HEAD > carry/commit.txt
# Jobs an earlier session finished (results/repro/status.json) are not run again.
python3 - > carry/done.txt <<'PY'
import json, pathlib
for status in sorted(pathlib.Path("results/repro").glob("status*.json")):
    for job in json.loads(status.read_text())["jobs"]:
        if job["state"] == "done":
            print(job["id"])
PY
wc -l carry/done.txt
ls -la carry

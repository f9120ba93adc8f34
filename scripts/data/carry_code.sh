#!/bin/bash
# Build what a device call carries of the `code` corpus, on a machine that has none of it (a fresh
# checkout): `lenx prepare code` (about 27 min on one free core, more beside other work), its train
# split cut into shards aside, the first four shards (the 100M-token runs' steps) as xz files, and
# the corpus's other files as pack_corpus.py pieces. Writes .carry/code and .carry/shards/0000[0-3].bin.xz
# under the repository root; the corpus itself stays in ROOT (default ../corpus). A corpus already
# in ROOT is reused (lenx prepare says so). Its fingerprint is printed: compare it with a committed
# run's meta.json (corpus_fingerprint) before carrying.
# Usage (repository root): bash scripts/data/carry_code.sh [ROOT]
set -eu
ROOT=${1:-../corpus}
PY=${PY:-.venv/bin/python}
"$PY" -m pip install -q -e '.[dedup]'
nice -n 10 "$PY" -m lenx prepare code --root "$ROOT/data"
rm -rf "$ROOT/aside" && mkdir -p "$ROOT/aside"
cp -al "$ROOT/data/code" "$ROOT/aside/code"
nice -n 10 "$PY" -m lenx shard code --root "$ROOT/aside" --remove-bin
mkdir -p .carry/shards
for n in 00000 00001 00002 00003; do
  nice -n 10 xz -k -6 -T1 -c "$ROOT/aside/code/train.shards/$n.bin" > ".carry/shards/$n.bin.xz.part"
  mv ".carry/shards/$n.bin.xz.part" ".carry/shards/$n.bin.xz"
done
rm -rf .carry/code
nice -n 10 "$PY" scripts/data/pack_corpus.py pack "$ROOT/aside/code" .carry/code --preset 6
"$PY" -c "import json, sys; print(json.load(open(sys.argv[1]))['fingerprint'])" "$ROOT/data/code/manifest.json"
ls -la .carry/code .carry/shards

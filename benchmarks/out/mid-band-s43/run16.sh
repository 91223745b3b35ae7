#!/bin/bash
# A/B on the testbed ($NP hosts, default 16, already up with --rate $RATE): the engine before the mid band's fit
# (/work/core-base.so) against it (/work/core-mid.so), both rails and rail 0 alone, $ROUNDS rounds.
# Usage: RATE=1gbit,250mbit OUTP=r025- bash run16.sh
cd /work/main
SO=.venv/lib/python3.11/site-packages/nezha/_core.cpython-311-x86_64-linux-gnu.so
OUT=benchmarks/out/mid-band-s43
ARGS=$(.venv/bin/python -m nezha.testbed nezharun-args --prefix nzab)
HOSTS=$(echo "$ARGS" | sed -E "s/.*-H ([^ ]+).*/\1/")
for round in $(seq 1 ${ROUNDS:-3}); do
  for build in base mid; do
    cp /work/core-$build.so $SO
    for rails in "10.50.0.0/24,10.51.0.0/24" "10.50.0.0/24"; do
      tag=$OUTP$build-$([ "$rails" = "10.50.0.0/24" ] && echo rail0 || echo 2rails)-$round
      timeout 600 .venv/bin/python -m nezha.runner -np ${NP:-16} --launcher 'ip netns exec {host}' -H $HOSTS \
        --rendezvous-addr 10.50.0.254 --rails $rails -- .venv/bin/python -m nezha.bench --op allreduce \
        --sizes ${SIZES:-64K,128K,256K,1M} --dtype float32 --iters auto --warmup 2 --json $OUT/$tag.json \
        --impl-label $tag > $OUT/$tag.log 2>&1
      echo "$tag rc=$? $(date +%T)"
    done
  done
done
cp /work/core-mid.so $SO

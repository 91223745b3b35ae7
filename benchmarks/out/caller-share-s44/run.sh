#!/bin/bash
# A/B on the testbed ($NP hosts, already up with the rates named by $OUTP), both rails, $ROUNDS
# rounds, the order of the builds alternating: $A and $B name /work/core-$A.so and /work/core-$B.so
# (seed: 89377d0's engine; caller: the leading caller runs a striped operation's largest share;
# check: that and the striping check, one in 16 explored; check2: one in 4 of the first 64;
# check3: striping stops only 10 % slower; check4: explored in runs of 4, an operation after the
# other kind not counted).
# Usage: NP=16 OUTP=r025-h16- A=seed B=caller bash run.sh
cd /work/main
SO=.venv/lib/python3.11/site-packages/nezha/_core.cpython-311-x86_64-linux-gnu.so
OUT=benchmarks/out/caller-share-s44
ARGS=$(.venv/bin/python -m nezha.testbed nezharun-args --prefix nzab)
HOSTS=$(echo "$ARGS" | sed -E "s/.*-H ([^ ]+).*/\1/")
for round in $(seq 1 ${ROUNDS:-3}); do
  builds="$A $B"; [ $((round % 2)) = 0 ] && builds="$B $A"
  for build in $builds; do
    cp /work/core-$build.so $SO
    tag=$OUTP$build-$round
    timeout 600 .venv/bin/python -m nezha.runner -np ${NP:-16} --launcher 'ip netns exec {host}' -H $HOSTS \
      --rendezvous-addr 10.50.0.254 --rails 10.50.0.0/24,10.51.0.0/24 -- .venv/bin/python -m nezha.bench --op allreduce \
      --sizes ${SIZES:-64K,256K,1M,16M} --dtype float32 --iters auto --warmup 2 --json $OUT/$tag.json \
      --impl-label $tag > $OUT/$tag.log 2>&1
    echo "$tag rc=$? $(date +%T)"
  done
done
cp /work/core-$B.so $SO

#!/bin/bash
# A/B: old vs new _core on the 16-host testbed, both rails (failover on) and rail 0 alone.
cd /work/main
SO=.venv/lib/python3.11/site-packages/nezha/_core.cpython-311-x86_64-linux-gnu.so
ARGS=$(.venv/bin/python -m nezha.testbed nezharun-args --prefix nzab)
HOSTS=$(echo "$ARGS" | sed -E "s/.*-H ([^ ]+).*/\1/")
for round in 1 2 3; do
  for build in old new; do
    cp /work/core-$build.so $SO
    for rails in "10.50.0.0/24,10.51.0.0/24" "10.50.0.0/24"; do
      tag=$build-$([ "$rails" = "10.50.0.0/24" ] && echo rail0 || echo 2rails)-$round
      timeout 600 .venv/bin/python -m nezha.runner -np ${NP:-16} --launcher 'ip netns exec {host}' -H $HOSTS \
        --rendezvous-addr 10.50.0.254 --rails $rails -- .venv/bin/python -m nezha.bench --op allreduce \
        --sizes ${SIZES:-8,1K,64K,256K,1M} --dtype float32 --iters auto --warmup 2 --json /work/ab/$OUTP$tag.json \
        --impl-label $tag > /work/ab/$OUTP$tag.log 2>&1
      echo "$tag rc=$? $(date +%T)"
    done
  done
done
cp /work/core-new.so $SO

#!/bin/bash
cd /work/main
SO=.venv/lib/python3.11/site-packages/nezha/_core.cpython-311-x86_64-linux-gnu.so
for round in 1 2 3; do
  for build in old new; do
    cp /work/core-$build.so $SO
    tag=$build-$round
    timeout 600 .venv/bin/nezharun -np 4 .venv/bin/nezha-bench --sizes ${SIZES:-8,64K,1M,64M} --iters auto \
       --json /work/ab/$OUTP$tag.json --impl-label $tag > /work/ab/$OUTP$tag.log 2>&1
    echo "$tag rc=$? $(date +%T)"
  done
done
cp /work/core-new.so $SO

#!/usr/bin/env bash
# The GPU machine's check (docs/status.md): builds nezha with that machine's own python3
# (torch and jax with CUDA; nothing is fetched), runs the adapters' CUDA tests, and compares a jitted
# pytree allreduce through the CUDA FFI handler with the io_callback path (2 ranks, loopback: the
# staging and dispatch overhead, not a network figure), builds and tests the CUDA IPC lane (core/src/cuda:
# its tests and a 4-rank benchmark on the one GPU), and times the host path with 8 numpy ranks
# (the shmcoll rail with one thread per rank and with its default). Logs go to $OUT (default ./device-out).
# The lane and the host path run before the adapters' tests; DEVICE_CHECK_SKIP_JAX=1 leaves out the
# JAX benchmarks at the end.
#
#   bash scripts/device_check.sh            # on the GPU machine, from the repository root
#
# That machine fetches nothing: where it lacks OpenSSL's headers, a libssl-dev .deb under .gpu/ is
# unpacked first, and where it lacks GoogleTest, Debian's googletest source package there is built
# (on a dev machine: `mkdir -p .gpu && cd .gpu && apt-get download libssl-dev googletest`; .gpu/ is
# ignored through .git/info/exclude, so name it in the device tool's carry).
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) XLA_PYTHON_CLIENT_PREALLOCATE=false
{
  nvidia-smi -L
  python3 -c "import sys, jax, torch; print('python', sys.version.split()[0], '| jax', jax.__version__, \
jax.default_backend(), '| torch', torch.__version__, 'cuda', torch.cuda.is_available())"
} 2>&1 | tee "$OUT/env.txt"
if [ ! -e /usr/include/openssl/hmac.h ]; then
  for deb in .gpu/libssl-dev_*.deb; do [ -e "$deb" ] && dpkg -x "$deb" / && echo "unpacked $deb"; done
fi

echo "== build ($(date +%T))"
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$OUT/build.txt" 2>&1
rc=$?; tail -20 "$OUT/build.txt"
[ $rc -eq 0 ] || { echo "build failed"; exit 1; }
python3 -c "import nezha.jax as nj; print('ffi', nj.ffi_available())"

echo "== CUDA IPC lane: its tests, then 4 ranks on the GPU ($(date +%T))"
# Built apart from the Python module (nezha._core does not use the lane yet): nvcc from PATH, the
# toolkit or pip's nvidia-cuda-nvcc, else a prebuilt kernel image at .gpu/nezha_reduce_kernels.fatbin
# (`make cuda-fatbin` on a dev machine puts it there); GoogleTest if the machine has it.
nvcc_bin=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || python3 -c \
  "import nvidia.cuda_nvcc as n, os; p = os.path.join(n.__path__[0], 'bin', 'nvcc'); print(p if os.path.exists(p) else '')" 2>/dev/null)
cuda_args=(-DNEZHA_BUILD_PYTHON=OFF -DCMAKE_BUILD_TYPE=Release -DNEZHA_CUDA=ON)
if [ -n "$nvcc_bin" ]; then cuda_args+=(-DCMAKE_CUDA_COMPILER="$nvcc_bin")
elif [ -e .gpu/nezha_reduce_kernels.fatbin ]; then cuda_args+=(-DNEZHA_CUDA_FATBIN="$PWD/.gpu/nezha_reduce_kernels.fatbin")
else cuda_args=(); echo "no nvcc and no .gpu/nezha_reduce_kernels.fatbin (make cuda-fatbin on a dev machine): skipped"; fi
if [ ${#cuda_args[@]} -gt 0 ]; then
  command -v ninja > /dev/null && cuda_args+=(-G Ninja)
  cuda_targets="nezha_cuda_tests nezha-cuda-ipc-bench"
  # No GoogleTest there and nothing to fetch: build it from Debian's source package when one was
  # carried in .gpu/ (apt-get download googletest), ~15 s.
  for deb in .gpu/googletest_*.deb; do
    [ -e "$deb" ] || continue
    rm -rf /tmp/gtest-src && dpkg -x "$deb" /tmp/gtest-src &&
      timeout 120 cmake -S /tmp/gtest-src/usr/src/googletest -B /tmp/gtest-build -DBUILD_GMOCK=OFF \
        -DCMAKE_BUILD_TYPE=Release -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -DCMAKE_INSTALL_PREFIX=/tmp/gtest \
        > "$OUT/gtest_build.txt" 2>&1 && timeout 120 cmake --build /tmp/gtest-build -j "$(nproc)" >> "$OUT/gtest_build.txt" 2>&1 &&
      cmake --install /tmp/gtest-build >> "$OUT/gtest_build.txt" 2>&1 && cuda_args+=(-DCMAKE_PREFIX_PATH=/tmp/gtest) &&
      echo "GoogleTest built from $deb"
  done
  if ! timeout 120 cmake -S . -B build/cuda "${cuda_args[@]}" -DNEZHA_BUILD_TESTS=ON > "$OUT/cuda_build.txt" 2>&1; then
    cuda_targets=nezha-cuda-ipc-bench  # no GoogleTest: the benchmark still checks its results
    timeout 120 cmake -S . -B build/cuda "${cuda_args[@]}" -DNEZHA_BUILD_TESTS=OFF >> "$OUT/cuda_build.txt" 2>&1
  fi
  timeout 300 cmake --build build/cuda --target $cuda_targets -j "$(nproc)" >> "$OUT/cuda_build.txt" 2>&1 ||
    { echo "CUDA lane build failed:"; tail -15 "$OUT/cuda_build.txt"; }
  if [ -x build/cuda/nezha_cuda_tests ]; then
    timeout 180 build/cuda/nezha_cuda_tests 2>&1 | tee "$OUT/cuda_tests.txt" |
      grep -E "FAIL|SKIP|PASSED|Which is|rank [0-9]" | tail -20
  fi
  [ -x build/cuda/nezha-cuda-ipc-bench ] && timeout 120 build/cuda/nezha-cuda-ipc-bench --ranks 4 \
    --sizes 8,64K,1M,64M --iters 20 --json "$OUT/cuda_ipc_bench.json" 2>&1 | tee "$OUT/cuda_ipc_bench.txt" | tail -8
fi

echo "== host path, 8 numpy ranks: shmcoll with one thread per rank vs its default ($(date +%T))"
# The default gives each rank the cores the ranks leave idle (shm_coll_crew.h): 2 threads on 16 cores.
for threads in 1 default; do
  spec="lo,shmcoll"; [ $threads = default ] || spec="lo,shmcoll;threads=$threads"
  timeout 150 python3 -m nezha.runner.launch -np 8 --rails "$spec" python3 -m nezha.bench \
    --sizes 8,64K,1M,64M --iters auto --baseline gloo --json "$OUT/host8_threads_$threads.json" 2>&1 |
    grep -v Warning | sed "s/^/threads $threads: /" | tail -8
done
echo "== tests ($(date +%T))"
timeout 420 python3 -m pytest -q -p no:cacheprovider -rs tests/test_torch_device.py tests/test_jax.py \
  tests/test_torch_gpu_semantics.py "tests/test_torch_distributed.py::test_ddp_on_cuda_tensors_matches_one_process" \
  2>&1 | tee "$OUT/pytest.txt" | tail -25

if [ "${DEVICE_CHECK_SKIP_JAX:-0}" != 1 ]; then
echo "== jitted allreduce on the GPU: FFI handler vs io_callback ($(date +%T))"
for mode in ffi callback; do
  force=0; [ $mode = callback ] && force=1
  NEZHA_JAX_FORCE_CALLBACK=$force timeout 150 python3 -m nezha.runner.launch -np 2 \
    python3 benchmarks/jax_allreduce_bench.py --sizes 8,64K,1M,16M,64M --leaves 8 \
    --json "$OUT/bench_$mode.json" 2>&1 | grep -v Warning | sed "s/^/$mode: /" | tail -8
done
echo "== where a tiny jitted allreduce spends its time ($(date +%T))"
timeout 60 python3 benchmarks/jax_jit_latency.py 2>&1 | grep size
timeout 90 python3 -m nezha.runner.launch -np 2 python3 benchmarks/jax_jit_latency.py 2>&1 | grep size
NEZHA_JAX_FORCE_CALLBACK=1 timeout 60 python3 benchmarks/jax_jit_latency.py 2>&1 | grep size
fi
echo "== done ($(date +%T))"

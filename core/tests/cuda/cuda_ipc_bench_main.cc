// nezha-cuda-ipc-bench: times allreduces of float32 device buffers through the CUDA IPC lane with
// ranks as processes on GPU 0 (cuda_ranks.h), checks the first result of each size against the CPU
// kernels' rank-order reduction, and prints JSON records in nezha-bench's shape (op, bytes, dtype,
// ranks, impl, time_us = the slowest rank's median, algbw_gbps, busbw_gbps) plus `ok`.
//
//   nezha-cuda-ipc-bench [--ranks 4] [--sizes 8,64M] [--iters 20] [--json FILE]
//                        [--chunk 16M] [--slots 2] [--small 256K] [--spin-us 20]
//
// The last four set the lane's CudaIpcLaneConfig (defaults: the lane's own), so that one run on a
// GPU machine compares pipeline shapes side by side.
//
// Exit status: 0 all results correct, 1 a wrong result or a failed rank, 2 no usable GPU or bad
// arguments.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "collectives/reduce.h"
#include "cuda/cuda_ipc_lane.h"
#include "cuda/cuda_ranks.h"

namespace {

using namespace nezha;
using namespace nezha::cuda;

size_t parse_size(const std::string& s) {
  size_t mult = 1;
  std::string digits = s;
  const char suffix = s.empty() ? 0 : s.back();
  if (suffix == 'K' || suffix == 'k') mult = 1 << 10;
  if (suffix == 'M' || suffix == 'm') mult = 1 << 20;
  if (suffix == 'G' || suffix == 'g') mult = size_t{1} << 30;
  if (mult != 1) digits.pop_back();
  return std::stoull(digits) * mult;
}

float value(int rank, size_t i) { return static_cast<float>(static_cast<int>((i * 7 + rank * 13) % 19) - 9) * 0.25f; }

// One rank: for each size, a checked allreduce, warm-ups, then `iters` timed ones; reports
// "ok|bad t_us_size0 t_us_size1 ...".
int bench_rank(int rank, const std::string& dir, int ranks, const std::vector<size_t>& sizes, int iters,
               CudaIpcLaneConfig config) {
  testing::CudaRank cr = testing::CudaRank::open();
  config.secret = "nezha-cuda-ipc-bench-" + std::to_string(::getppid());
  CudaIpcLane lane(config, rank, ranks);
  const Deadline deadline = Deadline::after_seconds(120);
  lane.connect(testing::exchange_addresses(dir, rank, ranks, lane.local_address(), deadline), deadline);
  std::ostringstream out;
  bool ok = true;
  uint64_t seq = 0;
  for (size_t bytes : sizes) {
    const size_t count = std::max<size_t>(1, bytes / sizeof(float));
    std::vector<float> in(count), want(count), got(count);
    for (size_t i = 0; i < count; ++i) in[i] = value(rank, i), want[i] = value(0, i);
    for (int r = 1; r < ranks; ++r) {
      std::vector<float> other(count);
      for (size_t i = 0; i < count; ++i) other[i] = value(r, i);
      collectives::reduce_into(want.data(), other.data(), count, DataType::kFloat32, ReduceOp::kSum);
    }
    const CudaDriver::DevicePtr d_in = cr.alloc(count * 4), d_out = cr.alloc(count * 4);
    cr.upload(d_in, in.data(), count * 4);
    lane.allreduce(d_in, d_out, count, DataType::kFloat32, ReduceOp::kSum, cr.stream, seq++, deadline);
    cr.download(got.data(), d_out, count * 4);
    ok &= std::memcmp(got.data(), want.data(), count * 4) == 0;
    for (int i = 0; i < 3; ++i)
      lane.allreduce(d_in, d_out, count, DataType::kFloat32, ReduceOp::kSum, cr.stream, seq++, deadline);
    std::vector<double> times;
    for (int i = 0; i < iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      lane.allreduce(d_in, d_out, count, DataType::kFloat32, ReduceOp::kSum, cr.stream, seq++, deadline);
      times.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    out << " " << times[times.size() / 2];
    cr.cuda->mem_free(d_in);
    cr.cuda->mem_free(d_out);
  }
  lane.close();
  testing::report(dir, rank, (ok ? "ok" : "bad") + out.str());
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 4, iters = 20;
  std::vector<size_t> sizes = {8, 64 << 20};
  CudaIpcLaneConfig config;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--ranks" && has_value) ranks = std::stoi(argv[++i]);
    else if (a == "--iters" && has_value) iters = std::max(1, std::stoi(argv[++i]));
    else if (a == "--json" && has_value) json = argv[++i];
    else if (a == "--chunk" && has_value) config.chunk_bytes = parse_size(argv[++i]);
    else if (a == "--slots" && has_value) config.slots = static_cast<uint32_t>(std::stoul(argv[++i]));
    else if (a == "--small" && has_value) config.small_bytes = parse_size(argv[++i]);
    else if (a == "--spin-us" && has_value) config.spin_us = std::stod(argv[++i]);
    else if (a == "--sizes" && has_value) {
      sizes.clear();
      std::stringstream list(argv[++i]);
      for (std::string item; std::getline(list, item, ',');) sizes.push_back(parse_size(item));
    } else {
      std::fprintf(stderr,
                   "usage: %s [--ranks N] [--sizes 8,64M] [--iters N] [--json FILE] [--chunk BYTES] [--slots N] "
                   "[--small BYTES] [--spin-us US]\n",
                   argv[0]);
      return 2;
    }
  }
  const std::string why = testing::cuda_unavailable();
  if (!why.empty()) {
    std::fprintf(stderr, "nezha-cuda-ipc-bench: no usable CUDA GPU: %s\n", why.c_str());
    return 2;
  }
  const auto outcomes = testing::run_ranks(
      ranks, [&](int r, const std::string& dir) { return bench_rank(r, dir, ranks, sizes, iters, config); }, 300);
  std::vector<double> slowest(sizes.size(), 0);
  bool ok = true;
  for (int r = 0; r < ranks; ++r) {
    std::istringstream rep(outcomes[r].report);
    std::string status;
    rep >> status;
    if (outcomes[r].exit_code != 0 || status != "ok") {
      std::fprintf(stderr, "rank %d: exit %d signal %d: %s\n", r, outcomes[r].exit_code, outcomes[r].signal,
                   outcomes[r].report.c_str());
      ok = false;
      continue;
    }
    for (double& s : slowest) {
      double t = 0;
      rep >> t;
      s = std::max(s, t);
    }
  }
  std::ostringstream records;
  records << "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    const double bytes = static_cast<double>(std::max<size_t>(4, sizes[i] / 4 * 4));
    const double algbw = slowest[i] > 0 ? bytes * 8 / (slowest[i] * 1e3) : 0;  // Gbit/s
    records << (i ? ",\n " : "") << "{\"op\": \"allreduce\", \"bytes\": " << static_cast<size_t>(bytes)
            << ", \"dtype\": \"float32\", \"ranks\": " << ranks << ", \"impl\": \"cudaipc\", \"time_us\": "
            << slowest[i] << ", \"algbw_gbps\": " << algbw << ", \"busbw_gbps\": "
            << algbw * 2 * (ranks - 1) / ranks << ", \"ok\": " << (ok ? "true" : "false") << "}";
  }
  records << "]\n";
  std::fputs(records.str().c_str(), stdout);
  if (!json.empty()) {
    if (FILE* f = std::fopen(json.c_str(), "w")) {
      std::fputs(records.str().c_str(), f);
      std::fclose(f);
    }
  }
  return ok ? 0 : 1;
}

// Ranks as processes for the CUDA IPC lane's tests and benchmark: forks N children (CUDA is never
// initialised in the parent: a forked CUDA context is unusable), gives each its own context on GPU 0
// and a stream, exchanges lane addresses through files in a fresh directory, and collects what each
// child reported (a line of text) and how it ended. Header-only, no GoogleTest: the benchmark uses it.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/cuda_driver.h"
#include "common/deadline.h"

namespace nezha::cuda::testing {

// This process's CUDA: the primary context of device 0, current on the calling thread, and a stream.
struct CudaRank {
  const CudaDriver* cuda = nullptr;
  CudaDriver::Stream stream = nullptr;

  static CudaRank open() {
    CudaRank r;
    r.cuda = &CudaDriver::get();
    const CudaDriver& c = *r.cuda;
    c.check(c.init(0), "cuInit");
    CudaDriver::Device dev = 0;
    c.check(c.device_get(&dev, 0), "cuDeviceGet(0)");
    CudaDriver::Context ctx = nullptr;
    c.check(c.primary_ctx_retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    c.check(c.ctx_set_current(ctx), "cuCtxSetCurrent");
    c.check(c.stream_create(&r.stream, CudaDriver::kStreamNonBlocking), "cuStreamCreate");
    return r;
  }
  CudaDriver::DevicePtr alloc(size_t bytes) const {
    CudaDriver::DevicePtr p = 0;
    cuda->check(cuda->mem_alloc(&p, bytes == 0 ? 1 : bytes), "cuMemAlloc");
    return p;
  }
  void upload(CudaDriver::DevicePtr dst, const void* src, size_t bytes) const {
    cuda->check(cuda->memcpy_htod_async(dst, src, bytes, stream), "cuMemcpyHtoDAsync");
    cuda->check(cuda->stream_synchronize(stream), "cuStreamSynchronize");
  }
  void download(void* dst, CudaDriver::DevicePtr src, size_t bytes) const {
    cuda->check(cuda->memcpy_dtoh_async(dst, src, bytes, stream), "cuMemcpyDtoHAsync");
    cuda->check(cuda->stream_synchronize(stream), "cuStreamSynchronize");
  }
};

struct RankOutcome {
  int exit_code = -1;  // -1: killed by a signal (then `signal`)
  int signal = 0;
  std::string report;  // what the child wrote with report()
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void report(const std::string& dir, int rank, const std::string& text) {
  const std::string path = dir + "/report." + std::to_string(rank);
  std::ofstream(path + ".tmp") << text;
  std::rename((path + ".tmp").c_str(), path.c_str());
}

// Publishes this rank's address and returns every rank's, waiting for the others until the deadline.
inline std::vector<std::string> exchange_addresses(const std::string& dir, int rank, int size, const std::string& mine,
                                                   const Deadline& deadline) {
  const std::string path = dir + "/address." + std::to_string(rank);
  std::ofstream(path + ".tmp", std::ios::binary) << mine;
  std::rename((path + ".tmp").c_str(), path.c_str());
  std::vector<std::string> all(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    const std::string theirs = dir + "/address." + std::to_string(r);
    while (::access(theirs.c_str(), F_OK) != 0) {
      if (deadline.expired()) throw std::runtime_error("rank " + std::to_string(r) + " never published its address");
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    all[r] = read_file(theirs);
  }
  return all;
}

// Runs body(rank, dir) in `size` forked children; a child's exit code is body's return value (an
// exception is reported and exits 3). Children still running after timeout_s are killed.
inline std::vector<RankOutcome> run_ranks(int size, const std::function<int(int rank, const std::string& dir)>& body,
                                          double timeout_s) {
  char tmpl[] = "/tmp/nezha-cuda-ranks-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
  const std::string dir = tmpl;
  std::vector<pid_t> pids;
  for (int r = 0; r < size; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 3;
      try {
        code = body(r, dir);
      } catch (const std::exception& e) {
        report(dir, r, std::string("exception: ") + e.what());
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<RankOutcome> out(static_cast<size_t>(size));
  std::vector<bool> done(static_cast<size_t>(size), false);
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (int left = size; left > 0;) {
    for (int r = 0; r < size; ++r) {
      if (done[r]) continue;
      int status = 0;
      if (::waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
      done[r] = true;
      --left;
      if (WIFEXITED(status)) out[r].exit_code = WEXITSTATUS(status);
      else out[r].signal = WTERMSIG(status);
    }
    if (left > 0 && std::chrono::steady_clock::now() > end) {
      for (int r = 0; r < size; ++r)
        if (!done[r]) ::kill(pids[r], SIGKILL);
    }
    if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int r = 0; r < size; ++r) out[r].report = read_file(dir + "/report." + std::to_string(r));
  std::system(("rm -rf '" + dir + "'").c_str());
  return out;
}

// Why this machine cannot run the lane (empty if it can): no driver, no device. Asked in a child so
// the parent never initialises CUDA.
inline std::string cuda_unavailable() {
  auto outcome = run_ranks(1, [](int, const std::string& dir) {
    try {
      const CudaDriver& c = CudaDriver::get();
      if (const int r = c.init(0); r != 0) {
        const char* s = nullptr;
        c.get_error_string(r, &s);
        report(dir, 0, std::string("cuInit failed: ") + (s ? s : "unknown error"));
        return 1;
      }
      int n = 0;
      if (c.device_get_count(&n) != 0 || n == 0) {
        report(dir, 0, "the CUDA driver sees no GPU");
        return 1;
      }
      return 0;
    } catch (const std::exception& e) {
      report(dir, 0, e.what());
      return 1;
    }
  }, 60);
  if (outcome[0].exit_code == 0) return "";
  return outcome[0].report.empty() ? "the CUDA probe process failed" : outcome[0].report;
}

}  // namespace nezha::cuda::testing

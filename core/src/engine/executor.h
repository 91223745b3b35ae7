// Runs negotiated operations on the rails. The engine thread calls execute() for each response in
// the order the coordinator sent it; the executor copies inputs into a fusion buffer when several
// tensors were fused, posts each rail's share to that rail's worker, and completes the handles when
// the last share finishes. Rails run independently: a slow rail delays only the operations that
// have a share on it.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/buffer_pool.h"
#include "engine/handle.h"
#include "engine/rail_worker.h"
#include "engine/request.h"
#include "transport/rail.h"

namespace nezha::engine {

// A tensor submitted on this rank, waiting for (or in) execution.
struct TensorEntry {
  Request req;
  const void* input = nullptr;
  void* output = nullptr;  // caller's output (allreduce, broadcast); engine allocates the others
  std::shared_ptr<OpHandle> handle;
};

struct ExecutorOptions {
  int rank = 0;
  int size = 1;
  double timeout_s = 30;
  size_t segment_bytes = 1 << 20;
  size_t logstep_max_bytes = 65536;
  size_t inline_max_bytes = 65536;  // allreduces up to this size may run on the engine thread
};

// Called from rail workers after each allreduce share (and calibration): which rail, how many
// bytes, when it started and how long it took, and what it carried. Feeds the cost model and the
// timeline.
using ShareObserver = std::function<void(int rail, size_t bytes, Clock::time_point start,
                                         double seconds, const std::string& what)>;

class Executor {
 public:
  Executor(ExecutorOptions opt, std::vector<transport::Rail*> rails, ShareObserver observer);
  ~Executor();

  // entries[i] belongs to resp.names[i]; an entry with no handle means this rank has joined and
  // takes part with zeros.
  void execute(const Response& resp, std::vector<TensorEntry> entries);

  // Times a float32 allreduce of `bytes` on one rail (all ranks call it in the same order) and
  // reports it to the observer: how the cost model learns every rail before real traffic.
  void calibrate(int rail, size_t bytes);

  // Waits until every posted job has run (bounded); stops the workers.
  void stop();

 private:
  struct AllreduceJob;
  void run_allreduce(const Response& resp, std::vector<TensorEntry> entries);
  void run_on_one_rail(const Response& resp, std::vector<TensorEntry> entries);
  static void finish_allreduce(AllreduceJob& job);

  ExecutorOptions opt_;
  std::vector<transport::Rail*> rails_;
  ShareObserver observer_;
  BufferPool pool_;
  std::vector<uint64_t> seq_;  // next operation number per rail (engine thread only)
  std::vector<std::unique_ptr<RailWorker>> workers_;  // last: destroyed first
};

}  // namespace nezha::engine

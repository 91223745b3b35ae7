// Test-only collective rail: ranks as threads of one process meet in a SharedSum, which sums their
// float32 inputs in rank order (the same bits on every rank). One SharedSum serves one allreduce.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.h"
#include "transport/collective_rail.h"

namespace nezha::testing {

// The ranks' meeting point for one float32 sum: each rank deposits its input, and once all have,
// each reads the sum in rank order (the same bits on every rank).
class SharedSum {
 public:
  explicit SharedSum(int size) : inputs_(static_cast<size_t>(size)) {}
  void deposit(int rank, const float* in, size_t count) {
    std::lock_guard<std::mutex> lock(mu_);
    inputs_[static_cast<size_t>(rank)].assign(in, in + count);
    if (++arrived_ == inputs_.size()) cv_.notify_all();
  }
  // False if not every rank arrived within the deadline.
  bool sum_into(float* out, size_t count, const Deadline& deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_until(lock, deadline.at(), [&] { return arrived_ == inputs_.size(); })) return false;
    for (size_t i = 0; i < count; ++i) {
      float acc = inputs_[0][i];
      for (size_t r = 1; r < inputs_.size(); ++r) acc += inputs_[r][i];
      out[i] = acc;
    }
    return true;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::vector<float>> inputs_;
  size_t arrived_ = 0;
};

// A collective rail of ranks as threads: it reduces float32 Sum (and Average, scaled by the caller)
// through a SharedSum, announcing the whole output to before_overwrite before writing it.
class ThreadSumRail final : public transport::CollectiveRail {
 public:
  ThreadSumRail(SharedSum& sum, int rank, int size, size_t max_share_bytes)
      : sum_(sum), rank_(rank), size_(size) {
    props_.name = "threadsum";
    props_.kind = "threadsum";
    props_.max_share_bytes = max_share_bytes;
  }
  const transport::RailProperties& properties() const override { return props_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string local_address() const override { return {}; }
  void connect(const std::vector<std::string>&, const Deadline&) override {}
  void reset() override {}
  void close() override {}
  transport::RailCounters counters() const override { return {bytes_sent_.load(), 0}; }
  void abort(const std::string&) override {}

  bool reduces(DataType dtype, ReduceOp op) const override {
    return dtype == DataType::kFloat32 && (op == ReduceOp::kSum || op == ReduceOp::kAverage);
  }
  std::unique_ptr<transport::CollectiveRequest> start_allreduce(const void* input, void* output, size_t count,
                                                                 DataType, ReduceOp, uint64_t,
                                                                 OverwriteHook before_overwrite) override {
    sum_.deposit(rank_, static_cast<const float*>(input), count);
    bytes_sent_ += count * sizeof(float);
    return std::make_unique<Request>(sum_, static_cast<float*>(output), count, std::move(before_overwrite));
  }

 private:
  class Request : public transport::CollectiveRequest {
   public:
    Request(SharedSum& sum, float* out, size_t count, OverwriteHook hook)
        : sum_(sum), out_(out), count_(count), hook_(std::move(hook)) {}
    bool test() override { return done_ || (done_ = finish(Deadline::after_seconds(0))); }
    void wait(const Deadline& deadline) override {
      if (!done_ && !(done_ = finish(deadline))) throw TimeoutError(-1, "threadsum: a rank never arrived");
    }

   private:
    SharedSum& sum_;
    float* out_;
    size_t count_;
    OverwriteHook hook_;
    bool done_ = false;

    bool finish(const Deadline& deadline) {
      if (hook_) hook_(0, count_ * sizeof(float));
      hook_ = nullptr;  // announced once
      return sum_.sum_into(out_, count_, deadline);
    }
  };

  SharedSum& sum_;
  const int rank_, size_;
  transport::RailProperties props_;
  std::atomic<uint64_t> bytes_sent_{0};
};

}  // namespace nezha::testing

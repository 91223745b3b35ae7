// A Chrome-trace timeline of engine activity (NEZHA_TIMELINE=<file>, nezharun --timeline FILE),
// viewable in chrome://tracing or Perfetto: per tensor, the time from submission until the
// coordinator scheduled it (async events on the "negotiate" row), and per rail, every share that
// rail carried (complete events on one row per rail), and the small collectives rank 0 did within
// negotiation (instant "control" events). Thread-safe; does nothing when disabled.
#pragma once

#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "common/deadline.h"

namespace nezha::engine {

class Timeline {
 public:
  Timeline() = default;
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Starts writing to `path` with "{rank}" replaced by `rank` (empty: stays disabled). Throws
  // NezhaError if it cannot be opened.
  void open(const std::string& path, int rank, const std::vector<std::string>& rail_names);
  bool enabled() const { return file_ != nullptr; }

  void negotiation_started(const std::string& tensor);
  void negotiation_finished(const std::string& tensor);
  // A collective rank 0 did within negotiation (control_inline.h), or every rank did from the host
  // board (host_vote.h; reduced_by "every rank"): an instant event, no rail.
  void done_by_coordinator(const std::string& tensor, size_t bytes, const char* reduced_by = "rank 0");
  // `rail_seconds`: the part of `seconds` the cost model learned (args.rail_us; see ShareObserver).
  void share_done(int rail, const std::string& what, Clock::time_point start, double seconds,
                  double rail_seconds, size_t bytes);
  void close();

 private:
  double micros(Clock::time_point t) const;
  void negotiation_event(const std::string& tensor, char phase);  // async begin 'b' / end 'e'
  void write_event(const std::string& json);

  std::mutex mu_;
  std::FILE* file_ = nullptr;
  int rank_ = 0;
  Clock::time_point origin_;
};

}  // namespace nezha::engine

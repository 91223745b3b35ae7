// Test helper: a nezha-aggd in-process on loopback and a job of n aggregation rails (ranks as threads).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "aggd/agg_daemon.h"
#include "transport/agg/agg_rail.h"
#include "transport/rank_threads.h"

namespace nezha::aggd::testing {

inline std::unique_ptr<AggDaemon> start_daemon(const std::string& secret = "daemon-key",
                                               size_t pool_bytes = size_t{256} << 20,
                                               double job_timeout_s = 30) {
  AggDaemonOptions o;
  o.listen = "127.0.0.1:0";
  o.secret = secret;
  o.pool_bytes = pool_bytes;
  o.job_timeout_s = job_timeout_s;
  auto d = std::make_unique<AggDaemon>(o);
  d->start();
  return d;
}

struct AggJobRails {
  std::vector<std::unique_ptr<transport::AggRail>> rails;
  std::vector<std::string> addresses;
};

// n rails of one job (not yet connected); chunk_bytes small so tests reach many chunks and the window.
inline AggJobRails make_job(const AggDaemon& d, int n, const std::string& secret = "daemon-key",
                            size_t chunk_bytes = 4096, uint32_t window = 4) {
  AggJobRails job;
  for (int r = 0; r < n; ++r) {
    transport::AggRailConfig c;
    c.name = "agg-test";
    c.daemon = d.address();
    c.secret = secret;
    c.chunk_bytes = chunk_bytes;
    c.window = window;
    job.rails.push_back(std::make_unique<transport::AggRail>(c, r, n));
    job.addresses.push_back(job.rails.back()->local_address());
  }
  return job;
}

inline void connect_all(AggJobRails& job, double timeout_s = 10) {
  transport::testing::run_ranks(static_cast<int>(job.rails.size()), [&](int r) {
    job.rails[r]->connect(job.addresses, Deadline::after_seconds(timeout_s));
  });
}

}  // namespace nezha::aggd::testing

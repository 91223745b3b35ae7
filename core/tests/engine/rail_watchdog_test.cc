// RailWatchdog: reports a busy rail that moves no data, learns the pauses of healthy operations.
#include "engine/rail_watchdog.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace nezha::engine {
namespace {

using std::chrono::milliseconds;

struct Harness {
  std::atomic<uint64_t> bytes[2] = {{0}, {0}};
  std::mutex mu;
  std::vector<int> reports;
  RailWatchdog dog{2, 0.05, [this](int r) { return bytes[r].load(); },
                   [this](int r, const std::string&) {
                     std::lock_guard<std::mutex> lock(mu);
                     reports.push_back(r);
                   }};
  size_t count() {
    std::lock_guard<std::mutex> lock(mu);
    return reports.size();
  }
};

TEST(RailWatchdog, ReportsABusyRailThatMovesNothing) {
  Harness h;
  h.dog.begin(1, "share");
  std::this_thread::sleep_for(milliseconds(150));
  h.dog.end(1, false);
  ASSERT_GE(h.count(), 1u);
  EXPECT_EQ(h.reports[0], 1);
}

TEST(RailWatchdog, ProgressAndIdleRailsAreNotReported) {
  Harness h;
  h.dog.begin(0, "share");
  for (int i = 0; i < 15; ++i) {
    h.bytes[0] += 100;
    std::this_thread::sleep_for(milliseconds(10));
  }
  h.dog.end(0, true);
  std::this_thread::sleep_for(milliseconds(150));  // idle: nothing to watch
  EXPECT_EQ(h.count(), 0u);
}

TEST(RailWatchdog, LimitGrowsWithPausesOfHealthyOperations) {
  Harness h;
  EXPECT_NEAR(h.dog.limit_s(0), 0.05, 1e-9);
  h.dog.begin(0, "slow but healthy");
  std::this_thread::sleep_for(milliseconds(40));  // a pause below the limit, then it completes
  h.bytes[0] += 1;
  h.dog.end(0, true);
  EXPECT_GE(h.dog.limit_s(0), 0.1);  // about 3 x 40 ms
  EXPECT_NEAR(h.dog.limit_s(1), 0.05, 1e-9);  // per rail
  // A later pause of the same length is now well inside the limit.
  h.dog.begin(0, "again");
  std::this_thread::sleep_for(milliseconds(70));
  h.bytes[0] += 1;
  h.dog.end(0, true);
  EXPECT_EQ(h.count(), 0u);
}

}  // namespace
}  // namespace nezha::engine

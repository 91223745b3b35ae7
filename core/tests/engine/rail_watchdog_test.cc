// RailWatchdog: reports a busy rail that moves no data, learns the pauses of healthy operations.
#include "engine/failover/rail_watchdog.h"

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
  explicit Harness(double min_silence_s = 0.05)
      : dog{2, min_silence_s, [this](int r) { return bytes[r].load(); },
            [this](int r, const std::string&) {
              std::lock_guard<std::mutex> lock(mu);
              reports.push_back(r);
            }} {}
  std::atomic<uint64_t> bytes[2] = {{0}, {0}};
  std::mutex mu;
  std::vector<int> reports;
  RailWatchdog dog;
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

// One healthy operation: its first byte, then a pause of `pause`, then the rest and the end. The
// pause the watchdog sees runs from its first sample of the first byte (within one 12.5 ms tick),
// so it is `pause` to `pause` + 15 ms.
void healthy_op(Harness& h, int rail, milliseconds pause) {
  h.dog.begin(rail, "healthy");
  h.bytes[rail] += 1;
  std::this_thread::sleep_for(milliseconds(15));
  std::this_thread::sleep_for(pause);
  h.bytes[rail] += 1;
  h.dog.end(rail, true);
}

TEST(RailWatchdog, LimitGrowsWithPausesOfHealthyOperations) {
  Harness h;
  EXPECT_NEAR(h.dog.limit_s(0), 0.05, 1e-9);
  // A pause below the limit, then it completes. A watchdog thread starved of CPU (sanitizers on a
  // loaded host) may take its first sample after the pause and so see none: up to three tries.
  for (int i = 0; i < 3 && h.dog.limit_s(0) < 0.075; ++i) healthy_op(h, 0, milliseconds(30));
  EXPECT_GE(h.dog.limit_s(0), 0.075);  // about 3 x 30 ms
  EXPECT_NEAR(h.dog.limit_s(1), 0.05, 1e-9);  // per rail
  // A later, longer pause is now inside the limit.
  healthy_op(h, 0, milliseconds(60));
  EXPECT_EQ(h.count(), 0u);
}

TEST(RailWatchdog, WaitingForTheFirstByteIsNotLearnedAsAPause) {
  // Peers arriving late (startup skew) must not raise the limit: it once grew past a cable cut.
  Harness h;
  h.dog.begin(0, "peers late");
  std::this_thread::sleep_for(milliseconds(40));
  h.bytes[0] += 1;
  h.dog.end(0, true);
  EXPECT_LT(h.dog.limit_s(0), 0.1);  // learning the 40 ms wait would make it 3 x 40 ms
}

TEST(RailWatchdog, LearnedLimitIsCappedAtOneSecond) {
  // A 200 ms floor leaves every pause at least ~85 ms inside the limit learned before it (each
  // pause is measured up to 15 ms long, plus whatever a loaded machine adds to a sleep): with the
  // 50 ms floor and 30 -> 70 ms, 5 ms of oversleep made this fail under a parallel build.
  Harness h(0.2);
  for (int pause_ms : {30, 100, 200, 400}) healthy_op(h, 0, milliseconds(pause_ms));
  EXPECT_EQ(h.count(), 0u);  // each pause was inside the limit learned before it
  EXPECT_NEAR(h.dog.limit_s(0), 1.0, 1e-9);  // 3 x 400 ms, capped
}

}  // namespace
}  // namespace nezha::engine

namespace nezha::engine {
namespace {

TEST(RailWatchdog, ARailsOwnFloorHoldsItsReportsBackAndIsCappedAtOneSecond) {
  Harness h;  // shared floor 50 ms
  h.dog.set_min_silence(1, 0.4);
  EXPECT_DOUBLE_EQ(h.dog.limit_s(1), 0.4);
  EXPECT_DOUBLE_EQ(h.dog.limit_s(0), 0.05);
  h.dog.begin(0, "share");
  h.dog.begin(1, "share");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // rail 0 past its limit, rail 1 not
  h.dog.end(0, false);
  h.dog.end(1, false);
  ASSERT_GE(h.count(), 1u);
  for (int r : h.reports) EXPECT_EQ(r, 0);
  h.dog.set_min_silence(1, 5);
  EXPECT_DOUBLE_EQ(h.dog.limit_s(1), 1.0);
}

// A rail whose link is gone is reported through on_link_lost within a few link ticks (10 ms), long
// before the silence limit, once per operation, even while it still moves bytes; a rail whose
// link is up is not; with no rail working, no link is checked at all.
TEST(RailWatchdog, ALostLinkIsReportedAtOnceAndOncePerOperation) {
  std::atomic<uint64_t> bytes{0};
  std::atomic<bool> carrier{true};
  std::atomic<int> link_checks{0};
  std::mutex mu;
  std::vector<std::string> lost;
  std::atomic<int> stalls{0};
  RailWatchdog dog{
      1, 1.0, [&](int) { return bytes.load(); }, [&](int, const std::string&) { ++stalls; },
      [&](int) {
        ++link_checks;
        return carrier ? std::string() : std::string("interface rail9 has no carrier");
      },
      [&](int rail, const std::string& what) {
        std::lock_guard<std::mutex> lock(mu);
        lost.push_back(std::to_string(rail) + ": " + what);
      }};
  auto lost_count = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return lost.size();
  };
  std::this_thread::sleep_for(milliseconds(60));
  EXPECT_EQ(link_checks.load(), 0) << "an idle rail's link was checked";

  dog.begin(0, "share A");
  for (int i = 0; i < 5; ++i) {  // working, link up
    bytes += 100;
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_EQ(lost_count(), 0u);
  EXPECT_GT(link_checks.load(), 0);
  carrier = false;
  const auto cut = std::chrono::steady_clock::now();
  while (lost_count() == 0 && std::chrono::steady_clock::now() - cut < std::chrono::seconds(5)) {
    bytes += 100;  // data still moving (socket buffers drain): the link is what counts
    std::this_thread::sleep_for(milliseconds(2));
  }
  const double waited_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - cut).count();
  ASSERT_EQ(lost_count(), 1u);
  EXPECT_LT(waited_ms, 500.0) << "a generous bound: the link is checked every 10 ms";
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(lost_count(), 1u) << "reported more than once per operation";
  dog.end(0, false);
  dog.begin(0, "share B");  // the next operation on the same dead link: reported again
  std::this_thread::sleep_for(milliseconds(100));
  dog.end(0, false);
  dog.stop();
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(lost.size(), 2u);
  EXPECT_NE(lost[0].find("0: share A lost its link: interface rail9 has no carrier"), std::string::npos) << lost[0];
  EXPECT_NE(lost[1].find("share B"), std::string::npos) << lost[1];
  EXPECT_EQ(stalls.load(), 0) << "a lost link is not also reported as silence";
}

// While one rail works, an idle rail's link is checked too, and its loss reported once per loss: the
// host whose share on the cut rail is done can tell, while a peer still waits for its last bytes.
// With no rail working, no link is checked at all.
TEST(RailWatchdog, AnIdleRailsLostLinkIsReportedWhileAnotherRailWorks) {
  std::atomic<uint64_t> bytes{0};
  std::atomic<bool> carrier1{true};
  std::atomic<int> checks1{0}, stalls{0};
  std::mutex mu;
  std::vector<std::string> lost;
  RailWatchdog dog{
      2, 1.0, [&](int) { return bytes.load(); }, [&](int, const std::string&) { ++stalls; },
      [&](int rail) {
        if (rail == 0) return std::string();
        ++checks1;
        return carrier1 ? std::string() : std::string("interface rail1 has no carrier");
      },
      [&](int rail, const std::string& what) {
        std::lock_guard<std::mutex> lock(mu);
        lost.push_back(std::to_string(rail) + ": " + what);
      }};
  auto lost_count = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return lost.size();
  };
  auto wait_for_reports = [&](size_t n) {
    const auto start = std::chrono::steady_clock::now();
    while (lost_count() < n && std::chrono::steady_clock::now() - start < std::chrono::seconds(5)) {
      bytes += 100;  // rail 0 keeps moving data
      std::this_thread::sleep_for(milliseconds(2));
    }
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  };
  carrier1 = false;
  std::this_thread::sleep_for(milliseconds(60));
  EXPECT_EQ(checks1.load(), 0) << "a link was checked while no rail works";
  carrier1 = true;

  dog.begin(0, "share on rail 0");
  bytes += 100;
  std::this_thread::sleep_for(milliseconds(40));
  EXPECT_GT(checks1.load(), 0) << "the idle rail's link was not checked while rail 0 works";
  EXPECT_EQ(lost_count(), 0u);
  carrier1 = false;
  EXPECT_LT(wait_for_reports(1), 500.0) << "a generous bound: the link is checked every 10 ms";
  auto keep_rail0_busy = [&](int ticks) {
    for (int i = 0; i < ticks; ++i) {
      bytes += 100;
      std::this_thread::sleep_for(milliseconds(10));
    }
  };
  keep_rail0_busy(20);
  EXPECT_EQ(lost_count(), 1u) << "one loss reported more than once";
  carrier1 = true;  // plugged back (and seen so), then pulled again: a new loss
  const int seen = checks1.load();
  for (int i = 0; i < 500 && checks1.load() < seen + 2; ++i) keep_rail0_busy(1);
  carrier1 = false;
  wait_for_reports(2);
  dog.end(0, true);
  dog.stop();
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(lost.size(), 2u);
  EXPECT_EQ(lost[0], "1: between operations, lost its link: interface rail1 has no carrier");
  EXPECT_EQ(lost[1], lost[0]);
  EXPECT_EQ(stalls.load(), 0);
}

// An operation's link loss is not reported again once the operation ends and the rail is idle.
TEST(RailWatchdog, ALossReportedDuringAnOperationIsNotReportedAgainWhenIdle) {
  std::atomic<uint64_t> bytes{0};
  std::atomic<int> lost{0};
  RailWatchdog dog{
      2, 1.0, [&](int) { return bytes.load(); }, [](int, const std::string&) {},
      [&](int rail) { return rail == 1 ? std::string("interface rail1 has no carrier") : std::string(); },
      [&](int, const std::string&) { ++lost; }};
  dog.begin(1, "share on rail 1");  // first: an idle rail 1 beside a working rail 0 would be reported idle
  dog.begin(0, "share on rail 0");
  const auto start = std::chrono::steady_clock::now();
  while (lost.load() == 0 && std::chrono::steady_clock::now() - start < std::chrono::seconds(5)) {
    bytes += 100;
    std::this_thread::sleep_for(milliseconds(2));
  }
  ASSERT_EQ(lost.load(), 1);
  dog.end(1, false);
  for (int i = 0; i < 20; ++i) {  // rail 0 still works: rail 1 is checked, idle
    bytes += 100;
    std::this_thread::sleep_for(milliseconds(10));
  }
  dog.end(0, true);
  EXPECT_EQ(lost.load(), 1);
}

// After its operation, a rail whose sent bytes are not yet acknowledged keeps its link watched
// (its peer may be waiting for them); once they are, or with the link intact for 1 s, nothing is
// checked any more.
TEST(RailWatchdog, ARailsLinkStaysWatchedUntilWhatItSentIsAcknowledged) {
  std::atomic<bool> carrier{true}, acknowledged{false};
  std::atomic<int> checks{0}, lost{0};
  RailWatchdog dog{
      1, 1.0, [](int) { return uint64_t{0}; }, [](int, const std::string&) {},
      [&](int) {
        ++checks;
        return carrier ? std::string() : std::string("interface rail0 has no carrier");
      },
      [&](int, const std::string&) { ++lost; },
      [&](int, std::chrono::milliseconds quiet) { return quiet.count() == 0 && acknowledged.load(); }};
  dog.begin(0, "share");
  std::this_thread::sleep_for(milliseconds(20));
  dog.end(0, true);  // its last bytes in flight
  std::this_thread::sleep_for(milliseconds(40));
  carrier = false;
  const auto cut = std::chrono::steady_clock::now();
  while (lost.load() == 0 && std::chrono::steady_clock::now() - cut < std::chrono::seconds(5))
    std::this_thread::sleep_for(milliseconds(2));
  EXPECT_EQ(lost.load(), 1) << "the cut under its undelivered bytes was not reported";
  const double waited_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - cut).count();
  EXPECT_LT(waited_ms, 500.0) << "a generous bound: the link is checked every 10 ms";

  // How long the link stays checked after end(): until the checks stop for 100 ms.
  auto watched_for_ms = [&] {
    const auto ended = std::chrono::steady_clock::now();
    int last = checks.load();
    auto quiet_since = ended;
    while (std::chrono::steady_clock::now() - quiet_since < milliseconds(100) &&
           std::chrono::steady_clock::now() - ended < std::chrono::seconds(5)) {
      std::this_thread::sleep_for(milliseconds(5));
      if (checks.load() != last) {
        last = checks.load();
        quiet_since = std::chrono::steady_clock::now();
      }
    }
    return std::chrono::duration<double, std::milli>(quiet_since - ended).count();
  };
  carrier = true;
  dog.begin(0, "share");
  std::this_thread::sleep_for(milliseconds(20));
  acknowledged = true;  // everything it sent arrived: no reason to watch
  dog.end(0, true);
  EXPECT_LT(watched_for_ms(), 700.0) << "a drained idle rail's link was watched on";

  acknowledged = false;  // a rail that cannot tell: watched for the 1 s bound, then not
  dog.begin(0, "share");
  dog.end(0, true);
  const double watched_ms = watched_for_ms();
  EXPECT_GT(watched_ms, 800.0);
  EXPECT_LT(watched_ms, 3000.0) << "watched well past the 1 s bound";
  EXPECT_EQ(lost.load(), 1);
}

// A paused rail (its worker waits for a claim, not for data) may stay silent past the limit; its
// link is still checked, so a rank waiting for a claim its cut link will never bring is reported;
// after begin() its silence counts again.
TEST(RailWatchdog, APausedRailsSilenceIsNotReportedButItsLostLinkIs) {
  std::atomic<uint64_t> bytes{0};
  std::atomic<bool> carrier{true};
  std::atomic<int> stalls{0}, lost{0};
  RailWatchdog dog{
      1, 0.05, [&](int) { return bytes.load(); }, [&](int, const std::string&) { ++stalls; },
      [&](int) { return carrier ? std::string() : std::string("interface rail0 has no carrier"); },
      [&](int, const std::string&) { ++lost; }};
  dog.begin(0, "allgather");
  bytes += 100;
  std::this_thread::sleep_for(milliseconds(20));
  dog.pause(0);
  std::this_thread::sleep_for(milliseconds(250));  // five limits of silence
  EXPECT_EQ(stalls.load(), 0) << "a paused rail's silence was reported";
  carrier = false;
  const auto cut = std::chrono::steady_clock::now();
  while (lost.load() == 0 && std::chrono::steady_clock::now() - cut < std::chrono::seconds(5))
    std::this_thread::sleep_for(milliseconds(2));
  EXPECT_EQ(lost.load(), 1) << "a paused rail's lost link was not reported";
  const double waited_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - cut).count();
  EXPECT_LT(waited_ms, 500.0) << "a generous bound: the link is checked every 10 ms";
  carrier = true;
  dog.begin(0, "allgather");  // the claim came: silence counts again
  const auto resumed = std::chrono::steady_clock::now();
  while (stalls.load() == 0 && std::chrono::steady_clock::now() - resumed < std::chrono::seconds(5))
    std::this_thread::sleep_for(milliseconds(2));
  EXPECT_EQ(stalls.load(), 1) << "a resumed rail's silence was not reported";
  dog.end(0, false);
  // 3 x the 20 ms before the pause at most; 3 x the paused 250 ms would be 0.75 s.
  EXPECT_LT(dog.limit_s(0), 0.2) << "the paused wait was learned as a healthy pause";
}

// A silent rail whose transport vouches that its connections deliver (a late peer) is not
// reported at the silence limit, only once silent for twice the limit; one that does not vouch is
// reported at the limit.
TEST(RailWatchdog, ASilentRailThatStillDeliversIsReportedOnlyAtTheMaximum) {
  for (bool delivers : {true, false}) {
    SCOPED_TRACE(delivers ? "delivering" : "stuck");
    std::atomic<int> asked{0};
    std::mutex mu;
    std::vector<std::chrono::steady_clock::time_point> reports;
    std::string first_what;
    RailWatchdog dog{1, 0.05, [](int) { return uint64_t{0}; },
                     [&](int, const std::string& what) {
                       std::lock_guard<std::mutex> lock(mu);
                       if (reports.empty()) first_what = what;
                       reports.push_back(std::chrono::steady_clock::now());
                     },
                     [](int) { return std::string(); }, [](int, const std::string&) {},
                     [&](int, milliseconds quiet) {
                       ++asked;
                       EXPECT_EQ(quiet.count(), 50);  // the silence limit
                       return delivers;
                     }};
    const auto start = std::chrono::steady_clock::now();
    dog.begin(0, "share");
    std::this_thread::sleep_for(milliseconds(400));
    dog.end(0, false);
    dog.stop();
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_FALSE(reports.empty());
    const double first_ms = std::chrono::duration<double, std::milli>(reports[0] - start).count();
    EXPECT_GT(asked.load(), 0);
    // The report says which rule fired (a starved peer and a broken path differ only there).
    EXPECT_NE(first_what.find("share moved no data for"), std::string::npos) << first_what;
    EXPECT_NE(first_what.find(delivers ? "its connections deliver" : "waits for the peer's acknowledgement"),
              std::string::npos)
        << first_what;
    if (delivers) {
      EXPECT_GE(first_ms, 99.0) << "reported at the limit although the rail delivers";
      EXPECT_LT(first_ms, 390.0) << "a late peer's grace is two limits (generous bound)";
    } else {
      EXPECT_GE(first_ms, 49.0);
      EXPECT_LT(first_ms, 99.0) << "a stuck rail is reported at the limit, before twice the limit";
    }
  }
}

}  // namespace
}  // namespace nezha::engine

namespace nezha::engine {
namespace {

// A peer starved of CPU stalls every rail it is on; a broken path only its own. Two rails with
// work, both silent and both delivering: neither is reported, however long; once rail 0 moves
// again while rail 1 stays silent, rail 1 is (within the late-peer grace of two limits).
TEST(RailWatchdog, RailsSilentTogetherAreALatePeerAndTheOddOneOutIsReported) {
  std::atomic<uint64_t> bytes[2] = {{0}, {0}};
  std::mutex mu;
  std::vector<std::pair<int, std::chrono::steady_clock::time_point>> reports;
  RailWatchdog dog{2, 0.05, [&](int r) { return bytes[r].load(); },
                   [&](int r, const std::string&) {
                     std::lock_guard<std::mutex> lock(mu);
                     reports.emplace_back(r, std::chrono::steady_clock::now());
                   },
                   [](int) { return std::string(); }, [](int, const std::string&) {},
                   [](int, milliseconds) { return true; }};
  dog.begin(0, "share 0");
  dog.begin(1, "share 1");
  bytes[0] += 1;  // both started: their first bytes moved
  bytes[1] += 1;
  std::this_thread::sleep_for(milliseconds(400));  // 8 limits of silence on both
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(reports.empty()) << "rails silent together were reported (rail " << reports.front().first << ")";
  }
  const auto moved_at = std::chrono::steady_clock::now();
  for (int i = 0; i < 30; ++i) {  // rail 0 moves again for 300 ms; rail 1 stays silent
    bytes[0] += 100;
    std::this_thread::sleep_for(milliseconds(10));
  }
  dog.end(0, true);
  dog.end(1, false);
  dog.stop();
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_FALSE(reports.empty()) << "the rail silent beside a moving one was never reported";
  EXPECT_EQ(reports.front().first, 1);
  const double after_ms = std::chrono::duration<double, std::milli>(reports.front().second - moved_at).count();
  EXPECT_LT(after_ms, 250.0) << "reported long after the other rail moved again (generous bound)";
  for (const auto& [rail, when] : reports) EXPECT_EQ(rail, 1) << "the moving rail was reported";
}

}  // namespace
}  // namespace nezha::engine

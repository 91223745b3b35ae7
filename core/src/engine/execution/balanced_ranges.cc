// for_each_balanced_range (balanced_ranges.h): how the ranks of one rail agree on the ranges a
// balanced operation's part runs.
#include "engine/execution/balanced_ranges.h"

#include <string>
#include <vector>

#include "collectives/algorithm_util.h"
#include "common/error.h"

namespace nezha::engine {
namespace {

// Claim messages are numbered from this step up, far above any collective's step within one
// operation, so a rank that took one for data (or the reverse) fails on the tag, never misreads.
constexpr uint64_t kClaimStep = uint64_t{1} << 19;
// A redo's list of ranges: more than this is not a list any leader sent.
constexpr uint64_t kMaxRedoRanges = uint64_t{1} << 16;

struct WireRange {
  uint64_t offset, count;
};

void send_to_others(transport::PointToPointRail& rail, uint64_t tag, const void* data, size_t bytes,
                    const Deadline& d) {
  for (int p = 0; p < rail.size(); ++p)
    if (p != rail.rank()) rail.send(p, tag, data, bytes, d);
}

ShareBalancer::Range checked(const WireRange& w, size_t total, const transport::PointToPointRail& rail) {
  if (w.offset > total || w.count > total - w.offset)
    throw ProtocolError("rail '" + rail.properties().name + "': the balancing leader sent range [" + std::to_string(w.offset) +
                        ", +" + std::to_string(w.count) + ") of an operation of " + std::to_string(total) +
                        " elements");
  return {static_cast<size_t>(w.offset), static_cast<size_t>(w.count)};
}

// The next range of `part`: taken from the pool by the leader and sent to the others, received by them.
ShareBalancer::Range next_range(transport::PointToPointRail& rail, int leader, ShareBalancer& balancer, size_t part,
                                uint64_t tag, size_t total, const Deadline& d) {
  WireRange w{};
  if (rail.rank() == leader) {
    const ShareBalancer::Range r = balancer.claim(part);
    w = {r.offset, r.count};
    send_to_others(rail, tag, &w, sizeof w, d);
  } else {
    rail.recv(leader, tag, &w, sizeof w, d);
  }
  return checked(w, total, rail);
}

// The ranges the leader handed `part` (its record), as the leader has them.
std::vector<ShareBalancer::Range> redo_ranges(transport::PointToPointRail& rail, int leader,
                                              const ShareBalancer& balancer, size_t part, uint64_t tag, size_t total,
                                              const Deadline& d) {
  std::vector<WireRange> wire;
  uint64_t n = 0;
  if (rail.rank() == leader) {
    for (const auto& r : balancer.claimed(part)) wire.push_back({r.offset, r.count});
    n = wire.size();
    send_to_others(rail, tag, &n, sizeof n, d);
    if (n) send_to_others(rail, tag + 1, wire.data(), n * sizeof(WireRange), d);
  } else {
    rail.recv(leader, tag, &n, sizeof n, d);
    if (n > kMaxRedoRanges)
      throw ProtocolError("rail '" + rail.properties().name + "': rank " + std::to_string(leader) + " announced " +
                          std::to_string(n) + " ranges to redo");
    wire.resize(n);
    if (n) rail.recv(leader, tag + 1, wire.data(), n * sizeof(WireRange), d);
  }
  std::vector<ShareBalancer::Range> ranges;
  for (const auto& w : wire) ranges.push_back(checked(w, total, rail));
  return ranges;
}

}  // namespace

void for_each_balanced_range(transport::PointToPointRail& rail, int leader, ShareBalancer& balancer, size_t part,
                             uint64_t seq, bool is_redo, size_t total, double timeout_s,
                             const std::function<void(const ShareBalancer::Range&)>& run,
                             const std::function<void(bool)>& waiting) {
  // Only a rank other than the leader waits for a claim.
  auto wait = [&](bool on) {
    if (waiting && rail.rank() != leader) waiting(on);
  };
  if (is_redo) {
    for (const auto& range : redo_ranges(rail, leader, balancer, part, collectives::make_tag(seq, kClaimStep), total,
                                         Deadline::after_seconds(timeout_s)))
      run(range);
    return;
  }
  for (size_t k = 0;; ++k) {
    wait(true);
    const ShareBalancer::Range range = next_range(rail, leader, balancer, part, collectives::make_tag(seq, kClaimStep + k),
                                                  total, Deadline::after_seconds(timeout_s));
    wait(false);
    if (range.count == 0) return;
    run(range);
  }
}

}  // namespace nezha::engine

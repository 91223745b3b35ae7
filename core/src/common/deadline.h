// A point in time by which a wait must end. Every blocking call in the core takes one, so no wait is
// unbounded (DESIGN.md invariant: nothing hangs).
#pragma once

#include <algorithm>
#include <chrono>
#include <limits>

namespace nezha {

using Clock = std::chrono::steady_clock;

class Deadline {
 public:
  static Deadline after_seconds(double s) {
    return Deadline(Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(s)));
  }
  static Deadline never() { return Deadline(Clock::time_point::max()); }

  bool expired() const { return Clock::now() >= at_; }
  Clock::time_point at() const { return at_; }

  // Milliseconds left, rounded up and clamped to [0, cap_ms]; suitable for poll().
  int remaining_ms(int cap_ms = 1000) const {
    if (at_ == Clock::time_point::max()) return cap_ms;
    auto left = std::chrono::duration_cast<std::chrono::microseconds>(at_ - Clock::now()).count();
    if (left <= 0) return 0;
    long long ms = (left + 999) / 1000;
    return static_cast<int>(std::min<long long>(ms, cap_ms));
  }

 private:
  explicit Deadline(Clock::time_point at) : at_(at) {}
  Clock::time_point at_;
};

// The sooner of two deadlines (a step's own bound inside a whole operation's).
inline Deadline earlier(const Deadline& a, const Deadline& b) { return a.at() < b.at() ? a : b; }

}  // namespace nezha

// Coordinator after an operation failed on some ranks: every rank learns of a stall, and
// a group whose sizes differ across ranks fails as a whole instead of leaving one rank waiting.
#include "engine/negotiation/coordinator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "common/logging.h"
#include "engine/negotiation/message_codec.h"

namespace nezha::engine {
namespace {

using std::chrono::seconds;

const Clock::time_point t0 = Clock::time_point{} + std::chrono::hours(1);

Request member(const std::string& group, int index, int group_size) {
  Request r;
  r.type = OpType::kAllreduce;
  r.name = group + "." + std::to_string(index);
  r.shape = {2};
  r.group = group;
  r.group_size = group_size;
  return r;
}

CoordinatorOptions options(int size) {
  CoordinatorOptions o;
  o.size = size;
  o.cycle_time_s = 0;
  o.stall_check_s = 2;
  return o;
}

class QuietLog : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = log_level();
    set_log_level(LogLevel::kError);
  }
  void TearDown() override { set_log_level(saved_); }
  LogLevel saved_ = LogLevel::kWarning;
};

using CoordinatorNotices = QuietLog;
using CoordinatorGroupMismatch = QuietLog;

TEST_F(CoordinatorNotices, StallIsANoticeNamingWhoSubmittedAndWhoIsMissing) {
  Coordinator c(options(3));
  Request r = member("", 0, 0);
  r.name = "late";
  r.group.clear();
  c.submit(1, {r}, t0);
  c.check_stalls(t0 + seconds(1));
  EXPECT_TRUE(c.take_notices().empty());
  c.check_stalls(t0 + seconds(2));
  auto notices = c.take_notices();
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_NE(notices[0].find("'late'"), std::string::npos) << notices[0];
  EXPECT_NE(notices[0].find("submitted by rank 1 "), std::string::npos) << notices[0];
  EXPECT_NE(notices[0].find("ranks 0,2 have not submitted it"), std::string::npos) << notices[0];
  c.check_stalls(t0 + seconds(30));
  EXPECT_TRUE(c.take_notices().empty());  // once per tensor
}

TEST(ResponseListNotices, RoundTripAndANoticeOnlyListIsNotExecuted) {
  ResponseList list;
  list.notices = {"stall: tensor 'a' ...", "stall: tensor 'b' ..."};
  ResponseList out = decode_response_list(encode(list));
  EXPECT_EQ(out.notices, list.notices);
  EXPECT_TRUE(out.is_notice_only());
  out.responses.emplace_back();
  EXPECT_FALSE(out.is_notice_only());
  EXPECT_FALSE(ResponseList{}.is_notice_only());
}

std::vector<std::string> errored(const std::vector<Response>& rs) {
  std::vector<std::string> names;
  for (const auto& r : rs) {
    EXPECT_EQ(r.kind, Response::Kind::kError) << r.names[0];
    for (const auto& n : r.names) names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST_F(CoordinatorGroupMismatch, MembersOnlyTheLargerGroupSubmittedFailToo) {
  // Rank 0 groups two tensors, rank 1 three under the same name: the third is rank 1's alone.
  Coordinator c(options(2));
  c.submit(0, {member("g", 0, 2), member("g", 1, 2)}, t0);
  c.submit(1, {member("g", 0, 3), member("g", 1, 3), member("g", 2, 3)}, t0);
  auto out = c.take_ready(t0);
  EXPECT_EQ(errored(out), (std::vector<std::string>{"g.0", "g.1", "g.2"}));
  for (const auto& r : out) EXPECT_NE(r.error.find("group"), std::string::npos) << r.error;
  EXPECT_FALSE(c.has_pending());
}

TEST_F(CoordinatorGroupMismatch, AMemberArrivingAfterTheFailureFailsAtOnce) {
  Coordinator c(options(2));
  c.submit(0, {member("g", 0, 2), member("g", 1, 2)}, t0);
  c.submit(1, {member("g", 0, 3), member("g", 1, 3)}, t0);
  EXPECT_EQ(errored(c.take_ready(t0)), (std::vector<std::string>{"g.0", "g.1"}));
  c.submit(1, {member("g", 2, 3)}, t0 + seconds(1));  // rank 1 still owed one member
  EXPECT_EQ(errored(c.take_ready(t0 + seconds(1))), (std::vector<std::string>{"g.2"}));
  EXPECT_FALSE(c.has_pending());
  // Nothing more is owed: the group name works again.
  c.submit(0, {member("g", 0, 1)}, t0 + seconds(2));
  c.submit(1, {member("g", 0, 1)}, t0 + seconds(2));
  auto again = c.take_ready(t0 + seconds(2));
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].kind, Response::Kind::kExecute);
}

}  // namespace
}  // namespace nezha::engine

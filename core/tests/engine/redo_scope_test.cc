// Which rails failover can save (failover/redo_scope.h), from the rails' properties alone.
#include "engine/failover/redo_scope.h"

#include <gtest/gtest.h>

#include <vector>

namespace nezha::engine {
namespace {

transport::RailProperties socket_rail() { return {}; }  // a TCP rail: can fail alone, point-to-point

transport::RailProperties shm_ring() {
  transport::RailProperties p;
  p.can_fail_alone = false;
  return p;
}

transport::RailProperties shm_collective() {
  transport::RailProperties p = shm_ring();
  p.point_to_point = false;
  return p;
}

transport::RailProperties aggregation() {  // a network daemon: can fail alone, collective-only
  transport::RailProperties p;
  p.point_to_point = false;
  return p;
}

std::vector<bool> saved(const std::vector<transport::RailProperties>& rails) {
  std::vector<const transport::RailProperties*> ptrs;
  for (const auto& r : rails) ptrs.push_back(&r);
  return redo_can_save(ptrs);
}

bool helps(const std::vector<transport::RailProperties>& rails) {
  std::vector<const transport::RailProperties*> ptrs;
  for (const auto& r : rails) ptrs.push_back(&r);
  return failover_can_help(ptrs);
}

TEST(RedoScope, TwoSocketRailsSaveEachOther) {
  EXPECT_EQ(saved({socket_rail(), socket_rail()}), (std::vector<bool>{true, true}));
  EXPECT_TRUE(helps({socket_rail(), socket_rail()}));
}

TEST(RedoScope, OneRailHasNothingToRedoOn) {
  EXPECT_FALSE(helps({socket_rail()}));
  EXPECT_FALSE(helps({shm_ring()}));
  EXPECT_FALSE(helps({}));
}

TEST(RedoScope, SharedMemoryRailsFailOnlyWithARankSoNothingIsSaved) {
  EXPECT_EQ(saved({shm_ring(), shm_collective()}), (std::vector<bool>{false, false}));
  EXPECT_FALSE(helps({shm_ring(), shm_collective()}));
  EXPECT_FALSE(helps({shm_ring(), shm_ring()}));
}

TEST(RedoScope, ASocketRailBesideShmIsSavedByIt) {
  // A cut socket leaves the shared-memory ring standing: it redoes the socket's shares. The ring's
  // own shares need no copy: whatever fails it fails the socket too.
  EXPECT_EQ(saved({socket_rail(), shm_ring()}), (std::vector<bool>{true, false}));
  EXPECT_TRUE(helps({socket_rail(), shm_ring()}));
}

TEST(RedoScope, ACollectiveOnlyRailRedoesNothing) {
  // The one-host default with the collective shm rail: the socket (with its shm lane) has no
  // point-to-point rail beside it, and the collective rail's failure is a rank's.
  transport::RailProperties lane_rail = socket_rail();  // tcp+shm: the socket part can fail alone
  EXPECT_EQ(saved({lane_rail, shm_collective()}), (std::vector<bool>{false, false}));
  EXPECT_FALSE(helps({lane_rail, shm_collective()}));
  // Aggregation beside a socket rail: the daemon can fail alone and the socket redoes its share.
  EXPECT_EQ(saved({socket_rail(), aggregation()}), (std::vector<bool>{false, true}));
}

}  // namespace
}  // namespace nezha::engine

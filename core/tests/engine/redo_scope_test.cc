// Which rails failover can save (failover/redo_scope.h), from what the rails say of themselves.
#include "engine/failover/redo_scope.h"

#include <gtest/gtest.h>

#include <vector>

namespace nezha::engine {
namespace {

RedoRail socket_rail() { return {}; }  // a TCP rail: can fail alone, point-to-point

RedoRail shm_ring() { return {/*can_fail_alone=*/false, /*point_to_point=*/true}; }

RedoRail shm_collective() { return {/*can_fail_alone=*/false, /*point_to_point=*/false}; }

RedoRail aggregation() { return {/*can_fail_alone=*/true, /*point_to_point=*/false}; }  // a network daemon

std::vector<bool> saved(const std::vector<RedoRail>& rails) { return redo_can_save(rails); }

bool helps(const std::vector<RedoRail>& rails) { return failover_can_help(rails); }

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

TEST(RedoScope, ACollectiveRailRedoesNothing) {
  // The one-host default with the collective shm rail: the socket (with its shm lane) has no
  // point-to-point rail beside it, and the collective rail's failure is a rank's.
  RedoRail lane_rail = socket_rail();  // tcp+shm: the socket part can fail alone
  EXPECT_EQ(saved({lane_rail, shm_collective()}), (std::vector<bool>{false, false}));
  EXPECT_FALSE(helps({lane_rail, shm_collective()}));
  // Aggregation beside a socket rail: the daemon can fail alone and the socket redoes its share.
  EXPECT_EQ(saved({socket_rail(), aggregation()}), (std::vector<bool>{false, true}));
}

}  // namespace
}  // namespace nezha::engine

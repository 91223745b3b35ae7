// What one rank of a CUDA IPC lane publishes in its host segment (cuda_ipc_lane.h): the step
// counters and slot descriptors of the shm collective rail (transport/shm_coll/shm_coll_workspace.h:
// the same meaning, the same seq_cst publication), and, written once before the segment is handed
// to the peers, the IPC handle and shape of its device workspace.
#pragma once

#include <atomic>
#include <cstdint>

#include "common/cuda_driver.h"
#include "transport/shm_coll/shm_coll_workspace.h"

namespace nezha::cuda {

constexpr uint32_t kMaxLaneSlots = 8;

// Which step counter of WorkspaceControl a wait or a publication is about.
enum class Counter { kCopied, kReduced, kConsumed };

struct alignas(64) LaneControl {
  transport::shm_coll::WorkspaceControl steps;
  transport::shm_coll::SlotDescriptor descriptors[kMaxLaneSlots];
  CudaDriver::IpcMemHandle workspace_handle;
  uint64_t chunk_bytes;
  uint64_t small_bytes;  // the whole-buffer threshold: ranks must agree on which path an op takes
  uint64_t slot_stride;  // bytes between slots in the workspace
  uint32_t slots;
  char pci_bus_id[32];   // of the workspace's device (error messages)

  std::atomic<uint64_t>& counter(Counter c) {
    switch (c) {
      case Counter::kCopied: return steps.copied.steps;
      case Counter::kReduced: return steps.reduced.steps;
      case Counter::kConsumed: break;
    }
    return steps.consumed.steps;
  }
};

}  // namespace nezha::cuda

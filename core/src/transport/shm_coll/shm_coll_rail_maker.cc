// make_shm_coll_rail: the factory's entry for kind "shmcoll" (registered in rail_kinds.cc).
//   shmcoll[;chunk_bytes=N][;slots=S][;small_bytes=N][;spin_us=U][;max_share_bytes=N][;host_lane=1]
//          [;threads=T]
#include <algorithm>

#include "common/error.h"
#include "common/usable_cores.h"
#include "transport/shm_coll/shm_coll_rail.h"

namespace nezha::transport {

std::unique_ptr<Rail> make_shm_coll_rail(const RailSpec& spec, const RailContext& ctx) {
  reject_unknown_options(spec, {"chunk_bytes", "slots", "small_bytes", "spin_us", "max_share_bytes", "host_lane", "threads"});
  ShmCollRailConfig c;
  c.name = spec.name.empty() ? "shmcoll" : spec.name;
  c.secret = ctx.secret;
  c.host_id = ctx.host_id;
  c.reduce_into = ctx.reduce_into;
  c.chunk_bytes = rail_option_bytes(spec, "chunk_bytes", c.chunk_bytes);
  c.slots = static_cast<uint32_t>(rail_option_bytes(spec, "slots", c.slots));
  // Up to small_bytes every rank reduces the whole share after one wait; above, each its slice,
  // after two. Where the ranks outnumber the cores a wait is a sleep and a wake-up behind a
  // descheduled peer, which costs more than reducing 128 KiB n times over, and spinning before it
  // only keeps the core from that peer (benchmarks/SHM.md).
  const bool crowded = ranks_outnumber_cores(ctx);
  const size_t small_default = crowded ? size_t{128} << 10 : c.small_bytes;
  c.small_bytes = rail_option_bytes(spec, "small_bytes", std::min(small_default, c.chunk_bytes));
  c.spin_us = static_cast<double>(rail_option_bytes(spec, "spin_us", crowded ? 0 : static_cast<size_t>(c.spin_us)));
  c.max_share_bytes = rail_option_bytes(spec, "max_share_bytes", 0);
  c.host_lane = rail_option_bytes(spec, "host_lane", 0) != 0;
  // The cores this host's ranks leave idle, shared out: each rank's rail thread copies and reduces
  // alone at a few GB/s, the host's memory moves tens (benchmarks/SHM.md). Up to kDefaultThreads:
  // past a few threads per rank the memory, not the threads, is the limit.
  constexpr int kDefaultThreads = 4;
  const int local = ctx.local_size > 0 ? ctx.local_size : std::max(ctx.size, 1);
  const int spare = std::clamp(usable_cores() / local, 1, kDefaultThreads);
  c.threads = static_cast<int>(rail_option_bytes(spec, "threads", static_cast<size_t>(spare)));
  return std::make_unique<ShmCollRail>(c, ctx.rank, ctx.size);
}

}  // namespace nezha::transport

// Engine: building the rails from the user's list (and the automatic shm lane), and deciding where a
// host-local rail goes: host lanes of the network rails (hierarchical allreduce), a rail of its own
// (a one-host job), or nowhere (an automatic lane that cannot serve); calibrating them before any
// user traffic.
#include "collectives/reduce.h"
#include "common/logging.h"
#include "engine/engine.h"
#include "engine/engine_internal.h"
#include "transport/hierarchical_rail.h"

namespace nezha::engine {

using namespace internal;

namespace {
transport::RailSpec spec_of(const RailConfig& rc) {
  transport::RailSpec spec;
  spec.kind = rc.kind;
  spec.name = rc.name;
  spec.local_addr = rc.local_addr;
  spec.options = rc.options;
  return spec;
}
}  // namespace

void Engine::build_rails() {
  auto context = [&](int index) {
    transport::RailContext ctx;
    ctx.rank = config_.rank;
    ctx.size = config_.size;
    ctx.rail_index = index;
    ctx.secret = config_.secret;
    ctx.host_id = config_.host_id;
    ctx.socket_buffer_bytes = config_.socket_buffer_bytes;
    ctx.local_size = config_.local_size;
    ctx.reduce_into = &collectives::reduce_into;  // for rails that reduce on this host (shmcoll)
    return ctx;
  };
  std::vector<std::unique_ptr<transport::Rail>> built;
  for (size_t i = 0; i < config_.rails.size(); ++i)
    built.push_back(transport::make_rail(spec_of(config_.rails[i]), context(static_cast<int>(i))));

  // The first host-local point-to-point rail may become the host lane of every network rail. The
  // launcher's placement only decides whether to try (one host, or several ranks on some host); who
  // really shares memory comes from the lanes' addresses at connect (HierarchicalRail).
  int lane = -1, network = 0;
  for (size_t i = 0; i < built.size(); ++i) {
    if (!built[i]->as_point_to_point()) continue;  // a collective rail is neither
    if (built[i]->properties().reach == transport::RailReach::kHost) {
      if (lane < 0) lane = static_cast<int>(i);
    } else {
      ++network;
    }
  }
  // Decided alike on every rank (they must agree on the rails): from the job's size and host count.
  const bool one_host = config_.local_size >= config_.size;
  const bool co_located = config_.cross_size < config_.size;  // some host holds several ranks
  bool use_lanes = false, drop_lane = false;
  if (lane >= 0 && network > 0) {
    const RailConfig& lc = config_.rails[static_cast<size_t>(lane)];
    // A one-host job: an automatic lane carries the allreduces of the default rail; a lane the user
    // listed beside network rails stays a rail of its own, striped with them.
    // Across hosts: lanes with NEZHA_HIERARCHICAL, else an automatic lane is dropped (a listed one
    // is refused at connect, naming the ranks it misses).
    if (one_host) use_lanes = lc.automatic;
    else if (config_.hierarchical && (co_located || !lc.automatic)) use_lanes = true;
    else drop_lane = lc.automatic;
  } else if (lane >= 0 && config_.rails[static_cast<size_t>(lane)].automatic && !one_host) {
    drop_lane = true;  // nothing to pair it with
  }

  std::vector<RailConfig> kept;
  for (size_t i = 0; i < built.size(); ++i) {
    if (static_cast<int>(i) == lane && (use_lanes || drop_lane)) {
      if (drop_lane)
        NZ_LOG(Info) << rank_prefix(config_.rank) << "automatic rail '" << config_.rails[i].name
                     << "' dropped: " << (co_located ? "NEZHA_HIERARCHICAL is off" : "one rank per host");
      continue;
    }
    std::unique_ptr<transport::Rail> rail = std::move(built[i]);
    if (use_lanes && rail->properties().reach == transport::RailReach::kJob && rail->as_point_to_point()) {
      // Each network rail its own lane (own segments): rails' workers never share one. The pair
      // offers the lane through PointToPointRail::host_lane() once connected. Across hosts an
      // automatic lane is the collective shm rail of the host's ranks (NEZHA_HOST_LANE); a lane
      // the user listed, or a one-host job's, is the rail as listed.
      RailConfig lane_config = config_.rails[static_cast<size_t>(lane)];
      if (!one_host && lane_config.automatic && config_.host_lane == "shmcoll")
        lane_config = RailConfig{lane_config.name, "", "shmcoll", {{"host_lane", "1"}}, true};
      auto lane_rail = transport::make_rail(spec_of(lane_config), context(static_cast<int>(config_.rails.size() + i)));
      rail = std::make_unique<transport::HierarchicalRail>(std::move(rail), std::move(lane_rail));
    }
    kept.push_back(config_.rails[i]);
    rails_.push_back(std::move(rail));
  }
  config_.rails = std::move(kept);
}

void Engine::calibrate_rails() {
  // One rail needs no model. With several, each gets a few timed allreduces of a small and two
  // larger sizes (alpha from the first, beta from the others) before any user traffic, so the
  // very first large payload can already be striped (three samples per regime of the
  // SplitRegimeModel). Every rank runs the same sequence.
  if (rails_.size() < 2 || config_.size < 2) return;
  // The first operation on a rail also waits for the last rank to arrive (start-up skew: tens of ms
  // while another rail's connections are still being authenticated), which is no cost of the rail:
  // taken as its alpha it kept an 18 ms TCP rail out of every 1 MB allreduce. One untimed exchange
  // per rail first.
  for (size_t rail = 0; rail < rails_.size(); ++rail)
    executor_->calibrate(static_cast<int>(rail), multirail::RailTable::calibration_bytes().front(),
                         /*observe=*/false);
  for (size_t rail = 0; rail < rails_.size(); ++rail)
    for (size_t bytes : multirail::RailTable::calibration_bytes())
      executor_->calibrate(static_cast<int>(rail), bytes);
  const std::vector<multirail::RailEstimate> estimates = rail_table_->estimates();
  for (size_t rail = 0; rail < rails_.size(); ++rail) {
    const auto& est = estimates[rail];
    NZ_LOG(Info) << rank_prefix(config_.rank) << "rail '" << rails_[rail]->properties().name
                 << "' calibrated: alpha " << est.alpha_us << " us, beta " << est.beta_gbps
                 << " Gbit/s";
  }
}

}  // namespace nezha::engine

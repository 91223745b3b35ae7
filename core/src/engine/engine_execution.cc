// Engine: executing what negotiation agreed (in stream order, on every rank): rail calibration
// before user traffic, responses handed to the executor, results rank 0 computed inline.

#include <algorithm>

#include "common/error.h"
#include "common/logging.h"
#include "engine/engine.h"
#include "engine/engine_internal.h"
#include "engine/negotiation/control_inline.h"
#include "engine/negotiation/message_codec.h"

namespace nezha::engine {

using namespace internal;

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

void Engine::execute_locally(const ResponseList& list, bool from_round) {
  if (!list.estimates.empty()) rail_table_->set_shared_estimates(list.estimates);
  for (const RailEvent& e : list.rail_events) apply_rail_event(e);
  if (!list.watermark.empty() && executor_) executor_->trim(list.watermark);
  for (const Response& resp : list.responses) {
    if (resp.process_set != 0) {
      auto members = process_sets_->members(resp.process_set);
      bool mine = members && std::binary_search(members->begin(), members->end(), config_.rank);
      if (!members) {  // removed here already (a script that removed a set still in use elsewhere)
        std::lock_guard<std::mutex> lock(mu_);
        for (const auto& name : resp.names) mine = mine || in_flight_.count(name) > 0;
      }
      if (!mine) {
        // Another set's operation: its members run it; this rank steps its rails' operation
        // counters past it so that every rank's stay equal.
        if (resp.kind == Response::Kind::kExecute && resp.inline_result.empty()) executor_->skip(resp);
        continue;
      }
    }
    if (resp.type == OpType::kAllreduce) rail_table_->record_plan(resp.plan);
    std::vector<TensorEntry> entries;
    {
      std::lock_guard<std::mutex> lock(mu_);
      bool joined = in_flight_.count(kJoinName) > 0 && resp.type != OpType::kJoin;
      bool missing = false;
      for (size_t i = 0; i < resp.names.size(); ++i) {
        auto it = in_flight_.find(resp.names[i]);
        if (it == in_flight_.end()) {
          if (!(joined && resp.type == OpType::kAllreduce)) missing = true;
          entries.emplace_back();  // joined: contributes zeros, no handle
          continue;
        }
        if (i < resp.cache_ids.size() && resp.cache_ids[i] >= 0)
          rounds_->learn(resp.cache_ids[i], it->second.req, resp, i);
        rounds_->forget_pending(resp.names[i]);
        ++(from_round ? tensors_via_rounds_ : tensors_via_coordinator_);
        timeline_.negotiation_finished(resp.names[i]);
        entries.push_back(std::move(it->second));
        in_flight_.erase(it);
      }
      if (missing && resp.kind == Response::Kind::kExecute) {
        // Only possible if ranks disagree about what was negotiated: a bug or a corrupt peer.
        throw ProtocolError("coordinator scheduled tensor(s) this rank never submitted");
      }
    }
    if (resp.kind == Response::Kind::kError) {
      NZ_LOG(Warning) << rank_prefix(config_.rank) << resp.error;
    }
    if (resp.type == OpType::kJoin && resp.kind == Response::Kind::kExecute) rounds_->join_completed();
    if (!resp.inline_result.empty()) {
      complete_inline(resp, entries);
    } else {
      if (resp.kind == Response::Kind::kExecute && resp.type != OpType::kBarrier && resp.type != OpType::kJoin)
        ++operations_on_rails_;
      executor_->execute(resp, std::move(entries));
    }
  }
}

void Engine::complete_inline(const Response& resp, std::vector<TensorEntry>& entries) {
  deliver_inline_result(resp, entries, [this](const std::string& name, size_t bytes) {
    ++tensors_done_by_coordinator_;
    timeline_.done_by_coordinator(name, bytes);
  });
}

}  // namespace nezha::engine

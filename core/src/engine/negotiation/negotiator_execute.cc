// Negotiator: handing what negotiation agreed to the executor, in stream order, on every rank, and
// completing what rank 0 computed inline.
#include <algorithm>

#include "common/error.h"
#include "common/logging.h"
#include "engine/negotiation/control_inline.h"
#include "engine/negotiation/negotiator.h"

namespace nezha::engine {

void Negotiator::execute_locally(const ResponseList& list, bool from_round) {
  if (!list.estimates.empty()) table_.set_shared_estimates(list.estimates);
  for (const RailEvent& e : list.rail_events) links_.apply_rail_event(e);
  if (!list.watermark.empty()) links_.trim(list.watermark);
  for (const Response& resp : list.responses) {
    if (resp.process_set != 0) {
      auto members = process_sets_.members(resp.process_set);
      bool mine = members && std::binary_search(members->begin(), members->end(), opt_.rank);
      // Removed here already (a script that removed a set still in use elsewhere).
      if (!members) mine = submissions_.any_in_flight(resp.names);
      if (!mine) {
        // Another set's operation: its members run it; this rank steps its rails' operation
        // counters past it so that every rank's stay equal.
        if (resp.kind == Response::Kind::kExecute && resp.inline_result.empty()) links_.skip(resp);
        continue;
      }
    }
    if (resp.type == OpType::kAllreduce) table_.record_plan(resp.plan);
    Submissions::Taken taken = submissions_.take(resp.names, [&](size_t i, const TensorEntry& entry) {
      if (i < resp.cache_ids.size() && resp.cache_ids[i] >= 0) {
        rounds_->learn(resp.cache_ids[i], entry.req, resp, i);
        if (links_.learned) links_.learned(entry.req, resp, i);
      }
      rounds_->forget_pending(resp.names[i]);
      ++(from_round ? tensors_via_rounds_ : tensors_via_coordinator_);
      timeline_.negotiation_finished(resp.names[i]);
    });
    // Joined: an allreduce this rank never submitted contributes zeros (an entry with no handle).
    const bool joined = taken.join_in_flight && resp.type != OpType::kJoin;
    const bool missing = std::any_of(taken.present.begin(), taken.present.end(), [](bool p) { return !p; }) &&
                         !(joined && resp.type == OpType::kAllreduce);
    if (missing && resp.kind == Response::Kind::kExecute) {
      // Only possible if ranks disagree about what was negotiated: a bug or a corrupt peer.
      throw ProtocolError("coordinator scheduled tensor(s) this rank never submitted");
    }
    if (resp.kind == Response::Kind::kError) NZ_LOG(Warning) << me() << resp.error;
    if (resp.type == OpType::kJoin && resp.kind == Response::Kind::kExecute) rounds_->join_completed();
    if (!resp.inline_result.empty()) {
      complete_inline(resp, taken.entries);
    } else {
      if (resp.kind == Response::Kind::kExecute && resp.type != OpType::kBarrier && resp.type != OpType::kJoin)
        ++operations_on_rails_;
      links_.execute(resp, std::move(taken.entries));
    }
  }
}

void Negotiator::complete_inline(const Response& resp, std::vector<TensorEntry>& entries) {
  deliver_inline_result(resp, entries, [this](const std::string& name, size_t bytes) {
    ++tensors_done_by_coordinator_;
    timeline_.done_by_coordinator(name, bytes);
  });
}

}  // namespace nezha::engine

// Binary encoding of control-channel messages (worker -> coordinator request lists, coordinator ->
// worker response lists). Little-endian, every length checked against what remains, so a garbage
// or truncated message is a ProtocolError, never an out-of-bounds read or a huge allocation.
#pragma once

#include <string>
#include <vector>

#include "engine/request.h"
#include "multirail/cost_model.h"

namespace nezha::engine {

// Longest tensor name (and error message) a control message carries.
constexpr size_t kMaxControlString = 1u << 16;

struct RequestList {
  std::vector<Request> requests;
  bool shutdown = false;  // this rank is shutting down (after the requests above)
};

struct ResponseList {
  std::vector<Response> responses;
  bool shutdown = false;  // every rank asked to shut down: close now
  // Set when the job cannot go on (a rank is gone): every rank fails its pending work with it.
  std::string fatal;
  // The coordinator's cost model, so every rank reports the same alpha/beta (may be empty).
  std::vector<multirail::RailEstimate> estimates;
};

std::string encode(const RequestList& list);
std::string encode(const ResponseList& list);
RequestList decode_request_list(const std::string& bytes);
ResponseList decode_response_list(const std::string& bytes);

}  // namespace nezha::engine

// What a rank submits (Request) and what the coordinator decides (Response). Both travel on the
// control channel (message_codec.h); the numeric values of OpType are part of the wire protocol.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "multirail/planner.h"

namespace nezha::engine {

enum class OpType : uint8_t {
  kAllreduce = 0,
  kAllgather = 1,
  kBroadcast = 2,
  kAlltoall = 3,
  kReducescatter = 4,
  kBarrier = 5,
  kJoin = 6,
};
const char* op_type_name(OpType t);

// Where a rank's tensor lives, in Horovod's terms (CPU or GPU; which GPU does not matter). Every
// rank must submit a tensor from the same kind of device (else each raises, as in Horovod), and a
// GPU's float16 is scaled as Horovod's GPU kernels scale it (scale_as_on_gpu). Numeric values are
// part of the wire protocol.
enum class Device : uint8_t { kCpu = 0, kGpu = 1 };
constexpr int kNumDevices = 2;
const char* device_name(Device d);

// The name a join() travels under: ranks that joined appear with this entry in flight.
constexpr const char* kJoinTensorName = "__nezha_join__";

// Metadata of one submitted tensor; identical on every rank except where an op allows otherwise
// (allgather's first dimension, alltoall's splits).
struct Request {
  OpType type = OpType::kAllreduce;
  std::string name;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;
  ReduceOp op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t root = -1;              // broadcast
  std::vector<int64_t> splits;    // alltoall: rows of dim 0 sent to each rank
  std::string group;              // grouped allreduce: all members are negotiated as one unit
  int32_t group_size = 0;
  // The process set it runs in (process_sets.h): 0 is every rank of the job. The engine qualifies
  // the name of a tensor of another set (process_set_name()), so sets never match each other's.
  int32_t process_set = 0;
  Device device = Device::kCpu;
  // Response cache: >= 0 means "the same metadata I sent last time under this name"; only the name
  // and this id travel, and the coordinator skips validation (see coordinator.h).
  int32_t cache_id = -1;
  // A small collective's input, sent with the request so rank 0 can do it without a rail
  // (engine/negotiation/control_inline.h); empty otherwise. Not metadata: never cached or compared.
  std::string inline_input;

  bool same_metadata(const Request& o) const;
  // Reductions: throws InvalidArgument, naming the tensor, for scaling its dtype cannot take (bool
  // with Average or a factor, integers with a non-finite factor), before it reaches any rank's engine.
  void check_scaling() const;
  int64_t num_elements() const;
  int64_t row_elements() const;   // elements per index of dim 0 (1 for a scalar)
  size_t bytes() const { return static_cast<size_t>(num_elements()) * dtype_size(dtype); }
};

// One operation every rank executes, in the order the coordinator sent it.
struct Response {
  enum class Kind : uint8_t { kExecute = 0, kError = 1 };
  Kind kind = Kind::kExecute;
  OpType type = OpType::kAllreduce;
  // Several names: fused (negotiation/fusion.h); counts, row_elements and rank_rows then hold every
  // name's, in order.
  std::vector<std::string> names;
  std::vector<int64_t> counts;          // allreduce, broadcast, reducescatter: elements per tensor
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t root = -1;
  std::vector<int64_t> row_elements;    // allgather/alltoall/reducescatter: elements per dim-0 row
  std::vector<int64_t> rank_rows;       // allgather: dim 0 of each rank; reducescatter: rows per rank
  std::vector<int64_t> splits_matrix;   // alltoall: size*size, [src*size + dst] rows
  int32_t last_joined_rank = -1;        // join
  std::vector<int32_t> cache_ids;       // per name: id to use for it next time (-1: not cached)
  std::vector<multirail::RailShare> plan;  // allreduce: element ranges per rail; else one entry
  std::string error;                    // kError: the message every rank raises
  // Done by rank 0 from the requests' inline inputs (engine/negotiation/control_inline.h): the
  // result (an allreduce's scaled); every rank copies it out and no rail runs. Empty: the rails.
  std::string inline_result;
  int32_t process_set = 0;              // every name is of this set; its members execute it
};

// `shape` with its first dimension set to `rows` (a scalar counts as one row): the shape of an
// allgather's or alltoall's result.
inline std::vector<int64_t> with_rows(const std::vector<int64_t>& shape, int64_t rows) {
  std::vector<int64_t> s = shape.empty() ? std::vector<int64_t>{1} : shape;
  s[0] = rows;
  return s;
}

// The name a tensor of process set `set` travels under: another set's tensor of the same name is
// another tensor (Horovod keeps one queue per set). The set's id in it makes errors say which set.
inline std::string process_set_name(const std::string& name, int32_t set) {
  return set == 0 ? name : name + "@process_set_" + std::to_string(set);
}

// The factor a reduction's result is multiplied by once: the user's postscale, and Average's 1/size.
inline double effective_postscale(const Response& r, int size) {
  return r.op == ReduceOp::kAverage ? r.postscale / size : r.postscale;
}

// Makes a reduction of GPU tensors (`size` ranks) scale as Horovod's GPU kernels do. They scale
// float16 in half precision: the factor rounded to float, then to half, and each product rounded
// to half. scale() multiplies float16 in float32 and rounds once; the product of two halves is
// exact in float32, so handing it the half-rounded factor gives the half multiply's bits. Average
// becomes Sum with 1/size folded into the postscale first (postscale / size, then rounded), as
// Horovod folds it. Other dtypes are scaled on a GPU as on a CPU: the response is unchanged.
void scale_as_on_gpu(Response& r, int size);
// `factor` rounded to float, then to float16 (round to nearest even, as __float2half).
double half_precision_factor(double factor);

// Fusion's one exception, shared by Coordinator::fuse and CacheRounds::fuse (every rank must agree):
// an operation of at least `unfused_bytes` (NEZHA_UNFUSED_BYTES; 0: none) runs alone (an allreduce
// reduced in its own output). At that size a fused buffer's copy in and copy out (serial, before
// the first rail starts and after the last ends) cost more than a lone operation's start-up, which
// the rails overlap with the previous operation's end (benchmarks/RESULTS.md has the figures).
inline bool runs_unfused(size_t bytes, size_t unfused_bytes) {
  return unfused_bytes > 0 && bytes >= unfused_bytes;
}

// The unfused threshold as the rails allow it: a lone operation pays the rail's bulk start-up (a
// ring's 2(n-1) steps) once more, which on a few ranks is far below a fused buffer's copies and on
// hundreds of ranks far above them. So operations run alone from max(unfused_bytes, the highest-
// bandwidth rail's amortized_range_bytes) on, where that start-up is at most an eighth of their
// time. `estimates`: rank 0's (for a cache round, the round's: the same on every rank); none
// known: unfused_bytes. 0 (fuse any size) stays 0.
size_t scaled_unfused_bytes(size_t unfused_bytes, const std::vector<multirail::RailEstimate>& estimates);

}  // namespace nezha::engine

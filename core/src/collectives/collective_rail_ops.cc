// Broadcast, allgather, reducescatter and alltoall on a collective rail (collective_rail.h): the rail runs the
// whole operation itself; these check that it runs it and wait with the options' deadline.
#include "collectives/collectives.h"
#include "common/error.h"

namespace nezha::collectives {

namespace {

void require(transport::CollectiveRail& rail, transport::CollectiveOp op) {
  if (!rail.runs(op))
    throw InvalidArgument("rail '" + rail.properties().name + "' cannot run a " + transport::collective_op_name(op) +
                          " (a collective rail that does not run it)");
}

}  // namespace

void broadcast(transport::CollectiveRail& rail, void* buf, size_t bytes, int root, const CollectiveOptions& opt) {
  require(rail, transport::CollectiveOp::kBroadcast);
  rail.start_broadcast(buf, bytes, root, opt.seq)->wait(opt.deadline);
}

void allgatherv(transport::CollectiveRail& rail, const void* in, void* out, const std::vector<size_t>& bytes_per_rank,
                const CollectiveOptions& opt) {
  require(rail, transport::CollectiveOp::kAllgather);
  std::vector<uint8_t*> blocks;
  size_t at = 0;
  for (size_t b : bytes_per_rank) {
    blocks.push_back(static_cast<uint8_t*>(out) + at);
    at += b;
  }
  rail.start_allgather(in, blocks, bytes_per_rank, opt.seq)->wait(opt.deadline);
}

void reducescatterv_blocks(transport::CollectiveRail& rail, const std::vector<const uint8_t*>& in_blocks,
                           const std::vector<uint8_t*>& work_blocks, const std::vector<size_t>& counts,
                           DataType dtype, ReduceOp op, const CollectiveOptions& opt) {
  require(rail, transport::CollectiveOp::kReducescatter);
  if (!rail.reduces(dtype, op))
    throw InvalidArgument("rail '" + rail.properties().name + "' cannot run a reducescatter of " + dtype_name(dtype) +
                          " with " + reduce_op_name(op) + " (a collective rail that does not reduce them)");
  const int me = rail.rank();
  rail.start_reducescatter(in_blocks, work_blocks.at(static_cast<size_t>(me)), counts, dtype, op, opt.seq)
      ->wait(opt.deadline);
}

void alltoallv(transport::CollectiveRail& rail, const void* in, void* out, const std::vector<size_t>& bytes_matrix,
               const CollectiveOptions& opt) {
  require(rail, transport::CollectiveOp::kAlltoall);
  const size_t n = static_cast<size_t>(rail.size()), me = static_cast<size_t>(rail.rank());
  if (bytes_matrix.size() != n * n)
    throw InvalidArgument("alltoallv on rail '" + rail.properties().name + "': a byte matrix of " +
                          std::to_string(bytes_matrix.size()) + " entries for " + std::to_string(n) + " ranks");
  std::vector<const uint8_t*> send(n);
  std::vector<uint8_t*> recv(n);
  size_t sent = 0, received = 0;
  for (size_t j = 0; j < n; ++j) {
    send[j] = static_cast<const uint8_t*>(in) + sent;
    sent += bytes_matrix[me * n + j];
    recv[j] = static_cast<uint8_t*>(out) + received;
    received += bytes_matrix[j * n + me];
  }
  rail.start_alltoall(send, recv, bytes_matrix, opt.seq)->wait(opt.deadline);
}

}  // namespace nezha::collectives

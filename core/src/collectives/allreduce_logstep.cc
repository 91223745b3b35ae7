// Recursive-doubling allreduce for small payloads: log2(p) exchanges of the whole buffer.
//
// With n not a power of two, let p be the largest power of two <= n. Ranks p..n-1 first fold their
// data into ranks 0..n-p-1 ("extra" rank p+i pairs with rank i), the p remaining ranks run
// recursive doubling, then each of ranks 0..n-p-1 sends the result back to its extra partner. The
// ranks are the rail's renumbered so that its rank 0 is an extra rank (detail::fold_members: the
// coordinator then times the whole operation).
//
// Bit-identical results: in every exchange both partners evaluate lower (op) higher, operands in
// rank order, so even non-commutative cases (Min/Max with NaN) agree.
#include <cstdint>
#include <cstring>
#include <vector>

#include "collectives/algorithm_util.h"
#include "collectives/collectives.h"
#include "collectives/reduce.h"
#include "transport/group_rail.h"
#include "common/aligned_buffer.h"

namespace nezha::collectives {
namespace {

// mine := (lower operand) op (higher operand), where `theirs` came from the partner.
void combine_in_rank_order(uint8_t* mine, uint8_t* theirs, bool mine_is_lower, size_t count,
                           DataType dtype, ReduceOp op) {
  if (mine_is_lower) {
    reduce_into(mine, theirs, count, dtype, op);
  } else {
    reduce_into(theirs, mine, count, dtype, op);
    std::memcpy(mine, theirs, count * dtype_size(dtype));
  }
}

void logstep(transport::PointToPointRail& rail, void* buf, size_t count, DataType dtype, ReduceOp op,
             const CollectiveOptions& opt) {
  const size_t bytes = count * dtype_size(dtype);
  detail::require(buf != nullptr || count == 0, "allreduce_logstep: null buffer");
  const int n = rail.size();
  const int r = rail.rank();
  if (count == 0 || detail::allreduce_alone(rail, buf, count, dtype, opt)) return;

  const int p = detail::largest_power_of_two_at_most(n);
  int rounds = 0;
  while ((1 << rounds) < p) ++rounds;
  // Tag steps: 0 = fold in, 1..rounds = doubling exchanges, rounds+1 = fold out.
  const uint64_t fold_in_tag = make_tag(opt.seq, 0);
  const uint64_t fold_out_tag = make_tag(opt.seq, static_cast<uint64_t>(rounds) + 1);

  auto* data = static_cast<uint8_t*>(buf);
  if (opt.before_overwrite) opt.before_overwrite(0, bytes);  // small: all of it, up front
  if (r >= p) {  // an extra rank: hand our data to the partner, get the result back at the end
    rail.send(r - p, fold_in_tag, data, bytes, opt.deadline);
    rail.recv(r - p, fold_out_tag, data, bytes, opt.deadline);
    return;
  }

  AlignedBuffer scratch(bytes);
  const bool has_extra_partner = r < n - p;
  if (has_extra_partner) {
    rail.recv(r + p, fold_in_tag, scratch.data(), bytes, opt.deadline);
    combine_in_rank_order(data, scratch.data(), /*mine_is_lower=*/true, count, dtype, op);
  }
  for (int round = 0; round < rounds; ++round) {
    const int partner = r ^ (1 << round);
    rail.sendrecv(partner, data, bytes, partner, scratch.data(), bytes,
                  make_tag(opt.seq, static_cast<uint64_t>(round) + 1), opt.deadline);
    combine_in_rank_order(data, scratch.data(), r < partner, count, dtype, op);
  }
  // Every rank of the doubling holds the same bits here, so each scales its own copy alike; the
  // extra ranks receive theirs scaled.
  if (opt.postscale != 1.0) scale(data, count, dtype, opt.postscale);
  if (has_extra_partner) rail.send(r + p, fold_out_tag, data, bytes, opt.deadline);
}

}  // namespace

void allreduce_logstep(transport::PointToPointRail& rail, void* buf, size_t count, DataType dtype,
                       ReduceOp op, const CollectiveOptions& opt) {
  std::vector<int> members = detail::fold_members(rail.size());
  if (members.empty()) {
    logstep(rail, buf, count, dtype, op, opt);
    return;
  }
  transport::GroupRail renumbered(rail, std::move(members));
  logstep(renumbered, buf, count, dtype, op, opt);
}

}  // namespace nezha::collectives

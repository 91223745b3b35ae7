// Rabenseifner allreduce for mid-size payloads: a reduce-scatter by recursive halving, then an
// allgather by recursive doubling. 2 log2(p) exchanges where the ring takes 2(n-1), and each rank
// still sends and receives 2(p-1)/p of the payload (the ring's volume): between the log-step's
// latency-bound sizes and the sizes where the ring's extra steps no longer matter.
//
// The payload is cut into p blocks (p: the largest power of two <= n), block b owned by rank b.
// Halving step with distance m (p/2, p/4, .., 1): each rank holds the partial sums of a range of 2m
// blocks, sends its partner (rank ^ m) the half the partner keeps and adds the half it receives
// into its own; a rank with bit m set keeps the upper half. Then rank b holds the sum of block b.
// The allgather undoes the steps (m = 1, 2, .., p/2): partners swap the ranges they hold.
//
// With n not a power of two, ranks p..n-1 first hand their whole input to rank r - p, which
// combines it with its own, and they receive the result last (the log-step's fold); the ranks are
// the rail's renumbered so that its rank 0 is such an extra rank (detail::fold_members).
//
// Bit-identical results: every element's sum is computed by one rank (its block's owner) and
// copied verbatim to the others; each combination takes lower-rank operand (op) higher-rank
// operand, as the log-step does, so NaN Min/Max follow one fixed order too.
//
// Every exchange is cut into segments of opt.segment_bytes (bounded scratch). All ranks of a step
// use that step's largest segment count (zero-byte segments where a range is shorter), so every
// rank draws the same tags whatever range it holds.
#include <algorithm>
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

size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

class Halving {
 public:
  Halving(transport::PointToPointRail& rail, const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
          const CollectiveOptions& opt)
      : rail_(rail),
        in_(static_cast<const uint8_t*>(in)),
        out_(static_cast<uint8_t*>(out)),
        count_(count),
        dtype_(dtype),
        op_(op),
        opt_(opt),
        esize_(dtype_size(dtype)),
        seg_(detail::segment_elements(opt.segment_bytes, esize_)),
        n_(rail.size()),
        r_(rail.rank()),
        p_(detail::largest_power_of_two_at_most(n_)),
        offsets_(detail::prefix_offsets(detail::cache_line_partition(count, p_, esize_))),
        scratch_(std::min(seg_, count) * esize_),
        tags_(opt.seq) {}

  void run() {
    const size_t fold_segments = ceil_div(count_, seg_);
    if (r_ >= p_) {  // an extra rank: its input to rank r - p, the result back at the end
      const int partner = r_ - p_;
      for (size_t k = 0; k < fold_segments; ++k) {
        const auto [begin, length] = segment(k, 0, count_);
        rail_.send(partner, tags_.next(), in_ + begin * esize_, length * esize_, opt_.deadline);
      }
      skip_tags(2 * halving_segments());
      for (size_t k = 0; k < fold_segments; ++k) {
        const auto [begin, length] = segment(k, 0, count_);
        announce(begin, length);
        rail_.recv(partner, tags_.next(), out_ + begin * esize_, length * esize_, opt_.deadline);
      }
      return;
    }
    const bool has_extra = r_ < n_ - p_;
    const uint8_t* own = in_;  // where this rank's partial sums are read until it has written them to out
    if (has_extra) {
      for (size_t k = 0; k < fold_segments; ++k) {
        const auto [begin, length] = segment(k, 0, count_);
        rail_.recv(r_ + p_, tags_.next(), scratch_.data(), length * esize_, opt_.deadline);
        combine(begin, length, own, /*mine_is_lower=*/true);
      }
      own = out_;
    } else {
      skip_tags(fold_segments);
    }
    reduce_scatter(own);
    if (opt_.postscale != 1.0) {
      const size_t b = static_cast<size_t>(r_);
      // Written by the reduce-scatter, so announced, unless p = 1 (then n = 1: never here).
      scale(out_ + offsets_[b] * esize_, offsets_[b + 1] - offsets_[b], dtype_, opt_.postscale);
    }
    allgather();
    if (has_extra) {
      for (size_t k = 0; k < fold_segments; ++k) {
        const auto [begin, length] = segment(k, 0, count_);
        rail_.send(r_ + p_, tags_.next(), out_ + begin * esize_, length * esize_, opt_.deadline);
      }
    } else {
      skip_tags(fold_segments);
    }
  }

 private:
  struct Range {
    size_t begin;  // elements
    size_t length;
  };

  // Segment k of the elements [begin, begin + length); empty past its end.
  Range segment(size_t k, size_t begin, size_t length) const {
    const size_t from = std::min(length, k * seg_);
    return {begin + from, std::min(seg_, length - from)};
  }

  // Elements of blocks [first, first + blocks).
  Range blocks(int first, int blocks) const {
    const size_t b = static_cast<size_t>(first);
    return {offsets_[b], offsets_[b + static_cast<size_t>(blocks)] - offsets_[b]};
  }

  // Segments of the exchanges between ranges of m blocks (the same on every rank).
  size_t segments_of_level(int m) const {
    size_t largest = 0;
    for (int first = 0; first < p_; first += m) largest = std::max(largest, blocks(first, m).length);
    return ceil_div(largest, seg_);
  }

  size_t halving_segments() const {
    size_t total = 0;
    for (int m = p_ / 2; m >= 1; m /= 2) total += segments_of_level(m);
    return total;
  }

  void skip_tags(size_t messages) {
    for (size_t i = 0; i < messages; ++i) tags_.next();
  }

  void announce(size_t begin, size_t length) const {
    if (opt_.before_overwrite && length > 0) opt_.before_overwrite(begin * esize_, length * esize_);
  }

  // out[range] := (lower operand) op (higher operand), of own[range] and the scratch just received.
  void combine(size_t begin, size_t length, const uint8_t* own, bool mine_is_lower) {
    if (length == 0) return;
    announce(begin, length);
    uint8_t* dst = out_ + begin * esize_;
    const uint8_t* mine = own + begin * esize_;
    uint8_t* theirs = scratch_.data();
    if (mine == dst) {  // in place: reduce_to must not write over an operand
      if (mine_is_lower) {
        reduce_into(dst, theirs, length, dtype_, op_);
      } else {
        reduce_into(theirs, dst, length, dtype_, op_);
        std::memcpy(dst, theirs, length * esize_);
      }
    } else if (mine_is_lower) {
      reduce_to(dst, mine, theirs, length, dtype_, op_);
    } else {
      reduce_to(dst, theirs, mine, length, dtype_, op_);
    }
  }

  // `own`: this rank's partial sums before the first step (its input, or out after the fold). Every
  // kept range is written to out_, so later steps read out_.
  void reduce_scatter(const uint8_t* own) {
    for (int m = p_ / 2; m >= 1; m /= 2) {
      const int partner = r_ ^ m;
      const int first = r_ & ~(2 * m - 1);
      const bool upper = (r_ & m) != 0;
      const Range keep = blocks(upper ? first + m : first, m);
      const Range give = blocks(upper ? first : first + m, m);
      const size_t nseg = segments_of_level(m);
      for (size_t k = 0; k < nseg; ++k) {
        const Range out = segment(k, give.begin, give.length);
        const Range in = segment(k, keep.begin, keep.length);
        const uint64_t tag = tags_.next();
        rail_.sendrecv(partner, own + out.begin * esize_, out.length * esize_, partner, scratch_.data(),
                       in.length * esize_, tag, opt_.deadline);
        combine(in.begin, in.length, own, /*mine_is_lower=*/r_ < partner);
      }
      own = out_;
    }
  }

  void allgather() {
    for (int m = 1; m < p_; m *= 2) {
      const int partner = r_ ^ m;
      const Range mine = blocks(r_ & ~(m - 1), m);
      const Range theirs = blocks(partner & ~(m - 1), m);
      const size_t nseg = segments_of_level(m);
      for (size_t k = 0; k < nseg; ++k) {
        const Range out = segment(k, mine.begin, mine.length);
        const Range in = segment(k, theirs.begin, theirs.length);
        announce(in.begin, in.length);
        rail_.sendrecv(partner, out_ + out.begin * esize_, out.length * esize_, partner,
                       out_ + in.begin * esize_, in.length * esize_, tags_.next(), opt_.deadline);
      }
    }
  }

  transport::PointToPointRail& rail_;
  const uint8_t* in_;
  uint8_t* out_;
  size_t count_;
  DataType dtype_;
  ReduceOp op_;
  const CollectiveOptions& opt_;
  size_t esize_;
  size_t seg_;
  int n_;
  int r_;
  int p_;
  std::vector<size_t> offsets_;  // of the p blocks, in elements
  AlignedBuffer scratch_;
  detail::TagSequence tags_;
};

}  // namespace

void allreduce_halving(transport::PointToPointRail& rail, const void* in, void* out, size_t count, DataType dtype,
                       ReduceOp op, const CollectiveOptions& opt) {
  detail::require((in != nullptr && out != nullptr) || count == 0, "allreduce_halving: null buffer");
  if (count == 0) return;
  if (rail.size() == 1) {
    detail::copy_input(in, out, count * dtype_size(dtype));
    detail::allreduce_alone(rail, out, count, dtype, opt);
    return;
  }
  std::vector<int> members = detail::fold_members(rail.size());
  if (members.empty()) {
    Halving(rail, in, out, count, dtype, op, opt).run();
    return;
  }
  transport::GroupRail renumbered(rail, std::move(members));
  Halving(renumbered, in, out, count, dtype, op, opt).run();
}

}  // namespace nezha::collectives

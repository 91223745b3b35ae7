// Broadcast, allgather, reducescatter and alltoall on a ShmCollRail: what each places in its slot and takes from
// the workspaces per step of the two-phase pipeline (shm_coll_pipeline.h).
#include <algorithm>
#include <cstring>
#include <tuple>

#include "common/error.h"
#include "transport/shm_coll/shm_coll_pipeline.h"

namespace nezha::transport {

namespace {

uint64_t steps_for(size_t largest, size_t per_step) { return (largest + per_step - 1) / per_step; }

}  // namespace

// The root places chunk k of its buffer; every other rank copies it out of the root's slot.
class ShmCollRail::Broadcast final : public Pipeline {
 public:
  Broadcast(ShmCollRail& rail, const OpIdentity& what, uint8_t* buf, size_t bytes, int root)
      : Pipeline(rail, what, steps_for(bytes, rail.config_.chunk_bytes)), buf_(buf), bytes_(bytes), root_(root) {}

 private:
  std::pair<size_t, size_t> range(uint64_t k) const {
    const size_t at = k * config().chunk_bytes;
    return {at, std::min(config().chunk_bytes, bytes_ - at)};
  }
  size_t place(uint64_t k, uint8_t* slot) override {
    if (rank() != root_) return 0;
    const auto [at, len] = range(k);
    copy(slot, buf_ + at, len);
    return len;
  }
  size_t take(uint64_t k) override {
    if (rank() == root_) return 0;
    const auto [at, len] = range(k);
    copy(buf_ + at, slot(root_, k), len);
    return len;
  }

  uint8_t* const buf_;
  const size_t bytes_;
  const int root_;
};

// Every rank places piece k of its block (chunk_bytes at most; blocks may differ in size, a short
// one places nothing once it is through) and copies every rank's piece k into that rank's output block.
class ShmCollRail::Allgather final : public Pipeline {
 public:
  Allgather(ShmCollRail& rail, const OpIdentity& what, const uint8_t* in,
                   std::vector<uint8_t*> out, std::vector<size_t> bytes)
      : Pipeline(rail, what, steps_for(*std::max_element(bytes.begin(), bytes.end()), rail.config_.chunk_bytes)),
        in_(in), out_(std::move(out)), bytes_(std::move(bytes)) {}

 private:
  std::pair<size_t, size_t> piece(int r, uint64_t k) const {
    const size_t at = std::min(bytes_[r], k * config().chunk_bytes);
    return {at, std::min(config().chunk_bytes, bytes_[r] - at)};
  }
  size_t place(uint64_t k, uint8_t* slot) override {
    const auto [at, len] = piece(rank(), k);
    if (len > 0) copy(slot, in_ + at, len);  // an empty block may come with no buffer at all
    return len;
  }
  size_t take(uint64_t k) override {
    size_t read = 0;
    for (int r = 0; r < ranks(); ++r) {
      const auto [at, len] = piece(r, k);
      if (len == 0) continue;
      if (r == rank()) {
        if (out_[r] != in_) copy(out_[r] + at, in_ + at, len);  // our own: from the input itself
        continue;
      }
      copy(out_[r] + at, slot(r, k), len);
      read += len;
    }
    return read;
  }

  const uint8_t* const in_;
  const std::vector<uint8_t*> out_;
  const std::vector<size_t> bytes_;
};

// A slot holds one piece of every block, piece r at r * piece bytes: every rank places piece k of
// each of its input's blocks but its own, and rank r reduces piece k of block r from every other
// rank's slot and its own input, in rank order, into its output. All ranks reduce at once, each its
// own block.
class ShmCollRail::Reducescatter final : public Pipeline {
 public:
  Reducescatter(ShmCollRail& rail, const OpIdentity& what, std::vector<const uint8_t*> in,
                       uint8_t* out, std::vector<size_t> counts, size_t piece_elems)
      : Pipeline(rail, what, steps_for(*std::max_element(counts.begin(), counts.end()), piece_elems)),
        in_(std::move(in)), out_(out), counts_(std::move(counts)), esize_(dtype_size(what.dtype)),
        piece_elems_(piece_elems), dtype_(what.dtype), op_(what.op), srcs_(in_.size()) {}

  // Elements of one block per slot: the slot split among the ranks, in whole cache lines where a
  // line fits (0: the slot is too small for this many ranks).
  static size_t piece_elements(size_t chunk_bytes, int ranks, size_t esize) {
    const size_t elems = chunk_bytes / (static_cast<size_t>(ranks) * esize);
    const size_t line = 64 / esize;
    return elems >= line ? elems / line * line : elems;
  }

 private:
  std::pair<size_t, size_t> piece(int r, uint64_t k) const {  // in elements
    const size_t at = std::min(counts_[r], k * piece_elems_);
    return {at, std::min(piece_elems_, counts_[r] - at)};
  }
  // This rank's own block is never placed: only the others read a piece from a rank's slot.
  size_t place(uint64_t k, uint8_t* slot) override {
    size_t written = 0;
    for (int r = 0; r < ranks(); ++r) {
      const auto [at, len] = piece(r, k);
      if (r == rank() || len == 0) continue;
      copy(slot + r * piece_elems_ * esize_, in_[r] + at * esize_, len * esize_);
      written += len * esize_;
    }
    return written;
  }
  // Its own piece comes straight from the input (the output may be that input: reduce_sources reads
  // each part of it before writing it).
  size_t take(uint64_t k) override {
    const auto [at, len] = piece(rank(), k);
    if (len == 0) return 0;
    for (int r = 0; r < ranks(); ++r)
      srcs_[r] = r == rank() ? in_[r] + at * esize_ : slot(r, k) + rank() * piece_elems_ * esize_;
    // Disjoint parts on the helper threads: each still reads its part of the input before writing it.
    split(len * esize_, [&](size_t part, size_t n) {
      shm_coll::reduce_sources(out_ + at * esize_ + part, srcs_, part, n, esize_, dtype_, op_, config().reduce_into);
    });
    return len * esize_ * static_cast<size_t>(ranks() - 1);
  }

  const std::vector<const uint8_t*> in_;
  uint8_t* const out_;
  const std::vector<size_t> counts_;
  const size_t esize_, piece_elems_;
  const DataType dtype_;
  const ReduceOp op_;
  std::vector<const uint8_t*> srcs_;
};

// Rank r's stream is its blocks for the other ranks in rank order (its own block goes straight from
// input to output); step k's slot holds the stream's bytes [k, k + 1) x chunk_bytes. Each rank copies,
// from every peer's slot, what of the peer's block for it falls in the step. Each byte is written
// once and read once, by the rank it is for.
class ShmCollRail::Alltoall final : public Pipeline {
 public:
  Alltoall(ShmCollRail& rail, const OpIdentity& what, std::vector<const uint8_t*> send, std::vector<uint8_t*> recv,
           std::vector<size_t> matrix)
      : Pipeline(rail, what, steps_for(longest_stream(matrix, rail.size_), rail.config_.chunk_bytes)),
        send_(std::move(send)), recv_(std::move(recv)), matrix_(std::move(matrix)),
        stream_at_(matrix_.size(), 0) {
    const int n = ranks();
    for (int r = 0; r < n; ++r) {
      size_t at = 0;
      for (int j = 0; j < n; ++j) {
        if (j == r) continue;
        stream_at_[cell(r, j)] = at;
        at += matrix_[cell(r, j)];
      }
    }
    const size_t own = matrix_[cell(rank(), rank())];
    if (own > 0 && recv_[rank()] != send_[rank()]) std::memcpy(recv_[rank()], send_[rank()], own);
  }

  static size_t longest_stream(const std::vector<size_t>& matrix, int n) {
    size_t longest = 0;
    for (int r = 0; r < n; ++r) {
      size_t len = 0;
      for (int j = 0; j < n; ++j)
        if (j != r) len += matrix[static_cast<size_t>(r) * n + j];
      longest = std::max(longest, len);
    }
    return longest;
  }

 private:
  size_t cell(int from, int to) const { return static_cast<size_t>(from) * ranks() + to; }
  // The part of block from -> to inside step k's window of the sender's stream: (offset in the
  // block, offset in the slot, bytes); bytes 0 if none.
  std::tuple<size_t, size_t, size_t> overlap(int from, int to, uint64_t k) const {
    const size_t chunk = config().chunk_bytes, lo = k * chunk, hi = lo + chunk;
    const size_t begin = stream_at_[cell(from, to)], end = begin + matrix_[cell(from, to)];
    const size_t a = std::max(lo, begin), b = std::min(hi, end);
    if (a >= b) return {0, 0, 0};
    return {a - begin, a - lo, b - a};
  }
  size_t place(uint64_t k, uint8_t* slot) override {
    size_t written = 0;
    for (int j = 0; j < ranks(); ++j) {
      if (j == rank()) continue;
      const auto [in_block, in_slot, len] = overlap(rank(), j, k);
      if (len == 0) continue;
      std::memcpy(slot + in_slot, send_[j] + in_block, len);
      written += len;
    }
    return written;
  }
  size_t take(uint64_t k) override {
    size_t read = 0;
    for (int r = 0; r < ranks(); ++r) {
      if (r == rank()) continue;
      const auto [in_block, in_slot, len] = overlap(r, rank(), k);
      if (len == 0) continue;
      std::memcpy(recv_[r] + in_block, slot(r, k) + in_slot, len);
      read += len;
    }
    return read;
  }

  const std::vector<const uint8_t*> send_;
  const std::vector<uint8_t*> recv_;
  const std::vector<size_t> matrix_;
  std::vector<size_t> stream_at_;  // per (from, to): where the block starts in the sender's stream
};

std::unique_ptr<CollectiveRequest> ShmCollRail::start_broadcast(void* buf, size_t bytes, int root, uint64_t seq) {
  if (root < 0 || root >= size_)
    throw InvalidArgument(who() + ": broadcast root " + std::to_string(root) + " is outside a job of " +
                          std::to_string(size_) + " ranks");
  check_startable();
  OpIdentity what;
  what.kind = CollectiveOp::kBroadcast;
  what.seq = seq;
  what.count = bytes;
  what.op = static_cast<ReduceOp>(0);
  what.root = root;
  return std::make_unique<Broadcast>(*this, what, static_cast<uint8_t*>(buf), bytes, root);
}

std::unique_ptr<CollectiveRequest> ShmCollRail::start_allgather(const void* input,
                                                                 const std::vector<uint8_t*>& output_blocks,
                                                                 const std::vector<size_t>& bytes_per_rank,
                                                                 uint64_t seq) {
  if (static_cast<int>(output_blocks.size()) != size_ || static_cast<int>(bytes_per_rank.size()) != size_)
    throw InvalidArgument(who() + ": an allgather needs one output block and one size per rank (" +
                          std::to_string(size_) + "), got " + std::to_string(output_blocks.size()) + " and " +
                          std::to_string(bytes_per_rank.size()));
  check_startable();
  return std::make_unique<Allgather>(*this, Pipeline::sized_identity(CollectiveOp::kAllgather, seq, bytes_per_rank),
                                     static_cast<const uint8_t*>(input), output_blocks, bytes_per_rank);
}

std::unique_ptr<CollectiveRequest> ShmCollRail::start_reducescatter(const std::vector<const uint8_t*>& input_blocks,
                                                                     void* output, const std::vector<size_t>& counts,
                                                                     DataType dtype, ReduceOp op, uint64_t seq) {
  if (!reduces(dtype, op))
    throw InvalidArgument(who() + " does not reduce " + dtype_name(dtype) + " with " + reduce_op_name(op) +
                          (config_.reduce_into ? "" : " (no reduction kernel was given)"));
  if (static_cast<int>(input_blocks.size()) != size_ || static_cast<int>(counts.size()) != size_)
    throw InvalidArgument(who() + ": a reducescatter needs one input block and one count per rank (" +
                          std::to_string(size_) + "), got " + std::to_string(input_blocks.size()) + " and " +
                          std::to_string(counts.size()));
  const size_t piece = Reducescatter::piece_elements(config_.chunk_bytes, size_, dtype_size(dtype));
  if (piece == 0)
    throw InvalidArgument(who() + ": chunk_bytes " + std::to_string(config_.chunk_bytes) +
                          " cannot hold an element of " + dtype_name(dtype) + " per rank for " +
                          std::to_string(size_) + " ranks");
  check_startable();
  OpIdentity what = Pipeline::sized_identity(CollectiveOp::kReducescatter, seq, counts);
  what.dtype = dtype;
  what.op = op;
  return std::make_unique<Reducescatter>(*this, what, input_blocks, static_cast<uint8_t*>(output), counts,
                                                piece);
}

std::unique_ptr<CollectiveRequest> ShmCollRail::start_alltoall(const std::vector<const uint8_t*>& send_blocks,
                                                                const std::vector<uint8_t*>& recv_blocks,
                                                                const std::vector<size_t>& bytes_matrix, uint64_t seq) {
  const size_t n = static_cast<size_t>(size_);
  if (send_blocks.size() != n || recv_blocks.size() != n || bytes_matrix.size() != n * n)
    throw InvalidArgument(who() + ": an alltoall needs a send and a receive block per rank (" + std::to_string(n) +
                          ") and an " + std::to_string(n) + " x " + std::to_string(n) + " byte matrix, got " +
                          std::to_string(send_blocks.size()) + ", " + std::to_string(recv_blocks.size()) + " and " +
                          std::to_string(bytes_matrix.size()) + " entries");
  check_startable();
  return std::make_unique<Alltoall>(*this, Pipeline::sized_identity(CollectiveOp::kAlltoall, seq, bytes_matrix),
                                    send_blocks, recv_blocks, bytes_matrix);
}

}  // namespace nezha::transport

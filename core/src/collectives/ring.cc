#include "collectives/ring.h"

#include <algorithm>
#include <vector>

#include "collectives/reduce.h"
#include "common/aligned_buffer.h"

namespace nezha::collectives::detail {
namespace {

// Elements [begin, begin + length) of segment k of a block of `total` elements (length may be 0).
struct Segment {
  size_t begin;
  size_t length;
};

Segment segment_of(size_t k, size_t segment_size, size_t total) {
  const size_t begin = std::min(total, k * segment_size);
  return {begin, std::min(segment_size, total - begin)};
}

size_t segments_for(size_t largest_block, size_t segment_size) {
  return (largest_block + segment_size - 1) / segment_size;
}

// Message i of a ring phase (step i / nseg, segment i % nseg): what goes to the next rank, where the
// one from the previous rank is received, and where in the caller's buffer its data ends up
// (`lands`: the reduce-scatter receives into scratch and adds it to `own`, this rank's partial sum,
// there; the allgather receives there).
struct Exchange {
  const uint8_t* send;
  size_t send_bytes;
  uint8_t* recv;
  size_t recv_bytes;
  uint8_t* lands;
  const uint8_t* own = nullptr;
};

// Runs the `count` messages of a ring phase (each planned once); before_receive(x) runs before
// message x is received, received(x) once it has arrived (the reduce-scatter adds it into place).
//
// Lock-step (send i and receive i together, then received(i)) leaves the link to the next rank idle
// while received(i) runs and until the next exchange starts, a few percent of the line rate on
// shaped links. Pipelined, message i+1 goes out while message i comes in, so the next rank's link
// always has a message queued. That is safe when (1) message i+1 depends only on messages up to
// i+1-nseg (a step's segment k is the previous step's segment k after received()), so nseg >= 2, and
// (2) the rail can hand over one whole message while its peer reads nothing (send_buffer_bytes):
// every rank then completes its send of i+1 once its neighbour has read message i, which that
// neighbour always does, whatever it is sending.
template <class PlanFn, class BeforeFn, class ReceivedFn>
void run_phase(transport::PointToPointRail& rail, size_t count, size_t nseg, size_t largest_message,
               TagSequence& tags, const Deadline& deadline, PlanFn plan, BeforeFn before_receive,
               ReceivedFn received) {
  const int n = rail.size();
  const int next = ring_mod(rail.rank() + 1, n);
  const int prev = ring_mod(rail.rank() - 1, n);
  const bool pipelined = nseg >= 2 && rail.send_buffer_bytes() >= largest_message;
  if (!pipelined) {
    for (size_t i = 0; i < count; ++i) {
      const Exchange x = plan(i);
      before_receive(x);
      rail.sendrecv(next, x.send, x.send_bytes, prev, x.recv, x.recv_bytes, tags.next(), deadline);
      received(x);
    }
    return;
  }
  // Messages are sent and received in the same order, so two copies of the tag sequence, one per
  // direction, give the receiver the tag the sender used.
  TagSequence send_tags = tags;
  Exchange x = plan(0);
  rail.send(next, send_tags.next(), x.send, x.send_bytes, deadline);
  for (size_t i = 0; i < count; ++i) {
    before_receive(x);
    Exchange ahead{};
    if (i + 1 < count) {
      ahead = plan(i + 1);
      rail.sendrecv_tags(next, ahead.send, ahead.send_bytes, send_tags.next(), prev, x.recv,
                         x.recv_bytes, tags.next(), deadline);
    } else {
      rail.recv(prev, tags.next(), x.recv, x.recv_bytes, deadline);
    }
    received(x);
    x = ahead;
  }
}

}  // namespace

std::vector<uint8_t*> block_addresses(uint8_t* buf, const std::vector<size_t>& block_bytes) {
  std::vector<uint8_t*> at(block_bytes.size());
  for (size_t i = 0; i < block_bytes.size(); ++i) {
    at[i] = buf;
    buf += block_bytes[i];
  }
  return at;
}

void ring_reduce_scatter_blocks(transport::PointToPointRail& rail, const std::vector<const uint8_t*>& inputs,
                                const std::vector<uint8_t*>& blocks, const std::vector<size_t>& counts,
                                DataType dtype, ReduceOp op, size_t segment_elems, TagSequence& tags,
                                const Deadline& deadline, const OverwriteHook* before_overwrite,
                                const uint8_t* hook_base, double postscale) {
  const int n = rail.size();
  const int r = rail.rank();
  if (n == 1) return;
  const size_t largest = *std::max_element(counts.begin(), counts.end());
  if (largest == 0) return;
  const size_t esize = dtype_size(dtype);
  const size_t nseg = segments_for(largest, segment_elems);
  AlignedBuffer scratch(std::min(segment_elems, largest) * esize);
  const size_t last_step_from = static_cast<size_t>(n - 2) * nseg;  // its messages complete block r

  // Step s: send block r-s-1 (which holds s+1 contributions: at s = 0 our input alone), receive
  // block r-s-2 and add our input of it. After n-1 steps the block received last, block r, holds all
  // n contributions. Each block is received once, so blocks[b] = inputs[b] (op) received.
  auto plan = [&](size_t i) {
    const int s = static_cast<int>(i / nseg);
    const size_t k = i % nseg;
    const int send_block = ring_mod(r - s - 1, n);
    const int recv_block = ring_mod(r - s - 2, n);
    const Segment out = segment_of(k, segment_elems, counts[send_block]);
    const Segment in = segment_of(k, segment_elems, counts[recv_block]);
    const uint8_t* from = s == 0 ? inputs[send_block] : blocks[send_block];
    return Exchange{from + out.begin * esize, out.length * esize, scratch.data(), in.length * esize,
                    blocks[recv_block] + in.begin * esize, inputs[recv_block] + in.begin * esize};
  };
  run_phase(
      rail, static_cast<size_t>(n - 1) * nseg, nseg, std::min(segment_elems, largest) * esize, tags,
      deadline, plan, [](const Exchange&) {},
      [&, i = size_t{0}](const Exchange& x) mutable {
        if (before_overwrite && x.recv_bytes > 0)
          (*before_overwrite)(static_cast<size_t>(x.lands - hook_base), x.recv_bytes);
        const size_t count = x.recv_bytes / esize;
        if (x.own == x.lands) {
          reduce_into(x.lands, scratch.data(), count, dtype, op);
        } else {
          reduce_to(x.lands, x.own, scratch.data(), count, dtype, op);
        }
        if (postscale != 1.0 && i >= last_step_from) scale(x.lands, count, dtype, postscale);
        ++i;
      });
}

void ring_reduce_scatter(transport::PointToPointRail& rail, uint8_t* buf, const std::vector<size_t>& counts,
                         DataType dtype, ReduceOp op, size_t segment_elems, TagSequence& tags,
                         const Deadline& deadline, const OverwriteHook* before_overwrite,
                         double postscale) {
  const size_t esize = dtype_size(dtype);
  std::vector<size_t> bytes(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) bytes[i] = counts[i] * esize;
  const std::vector<uint8_t*> blocks = block_addresses(buf, bytes);
  const std::vector<const uint8_t*> inputs(blocks.begin(), blocks.end());
  ring_reduce_scatter_blocks(rail, inputs, blocks, counts, dtype, op, segment_elems, tags, deadline,
                             before_overwrite, buf, postscale);
}

void ring_allgather_blocks(transport::PointToPointRail& rail, const std::vector<uint8_t*>& blocks,
                           const std::vector<size_t>& block_bytes, size_t segment_bytes, TagSequence& tags,
                           const Deadline& deadline, const OverwriteHook* before_overwrite,
                           const uint8_t* hook_base) {
  const int n = rail.size();
  const int r = rail.rank();
  if (n == 1) return;
  const size_t largest = *std::max_element(block_bytes.begin(), block_bytes.end());
  if (largest == 0) return;
  segment_bytes = std::max<size_t>(segment_bytes, 1);
  const size_t nseg = segments_for(largest, segment_bytes);

  // Step s: forward block r-s (our own at s = 0), receive block r-s-1 straight into place.
  auto plan = [&](size_t i) {
    const int s = static_cast<int>(i / nseg);
    const size_t k = i % nseg;
    const int send_block = ring_mod(r - s, n);
    const int recv_block = ring_mod(r - s - 1, n);
    const Segment out = segment_of(k, segment_bytes, block_bytes[send_block]);
    const Segment in = segment_of(k, segment_bytes, block_bytes[recv_block]);
    uint8_t* dest = blocks[recv_block] + in.begin;
    return Exchange{blocks[send_block] + out.begin, out.length, dest, in.length, dest};
  };
  run_phase(
      rail, static_cast<size_t>(n - 1) * nseg, nseg, std::min(segment_bytes, largest), tags, deadline,
      plan,
      [&](const Exchange& x) {
        if (before_overwrite && x.recv_bytes > 0)
          (*before_overwrite)(static_cast<size_t>(x.lands - hook_base), x.recv_bytes);
      },
      [](const Exchange&) {});
}

void ring_allgather(transport::PointToPointRail& rail, uint8_t* buf, const std::vector<size_t>& block_bytes,
                    size_t segment_bytes, TagSequence& tags, const Deadline& deadline,
                    const OverwriteHook* before_overwrite) {
  ring_allgather_blocks(rail, block_addresses(buf, block_bytes), block_bytes, segment_bytes, tags,
                        deadline, before_overwrite, buf);
}

}  // namespace nezha::collectives::detail

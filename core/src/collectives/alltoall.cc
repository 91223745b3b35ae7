// Pairwise-exchange alltoallv: in step k (1..n-1) rank r sends to r+k and receives from r-k, so
// every step is a permutation and no rank is the target of two senders at once.
//
// A step ends for the sender once its message is in the socket's buffer, so without more the next
// steps' messages would leave the same link while earlier ones still drain: several flows in one
// queue, which a congested or shaped link drops from, and TCP repairs a burst loss only at its
// retransmission timeout (200 ms; 16 ranks on 250 Mbit/s rails stalled so in every 16 MB alltoall,
// and the rail watchdog took the silence for a dead path). A message of 256 KiB or more is
// therefore acknowledged by its receiver (an empty message back), and its sender waits for that
// before its next step: one flow per link at a time, at one round trip per large step
// (kAlltoallPacedBytes, collectives.h).

#include <cstdint>
#include <cstring>
#include <string>

#include "collectives/algorithm_util.h"
#include "collectives/collectives.h"
#include "collectives/ring.h"

namespace nezha::collectives {

void alltoallv_blocks(transport::PointToPointRail& rail, const std::vector<const uint8_t*>& send_blocks,
                      const std::vector<size_t>& send_bytes, const std::vector<uint8_t*>& recv_blocks,
                      const std::vector<size_t>& recv_bytes, const CollectiveOptions& opt) {
  const int n = rail.size();
  const int r = rail.rank();
  const auto N = static_cast<size_t>(n);
  detail::require(send_bytes.size() == N && recv_bytes.size() == N && send_blocks.size() == N &&
                      recv_blocks.size() == N,
                  "alltoallv: " + std::to_string(send_bytes.size()) + " send and " +
                      std::to_string(recv_bytes.size()) + " receive sizes given for " +
                      std::to_string(n) + " ranks");
  detail::require(send_bytes[r] == recv_bytes[r],
                  "alltoallv: rank " + std::to_string(r) + " sends itself " +
                      std::to_string(send_bytes[r]) + " bytes but expects " +
                      std::to_string(recv_bytes[r]));
  for (int i = 0; i < n; ++i) {
    detail::require(send_blocks[i] != nullptr || send_bytes[i] == 0,
                    "alltoallv: null input block for rank " + std::to_string(i));
    detail::require(recv_blocks[i] != nullptr || recv_bytes[i] == 0,
                    "alltoallv: null output block for rank " + std::to_string(i));
  }
  if (send_bytes[r] > 0) std::memcpy(recv_blocks[r], send_blocks[r], send_bytes[r]);

  // Every pair exchanges a message even when it is empty: a peer cannot tell "nothing for you"
  // from "not there yet" without it, and skipping on one side only would desynchronise tags.
  // Step k's data travels under tag step k, its acknowledgement under n + k. Both ends of a message
  // know its size, so they agree on whether it is acknowledged.
  int awaiting = -1;  // the previous step's receiver, if its message is to be acknowledged
  for (int k = 1; k < n; ++k) {
    const int to = detail::ring_mod(r + k, n);
    const int from = detail::ring_mod(r - k, n);
    if (awaiting >= 0)
      rail.recv(awaiting, make_tag(opt.seq, static_cast<uint64_t>(n + k - 1)), nullptr, 0, opt.deadline);
    rail.sendrecv(to, send_blocks[to], send_bytes[to], from, recv_blocks[from], recv_bytes[from],
                  make_tag(opt.seq, static_cast<uint64_t>(k)), opt.deadline);
    if (recv_bytes[from] >= kAlltoallPacedBytes)
      rail.send(from, make_tag(opt.seq, static_cast<uint64_t>(n + k)), nullptr, 0, opt.deadline);
    awaiting = send_bytes[to] >= kAlltoallPacedBytes ? to : -1;
  }
  if (awaiting >= 0)
    rail.recv(awaiting, make_tag(opt.seq, static_cast<uint64_t>(2 * n - 1)), nullptr, 0, opt.deadline);
}

void alltoallv(transport::PointToPointRail& rail, const void* in, const std::vector<size_t>& send_bytes,
               void* out, const std::vector<size_t>& recv_bytes, const CollectiveOptions& opt) {
  const auto N = static_cast<size_t>(rail.size());
  detail::require(send_bytes.size() == N && recv_bytes.size() == N,
                  "alltoallv: " + std::to_string(send_bytes.size()) + " send and " +
                      std::to_string(recv_bytes.size()) + " receive sizes given for " +
                      std::to_string(rail.size()) + " ranks");
  detail::require(in != nullptr || detail::prefix_offsets(send_bytes).back() == 0,
                  "alltoallv: null input buffer");
  detail::require(out != nullptr || detail::prefix_offsets(recv_bytes).back() == 0,
                  "alltoallv: null output buffer");
  // Block addresses of a null buffer with no bytes are never dereferenced.
  const std::vector<uint8_t*> send =
      detail::block_addresses(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)), send_bytes);
  alltoallv_blocks(rail, std::vector<const uint8_t*>(send.begin(), send.end()), send_bytes,
                   detail::block_addresses(static_cast<uint8_t*>(out), recv_bytes), recv_bytes, opt);
}

}  // namespace nezha::collectives

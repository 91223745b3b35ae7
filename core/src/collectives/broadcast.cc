// Broadcast. Small payloads go down a binomial tree: ceil(log2 n) rounds; in round k every rank
// that already has the data sends it to the rank 2^k further away (ranks counted relative to the
// root). Large ones go down a chain, root -> 1 -> 2 -> ... -> n-1 (relative ranks), in pieces that
// each rank forwards as soon as it has them: every link carries the data once. (A tree's root sends
// it log2 n times, and those flows, leaving through one link at once, overflowed its queue: TCP
// then stalls a flow for a 200 ms retransmission timeout, which the rail watchdog took for a cut.)
// The chain's length costs n - 2 piece times. Both are pipelined in pieces small enough that no
// rank waits long in silence for its first piece (the watchdog must tell a cut from a rank waiting
// its turn). A rank only ever waits on its parent or its children, so blocking sends cannot
// deadlock, buffered or not.
#include <algorithm>
#include <cstdint>
#include <string>

#include "collectives/algorithm_util.h"
#include "collectives/collectives.h"

namespace nezha::collectives {
namespace {
// The bytes a rank may wait for, beyond its own, before its first piece arrives: 33 ms at
// 250 Mbit/s, 8 ms at 1 Gbit/s, whatever the number of ranks: a rank silent for longer than the
// watchdog allows a busy rail would be taken for a cut.
constexpr size_t kFirstPieceWaitBytes = 1 << 20;
constexpr size_t kMinPieceBytes = 16 << 10;  // below this, per-message costs dominate
// A chain costs n - 2 piece times beyond the payload's own, so on a network rail a small payload is
// cut into this many pieces (none below kMinPieceBytes): one piece crossing three links in turn
// would take three times as long as the bytes.
constexpr size_t kChainPieces = 4;

// `waits`: how many piece times the farthest rank waits before its first piece.
size_t piece_bytes(size_t segment_bytes, size_t waits) {
  const size_t budget =
      std::max(kMinPieceBytes, kFirstPieceWaitBytes / std::max<size_t>(1, waits));
  return std::clamp<size_t>(segment_bytes, 1, budget);
}

void tree(transport::PointToPointRail& rail, uint8_t* data, size_t bytes, int root,
          const CollectiveOptions& opt) {
  const int n = rail.size();
  const int vrank = detail::ring_mod(rail.rank() - root, n);  // 0 = root
  auto to_rank = [&](int v) { return detail::ring_mod(v + root, n); };
  // Receive from the parent: vrank minus its lowest set bit. The tag step is that bit's index, the
  // round in which the parent sends it.
  int bit = 0;
  while ((1 << bit) < n && !(vrank & (1 << bit))) ++bit;
  // A rank at depth d waits while each ancestor passes a piece to all its children (they share its
  // link): up to d (d + 1) / 2 piece times.
  size_t depth = 0;
  while ((size_t{1} << depth) < static_cast<size_t>(n)) ++depth;
  const size_t piece = piece_bytes(opt.segment_bytes, depth * (depth + 1) / 2);
  // Piece p of round k travels under step p * 64 + k (k < 64 for any rank count).
  for (size_t off = 0, p = 0; off < bytes; off += piece, ++p) {
    const size_t len = std::min(piece, bytes - off);
    if (vrank != 0) {
      rail.recv(to_rank(vrank - (1 << bit)), make_tag(opt.seq, p * 64 + static_cast<uint64_t>(bit)),
                data + off, len, opt.deadline);
    }
    // Then to children vrank + 2^k for every k below that bit, farthest first (the larger subtree
    // gets the data earliest).
    for (int k = bit - 1; k >= 0; --k) {
      const int child = vrank + (1 << k);
      if (child < n) {
        rail.send(to_rank(child), make_tag(opt.seq, p * 64 + static_cast<uint64_t>(k)), data + off,
                  len, opt.deadline);
      }
    }
  }
}

void chain(transport::PointToPointRail& rail, uint8_t* data, size_t bytes, int root,
           const CollectiveOptions& opt) {
  const int n = rail.size();
  const int vrank = detail::ring_mod(rail.rank() - root, n);  // 0 = root
  auto to_rank = [&](int v) { return detail::ring_mod(v + root, n); };
  size_t piece = piece_bytes(opt.segment_bytes, static_cast<size_t>(n - 1));
  if (rail.properties().reach != transport::RailReach::kHost)
    piece = std::min(piece, std::max(kMinPieceBytes, (bytes + kChainPieces - 1) / kChainPieces));
  for (size_t off = 0, p = 0; off < bytes; off += piece, ++p) {
    const size_t len = std::min(piece, bytes - off);
    const uint64_t tag = make_tag(opt.seq, p);
    if (vrank != 0) rail.recv(to_rank(vrank - 1), tag, data + off, len, opt.deadline);
    if (vrank + 1 < n) rail.send(to_rank(vrank + 1), tag, data + off, len, opt.deadline);
  }
}
}  // namespace

void broadcast(transport::PointToPointRail& rail, void* buf, size_t bytes, int root,
               const CollectiveOptions& opt) {
  const int n = rail.size();
  detail::require(root >= 0 && root < n, "broadcast: root " + std::to_string(root) +
                                             " out of range for " + std::to_string(n) + " ranks");
  detail::require(buf != nullptr || bytes == 0, "broadcast: null buffer");
  if (n == 1 || bytes == 0) return;

  uint8_t* data = static_cast<uint8_t*>(buf);
  const bool in_host = rail.properties().reach == transport::RailReach::kHost;
  if (bytes < (in_host ? kBroadcastChainMinBytesInHost : kBroadcastChainMinBytes))
    tree(rail, data, bytes, root, opt);
  else chain(rail, data, bytes, root, opt);
}

}  // namespace nezha::collectives

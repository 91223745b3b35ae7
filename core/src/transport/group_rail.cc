#include "transport/group_rail.h"


#include "common/error.h"

namespace nezha::transport {

namespace {
std::string ranks_str(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}
}  // namespace

GroupRail::GroupRail(PointToPointRail& parent, std::vector<int> members)
    : parent_(parent), members_(std::move(members)) {
  // Built only for an error: the log-step and halving/doubling make a view per operation.
  const auto where = [&] { return "group of rail '" + parent_.properties().name + "' (ranks " + ranks_str(members_) + ")"; };
  std::vector<bool> listed(static_cast<size_t>(parent_.size()), false);  // linear: one view per operation
  for (size_t i = 0; i < members_.size(); ++i) {
    const int m = members_[i];
    if (m < 0 || m >= parent_.size())
      throw InvalidArgument(where() + ": rank " + std::to_string(m) + " is not a rank of the job (size " +
                            std::to_string(parent_.size()) + ")");
    if (listed[static_cast<size_t>(m)])
      throw InvalidArgument(where() + ": rank " + std::to_string(m) + " is listed twice");
    listed[static_cast<size_t>(m)] = true;
    if (m == parent_.rank()) rank_ = static_cast<int>(i);
  }
  if (rank_ < 0)
    throw InvalidArgument(where() + ": this rank (" + std::to_string(parent_.rank()) + ") is not a member");
}

void GroupRail::connect(const std::vector<std::string>&, const Deadline&) {
  std::vector<int> missing;
  for (size_t i = 0; i < members_.size(); ++i)
    if (static_cast<int>(i) != rank_ && !parent_.reaches(members_[i])) missing.push_back(members_[i]);
  if (!missing.empty())
    throw NezhaError("rail '" + parent_.properties().name + "' does not reach rank(s) " + ranks_str(missing) +
                     " of the group (ranks " + ranks_str(members_) + ")");
}

bool GroupRail::reaches(int peer) const {
  if (peer < 0 || peer >= size() || peer == rank_) return false;
  return parent_.reaches(members_[static_cast<size_t>(peer)]);
}

int GroupRail::to_job(int peer, const char* verb) const {
  if (peer < 0 || peer >= size())
    throw InvalidArgument(std::string(verb) + " on a group of rail '" + parent_.properties().name + "': peer " +
                          std::to_string(peer) + " is outside the group of " + std::to_string(size()));
  return members_[static_cast<size_t>(peer)];
}

void GroupRail::send(int peer, uint64_t tag, const void* data, size_t bytes, const Deadline& deadline) {
  parent_.send(to_job(peer, "send"), tag, data, bytes, deadline);
}

void GroupRail::recv(int peer, uint64_t tag, void* data, size_t bytes, const Deadline& deadline) {
  parent_.recv(to_job(peer, "recv"), tag, data, bytes, deadline);
}

void GroupRail::sendrecv_tags(int send_peer, const void* send_data, size_t send_bytes, uint64_t send_tag,
                              int recv_peer, void* recv_data, size_t recv_bytes, uint64_t recv_tag,
                              const Deadline& deadline) {
  parent_.sendrecv_tags(to_job(send_peer, "sendrecv"), send_data, send_bytes, send_tag,
                        to_job(recv_peer, "sendrecv"), recv_data, recv_bytes, recv_tag, deadline);
}

}  // namespace nezha::transport

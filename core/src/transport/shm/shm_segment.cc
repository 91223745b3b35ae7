#include "transport/shm/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "common/error.h"

namespace nezha::transport::shm {

namespace {

constexpr size_t kPage = 4096;

size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

size_t rings_offset() { return round_up(sizeof(SegmentHeader), 64); }
size_t data_offset(uint32_t slots) { return round_up(rings_offset() + slots * sizeof(RingControl), kPage); }

size_t trailer_offset(uint32_t slots, uint64_t ring_bytes) {
  return round_up(data_offset(slots) + static_cast<size_t>(slots) * ring_bytes, kPage);
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

size_t segment_bytes_for(uint32_t slots, uint64_t ring_bytes, uint64_t trailer_bytes) {
  if (trailer_bytes == 0) return data_offset(slots) + static_cast<size_t>(slots) * ring_bytes;
  return trailer_offset(slots, ring_bytes) + round_up(trailer_bytes, kPage);
}

Segment& Segment::operator=(Segment&& o) noexcept {
  if (this != &o) {
    unmap();
    base_ = o.base_;
    bytes_ = o.bytes_;
    fd_ = o.fd_;
    o.base_ = nullptr;
    o.bytes_ = 0;
    o.fd_ = -1;
  }
  return *this;
}

void Segment::release_fd() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void Segment::unmap() {
  if (base_) ::munmap(base_, bytes_);
  base_ = nullptr;
  bytes_ = 0;
  release_fd();
}

RingControl* Segment::ring(uint32_t slot) const {
  return reinterpret_cast<RingControl*>(base_ + rings_offset()) + slot;
}

uint8_t* Segment::ring_data(uint32_t slot) const {
  return base_ + data_offset(header()->slots) + static_cast<size_t>(slot) * header()->ring_bytes;
}

uint8_t* Segment::trailer() const {
  if (header()->trailer_bytes == 0) return nullptr;
  return base_ + trailer_offset(header()->slots, header()->ring_bytes);
}

Segment Segment::create(const SegmentIdentity& id) {
  if (id.slots == 0 || id.ring_bytes == 0 || id.job_tag.size() != 16 || id.nonce.size() != 16)
    throw InvalidArgument("shm segment: bad layout request");
  const size_t bytes = segment_bytes_for(id.slots, id.ring_bytes, id.trailer_bytes);
  Segment s;
  s.fd_ = ::memfd_create("nezha-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (s.fd_ < 0) throw NezhaError("shm segment: memfd_create failed: " + errno_text());
  if (::ftruncate(s.fd_, static_cast<off_t>(bytes)) != 0)
    throw NezhaError("shm segment: cannot size a segment of " + std::to_string(bytes) +
                     " bytes: " + errno_text());
  // Peers may not resize it under us (a shrink would turn our accesses into SIGBUS).
  if (::fcntl(s.fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    throw NezhaError("shm segment: cannot seal the memfd: " + errno_text());
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s.fd_, 0);
  if (p == MAP_FAILED) throw NezhaError("shm segment: mmap of " + std::to_string(bytes) + " bytes failed: " + errno_text());
  s.base_ = static_cast<uint8_t*>(p);
  s.bytes_ = bytes;
  // Fresh memfd pages are zero; construct the header and ring controls in place.
  SegmentHeader* h = new (s.base_) SegmentHeader();
  h->magic = kSegmentMagic;
  h->version = kSegmentVersion;
  h->slots = id.slots;
  std::memcpy(h->job_tag, id.job_tag.data(), 16);
  std::memcpy(h->nonce, id.nonce.data(), 16);
  h->creator_pid = id.creator_pid;
  h->owner_rank = id.owner_rank;
  h->creator_start_time = id.creator_start_time;
  h->ring_bytes = id.ring_bytes;
  h->segment_bytes = bytes;
  h->trailer_bytes = id.trailer_bytes;
  h->creator_base = reinterpret_cast<uint64_t>(s.base_);
  h->doorbell.store(0);
  h->sleeping.store(0);
  h->closed.store(0);
  h->wake_after.store(1);
  for (uint32_t i = 0; i < id.slots; ++i) new (s.ring(i)) RingControl();
  return s;
}

std::string header_mismatch(const SegmentHeader& h, size_t mapped_bytes, const SegmentIdentity& e) {
  if (mapped_bytes < sizeof(SegmentHeader)) return "segment smaller than its header";
  if (h.magic != kSegmentMagic) return "not a nezha shm segment (bad magic)";
  if (h.version != kSegmentVersion)
    return "segment version " + std::to_string(h.version) + ", expected " + std::to_string(kSegmentVersion);
  if (std::memcmp(h.job_tag, e.job_tag.data(), 16) != 0) return "segment belongs to another job (job tag differs)";
  if (std::memcmp(h.nonce, e.nonce.data(), 16) != 0) return "segment of another rail instance (nonce differs)";
  if (h.creator_pid != e.creator_pid || h.creator_start_time != e.creator_start_time)
    return "segment created by pid " + std::to_string(h.creator_pid) + " (start " +
           std::to_string(h.creator_start_time) + "), expected pid " + std::to_string(e.creator_pid) +
           " (start " + std::to_string(e.creator_start_time) + ")";
  if (h.owner_rank != e.owner_rank)
    return "segment of rank " + std::to_string(h.owner_rank) + ", expected rank " + std::to_string(e.owner_rank);
  if (h.slots != e.slots || h.ring_bytes != e.ring_bytes)
    return "segment layout " + std::to_string(h.slots) + " x " + std::to_string(h.ring_bytes) +
           " bytes, expected " + std::to_string(e.slots) + " x " + std::to_string(e.ring_bytes);
  if (h.trailer_bytes != e.trailer_bytes)
    return "segment trailer of " + std::to_string(h.trailer_bytes) + " bytes, expected " + std::to_string(e.trailer_bytes);
  const size_t want = segment_bytes_for(e.slots, e.ring_bytes, e.trailer_bytes);
  if (h.segment_bytes != want || mapped_bytes != want)
    return "segment size " + std::to_string(mapped_bytes) + ", expected " + std::to_string(want);
  return "";
}

Segment Segment::attach(int fd, const SegmentIdentity& expected, const std::string& who) {
  Segment s;
  s.fd_ = fd;
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw NezhaError(who + ": fstat on the received segment failed: " + errno_text());
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
    throw ProtocolError(who + ": refused a shm segment that is not sealed against resizing");
  const size_t bytes = static_cast<size_t>(st.st_size);
  if (bytes < sizeof(SegmentHeader) || bytes > (size_t{1} << 40))
    throw ProtocolError(who + ": refused a shm segment of " + std::to_string(bytes) + " bytes");
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) throw NezhaError(who + ": mmap of the received segment failed: " + errno_text());
  s.base_ = static_cast<uint8_t*>(p);
  s.bytes_ = bytes;
  const std::string why = header_mismatch(*s.header(), bytes, expected);
  if (!why.empty()) throw ProtocolError(who + ": refused its shm segment: " + why);
  s.release_fd();
  return s;
}

}  // namespace nezha::transport::shm

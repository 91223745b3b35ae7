#include "engine/negotiation/message_codec.h"

#include <cmath>
#include <cstring>
#include <type_traits>

#include "common/error.h"
#include "multirail/estimates_codec.h"

namespace nezha::engine {
namespace {

constexpr uint8_t kRequestListTag = 0xA1;
constexpr uint8_t kResponseListTag = 0xB2;
constexpr uint8_t kRoundMessageTag = 0xC3;
constexpr uint32_t kMaxItems = 1u << 20;      // tensors, dims, ranks: far above any real job
constexpr uint32_t kMaxString = kMaxControlString;  // tensor names, error messages

class Writer {
 public:
  template <typename T>
  void put(T v) {
    static_assert(std::is_trivially_copyable<T>::value, "POD only");
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));  // little-endian hosts only (x86-64, aarch64)
    out_.append(b, sizeof(T));
  }
  void put_string(const std::string& s) {
    if (s.size() > kMaxString)  // the decoder would refuse it: fail here, before anything is sent
      throw InvalidArgument("string of " + std::to_string(s.size()) + " bytes exceeds the " +
                            std::to_string(kMaxString) + "-byte limit of control messages");
    put<uint32_t>(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  template <typename T>
  void put_vector(const std::vector<T>& v) {
    put<uint32_t>(static_cast<uint32_t>(v.size()));
    for (const T& x : v) put<T>(x);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(const std::string& s) : data_(s), pos_(0) {}
  template <typename T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  uint32_t get_count(uint32_t max, const char* what) {
    uint32_t n = get<uint32_t>();
    if (n > max) throw ProtocolError(std::string("control message: ") + what + " count " +
                                     std::to_string(n) + " exceeds the limit");
    return n;
  }
  std::string get_string() {
    uint32_t n = get_count(kMaxString, "string");
    need(n);
    std::string s = data_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  template <typename T>
  std::vector<T> get_vector() {
    uint32_t n = get_count(kMaxItems, "vector");
    need(static_cast<size_t>(n) * sizeof(T));
    std::vector<T> v(n);
    for (auto& x : v) x = get<T>();
    return v;
  }
  void expect_end() {
    if (pos_ != data_.size())
      throw ProtocolError("control message: " + std::to_string(data_.size() - pos_) +
                          " trailing bytes");
  }

 private:
  void need(size_t n) {
    if (data_.size() - pos_ < n) throw ProtocolError("control message truncated");
  }
  const std::string& data_;
  size_t pos_;
};

template <typename E>
E checked_enum(uint8_t raw, int limit, const char* what) {
  if (raw >= limit) throw ProtocolError(std::string("control message: bad ") + what + " " +
                                        std::to_string(raw));
  return static_cast<E>(raw);
}

void put_request(Writer& w, const Request& r) {
  w.put<int32_t>(r.cache_id);
  w.put_string(r.name);
  w.put_string(r.inline_input);
  if (r.cache_id >= 0) return;  // the coordinator has the rest
  w.put<uint8_t>(static_cast<uint8_t>(r.type));
  w.put<uint8_t>(static_cast<uint8_t>(r.dtype));
  w.put_vector<int64_t>(r.shape);
  w.put<uint8_t>(static_cast<uint8_t>(r.op));
  w.put<double>(r.prescale);
  w.put<double>(r.postscale);
  w.put<int32_t>(r.root);
  w.put_vector<int64_t>(r.splits);
  w.put_string(r.group);
  w.put<int32_t>(r.group_size);
  w.put<int32_t>(r.process_set);
  w.put<uint8_t>(static_cast<uint8_t>(r.device));
}

Request get_request(Reader& rd) {
  Request r;
  r.cache_id = rd.get<int32_t>();
  r.name = rd.get_string();
  r.inline_input = rd.get_string();
  if (r.cache_id >= 0) return r;
  r.type = checked_enum<OpType>(rd.get<uint8_t>(), 7, "op type");
  r.dtype = checked_enum<DataType>(rd.get<uint8_t>(), kNumDataTypes, "dtype");
  r.shape = rd.get_vector<int64_t>();
  r.op = checked_enum<ReduceOp>(rd.get<uint8_t>(), kNumReduceOps, "reduce op");
  r.prescale = rd.get<double>();
  r.postscale = rd.get<double>();
  r.root = rd.get<int32_t>();
  r.splits = rd.get_vector<int64_t>();
  r.group = rd.get_string();
  r.group_size = rd.get<int32_t>();
  r.process_set = rd.get<int32_t>();
  r.device = checked_enum<Device>(rd.get<uint8_t>(), kNumDevices, "device");
  return r;
}

void put_response(Writer& w, const Response& r) {
  w.put<uint8_t>(static_cast<uint8_t>(r.kind));
  w.put<uint8_t>(static_cast<uint8_t>(r.type));
  w.put<uint32_t>(static_cast<uint32_t>(r.names.size()));
  for (const auto& n : r.names) w.put_string(n);
  w.put_vector<int64_t>(r.counts);
  w.put<uint8_t>(static_cast<uint8_t>(r.dtype));
  w.put<uint8_t>(static_cast<uint8_t>(r.op));
  w.put<double>(r.prescale);
  w.put<double>(r.postscale);
  w.put<int32_t>(r.root);
  w.put_vector<int64_t>(r.row_elements);
  w.put_vector<int64_t>(r.rank_rows);
  w.put_vector<int64_t>(r.splits_matrix);
  w.put<int32_t>(r.last_joined_rank);
  w.put_vector<int32_t>(r.cache_ids);
  w.put<uint32_t>(static_cast<uint32_t>(r.plan.size()));
  for (const auto& s : r.plan) {
    w.put<int32_t>(s.rail);
    w.put<uint64_t>(s.offset);
    w.put<uint64_t>(s.count);
  }
  w.put_string(r.error);
  w.put_string(r.inline_result);
  w.put<int32_t>(r.process_set);
}

Response get_response(Reader& rd) {
  Response r;
  r.kind = checked_enum<Response::Kind>(rd.get<uint8_t>(), 2, "response kind");
  r.type = checked_enum<OpType>(rd.get<uint8_t>(), 7, "op type");
  uint32_t n = rd.get_count(kMaxItems, "names");
  for (uint32_t i = 0; i < n; ++i) r.names.push_back(rd.get_string());
  r.counts = rd.get_vector<int64_t>();
  r.dtype = checked_enum<DataType>(rd.get<uint8_t>(), kNumDataTypes, "dtype");
  r.op = checked_enum<ReduceOp>(rd.get<uint8_t>(), kNumReduceOps, "reduce op");
  r.prescale = rd.get<double>();
  r.postscale = rd.get<double>();
  r.root = rd.get<int32_t>();
  r.row_elements = rd.get_vector<int64_t>();
  r.rank_rows = rd.get_vector<int64_t>();
  r.splits_matrix = rd.get_vector<int64_t>();
  r.last_joined_rank = rd.get<int32_t>();
  r.cache_ids = rd.get_vector<int32_t>();
  uint32_t np = rd.get_count(kMaxItems, "plan");
  for (uint32_t i = 0; i < np; ++i) {
    multirail::RailShare s;
    s.rail = rd.get<int32_t>();
    s.offset = rd.get<uint64_t>();
    s.count = rd.get<uint64_t>();
    r.plan.push_back(s);
  }
  r.error = rd.get_string();
  r.inline_result = rd.get_string();
  r.process_set = rd.get<int32_t>();
  return r;
}

void put_rail_events(Writer& w, const std::vector<RailEvent>& events) {
  w.put<uint32_t>(static_cast<uint32_t>(events.size()));
  for (const auto& e : events) {
    w.put<uint8_t>(static_cast<uint8_t>(e.kind));
    w.put<int32_t>(e.rail);
    w.put<int32_t>(e.target);
    w.put<uint64_t>(e.value);
    w.put_string(e.text);
  }
}

void put_operation_times(Writer& w, const std::vector<multirail::OperationTime>& times) {
  w.put<uint32_t>(static_cast<uint32_t>(times.size()));
  for (const auto& t : times) {
    w.put<uint32_t>(t.bytes);
    w.put<uint8_t>(t.striped ? 1 : 0);
    w.put<float>(t.seconds);
  }
}

std::vector<multirail::OperationTime> get_operation_times(Reader& rd) {
  std::vector<multirail::OperationTime> out(rd.get_count(multirail::kMaxReportedOperations, "operation times"));
  for (auto& t : out) {
    t.bytes = rd.get<uint32_t>();
    const uint8_t striped = rd.get<uint8_t>();
    t.seconds = rd.get<float>();
    if (striped > 1 || !(t.seconds >= 0) || !std::isfinite(t.seconds) || multirail::check_class(t.bytes) < 0)
      throw ProtocolError("control message: an operation time of " + std::to_string(t.bytes) + " B, striped " +
                          std::to_string(striped) + ", " + std::to_string(t.seconds) + " s is not one a rank measures");
    t.striped = striped == 1;
  }
  return out;
}

std::vector<RailEvent> get_rail_events(Reader& rd) {
  std::vector<RailEvent> out(rd.get_count(kMaxItems, "rail events"));
  for (auto& e : out) {
    e.kind = checked_enum<RailEventKind>(rd.get<uint8_t>(), kNumRailEventKinds, "rail event");
    e.rail = rd.get<int32_t>();
    e.target = rd.get<int32_t>();
    e.value = rd.get<uint64_t>();
    e.text = rd.get_string();
  }
  return out;
}

}  // namespace

std::string encode(const RequestList& list) {
  Writer w;
  w.put<uint8_t>(kRequestListTag);
  w.put<uint8_t>(list.shutdown ? 1 : 0);
  w.put<uint32_t>(static_cast<uint32_t>(list.requests.size()));
  for (const auto& r : list.requests) put_request(w, r);
  put_rail_events(w, list.rail_events);
  w.put_vector<uint64_t>(list.completed);
  put_operation_times(w, list.operation_times);
  return w.take();
}

std::string encode(const ResponseList& list) {
  Writer w;
  w.put<uint8_t>(kResponseListTag);
  w.put<uint8_t>(list.shutdown ? 1 : 0);
  std::vector<uint8_t> est = list.estimates.empty() ? std::vector<uint8_t>{}
                                                    : multirail::encode_estimates(list.estimates);
  w.put_string(std::string(est.begin(), est.end()));
  w.put_string(list.fatal);
  w.put<uint32_t>(static_cast<uint32_t>(list.responses.size()));
  for (const auto& r : list.responses) put_response(w, r);
  put_rail_events(w, list.rail_events);
  w.put_vector<uint64_t>(list.watermark);
  w.put<uint64_t>(list.round);
  w.put<uint32_t>(static_cast<uint32_t>(list.notices.size()));
  for (const auto& n : list.notices) w.put_string(n);
  return w.take();
}

std::string encode(const RoundMessage& msg) {
  Writer w;
  w.put<uint8_t>(kRoundMessageTag);
  w.put<uint64_t>(msg.round);
  w.put<uint32_t>(msg.join_gen);
  w.put_vector<int32_t>(msg.pending);
  w.put_vector<int32_t>(msg.invalidate);
  w.put_vector<uint32_t>(msg.invalidate_versions);
  std::vector<uint8_t> est = msg.estimates.empty() ? std::vector<uint8_t>{}
                                                   : multirail::encode_estimates(msg.estimates);
  w.put_string(std::string(est.begin(), est.end()));
  put_operation_times(w, msg.operation_times);
  return w.take();
}

bool is_round_message(const std::string& bytes) {
  return !bytes.empty() && static_cast<uint8_t>(bytes[0]) == kRoundMessageTag;
}

RoundMessage decode_round_message(const std::string& bytes) {
  Reader rd(bytes);
  if (rd.get<uint8_t>() != kRoundMessageTag) throw ProtocolError("control message: not a cache round");
  RoundMessage msg;
  msg.round = rd.get<uint64_t>();
  msg.join_gen = rd.get<uint32_t>();
  msg.pending = rd.get_vector<int32_t>();
  msg.invalidate = rd.get_vector<int32_t>();
  msg.invalidate_versions = rd.get_vector<uint32_t>();
  if (msg.invalidate_versions.size() != msg.invalidate.size())
    throw ProtocolError("control message: cache round has " + std::to_string(msg.invalidate.size()) +
                        " invalidations but " + std::to_string(msg.invalidate_versions.size()) +
                        " versions");
  for (const auto* ids : {&msg.pending, &msg.invalidate})
    for (size_t i = 0; i < ids->size(); ++i)
      if ((*ids)[i] < 0 || (i > 0 && (*ids)[i] <= (*ids)[i - 1]))
        throw ProtocolError("control message: cache round ids must be ascending and >= 0");
  std::string est = rd.get_string();
  if (!est.empty())
    msg.estimates = multirail::decode_estimates(reinterpret_cast<const uint8_t*>(est.data()), est.size());
  msg.operation_times = get_operation_times(rd);
  rd.expect_end();
  return msg;
}

RequestList decode_request_list(const std::string& bytes) {
  Reader rd(bytes);
  if (rd.get<uint8_t>() != kRequestListTag) throw ProtocolError("control message: not a request list");
  RequestList list;
  list.shutdown = rd.get<uint8_t>() != 0;
  uint32_t n = rd.get_count(kMaxItems, "requests");
  for (uint32_t i = 0; i < n; ++i) list.requests.push_back(get_request(rd));
  list.rail_events = get_rail_events(rd);
  list.completed = rd.get_vector<uint64_t>();
  list.operation_times = get_operation_times(rd);
  rd.expect_end();
  return list;
}

ResponseList decode_response_list(const std::string& bytes) {
  Reader rd(bytes);
  if (rd.get<uint8_t>() != kResponseListTag) throw ProtocolError("control message: not a response list");
  ResponseList list;
  list.shutdown = rd.get<uint8_t>() != 0;
  std::string est = rd.get_string();
  if (!est.empty())
    list.estimates = multirail::decode_estimates(reinterpret_cast<const uint8_t*>(est.data()), est.size());
  list.fatal = rd.get_string();
  uint32_t n = rd.get_count(kMaxItems, "responses");
  for (uint32_t i = 0; i < n; ++i) list.responses.push_back(get_response(rd));
  list.rail_events = get_rail_events(rd);
  list.watermark = rd.get_vector<uint64_t>();
  list.round = rd.get<uint64_t>();
  uint32_t nn = rd.get_count(kMaxItems, "notices");
  for (uint32_t i = 0; i < nn; ++i) list.notices.push_back(rd.get_string());
  rd.expect_end();
  return list;
}

}  // namespace nezha::engine

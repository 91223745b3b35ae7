// Control-channel encoding: every field survives a round trip, and anything that is not a valid
// message (truncated, trailing bytes, random corruption) is a ProtocolError, never a crash.
#include "engine/negotiation/message_codec.h"

#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <string>

#include "common/error.h"

namespace nezha::engine {
namespace {

Request full_request() {
  Request r;
  r.type = OpType::kAlltoall;
  r.name = "layer3/weight:grad";
  r.dtype = DataType::kBFloat16;
  r.shape = {7, 3, 2};
  r.op = ReduceOp::kProduct;
  r.prescale = 0.25;
  r.postscale = -3.5;
  r.root = 2;
  r.splits = {1, 4, 2};
  r.group = "bucket-1";
  r.group_size = 5;
  r.process_set = 3;
  r.device = Device::kGpu;
  r.cache_id = -1;
  r.inline_input = std::string("\x01\0\x02\xff", 4);
  return r;
}

Response full_response() {
  Response r;
  r.kind = Response::Kind::kExecute;
  r.type = OpType::kAllreduce;
  r.names = {"a", "b/c", std::string("nul\0inside", 10)};
  r.counts = {10, 20, 1LL << 40};
  r.dtype = DataType::kFloat64;
  r.op = ReduceOp::kAverage;
  r.prescale = 1.0 / 3;
  r.postscale = 8;
  r.root = 3;
  r.row_elements = {6};
  r.rank_rows = {1, 0, 9};
  r.splits_matrix = {0, 1, 2, 3, 4, 5, 6, 7, 8};
  r.last_joined_rank = 2;
  r.cache_ids = {4, -1, 17};
  r.plan = {{0, 0, 100}, {1, 100, 1ULL << 33}};
  r.error = "";
  r.inline_result = std::string("\0\0\x80\x3f", 4);
  r.process_set = 7;
  return r;
}

void expect_same(const Request& a, const Request& b) {
  EXPECT_EQ(a.type, b.type);
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(a.shape, b.shape);
  EXPECT_EQ(a.op, b.op);
  EXPECT_EQ(a.prescale, b.prescale);
  EXPECT_EQ(a.postscale, b.postscale);
  EXPECT_EQ(a.root, b.root);
  EXPECT_EQ(a.splits, b.splits);
  EXPECT_EQ(a.group, b.group);
  EXPECT_EQ(a.group_size, b.group_size);
  EXPECT_EQ(a.process_set, b.process_set);
  EXPECT_EQ(a.device, b.device);
  EXPECT_EQ(a.cache_id, b.cache_id);
  EXPECT_EQ(a.inline_input, b.inline_input);
}

void expect_same(const Response& a, const Response& b) {
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.type, b.type);
  EXPECT_EQ(a.names, b.names);
  EXPECT_EQ(a.counts, b.counts);
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(a.op, b.op);
  EXPECT_EQ(a.prescale, b.prescale);
  EXPECT_EQ(a.postscale, b.postscale);
  EXPECT_EQ(a.root, b.root);
  EXPECT_EQ(a.row_elements, b.row_elements);
  EXPECT_EQ(a.rank_rows, b.rank_rows);
  EXPECT_EQ(a.splits_matrix, b.splits_matrix);
  EXPECT_EQ(a.last_joined_rank, b.last_joined_rank);
  EXPECT_EQ(a.cache_ids, b.cache_ids);
  ASSERT_EQ(a.plan.size(), b.plan.size());
  for (size_t i = 0; i < a.plan.size(); ++i) {
    EXPECT_EQ(a.plan[i].rail, b.plan[i].rail);
    EXPECT_EQ(a.plan[i].offset, b.plan[i].offset);
    EXPECT_EQ(a.plan[i].count, b.plan[i].count);
  }
  EXPECT_EQ(a.error, b.error);
  EXPECT_EQ(a.inline_result, b.inline_result);
  EXPECT_EQ(a.process_set, b.process_set);
}

RequestList sample_request_list() {
  RequestList list;
  list.requests.push_back(full_request());
  Request brief;  // response-cache hit: only name and id travel
  brief.name = "cached/one";
  brief.cache_id = 12;
  brief.inline_input = "12345678";  // a small allreduce's input travels with the brief request too
  list.requests.push_back(brief);
  Request join;
  join.type = OpType::kJoin;
  join.name = kJoinTensorName;
  list.requests.push_back(join);
  list.operation_times = {{65536, true, 2.5e-3f}, {4097, false, 1e-4f}};
  return list;
}

ResponseList sample_response_list() {
  ResponseList list;
  list.responses.push_back(full_response());
  Response err;
  err.kind = Response::Kind::kError;
  err.type = OpType::kBroadcast;
  err.names = {"bad"};
  err.cache_ids = {-1};
  err.error = "tensor 'bad': mismatched shape across ranks: [5] on ranks 0,2; [6] on rank 1";
  list.responses.push_back(err);
  list.estimates = {{12.5, 9.75, 40}, {3, 0, 0}};
  return list;
}

TEST(MessageCodecTest, RequestListRoundTripsEveryField) {
  RequestList in = sample_request_list();
  in.shutdown = true;
  RequestList out = decode_request_list(encode(in));
  EXPECT_TRUE(out.shutdown);
  ASSERT_EQ(out.requests.size(), 3u);
  expect_same(out.requests[0], in.requests[0]);
  EXPECT_EQ(out.requests[1].name, "cached/one");
  EXPECT_EQ(out.requests[1].cache_id, 12);
  EXPECT_EQ(out.requests[1].inline_input, "12345678");
  expect_same(out.requests[2], in.requests[2]);
  ASSERT_EQ(out.operation_times.size(), 2u);
  EXPECT_EQ(out.operation_times[0].bytes, 65536u);
  EXPECT_TRUE(out.operation_times[0].striped);
  EXPECT_EQ(out.operation_times[0].seconds, 2.5e-3f);
  EXPECT_EQ(out.operation_times[1].bytes, 4097u);
  EXPECT_FALSE(out.operation_times[1].striped);
}

TEST(MessageCodecTest, OperationTimesNoRankMeasuresAreProtocolError) {
  // A size the striping check does not check, a negative or non-finite time, a striped flag of 2.
  for (multirail::OperationTime bad : {multirail::OperationTime{8, true, 1e-3f},
                                       multirail::OperationTime{262145, false, 1e-3f},
                                       multirail::OperationTime{65536, true, -1.0f},
                                       multirail::OperationTime{65536, true, std::numeric_limits<float>::infinity()}}) {
    RequestList l;
    l.operation_times = {bad};
    EXPECT_THROW(decode_request_list(encode(l)), ProtocolError) << bad.bytes << " B, " << bad.seconds << " s";
  }
  RequestList l;
  l.operation_times = {{65536, true, 1e-3f}};
  std::string bytes = encode(l);
  bytes[bytes.size() - 5] = 2;  // the striped flag
  EXPECT_THROW(decode_request_list(bytes), ProtocolError);
  RequestList many;
  many.operation_times.assign(multirail::kMaxReportedOperations + 1, {65536, true, 1e-3f});
  EXPECT_THROW(decode_request_list(encode(many)), ProtocolError);
}

TEST(MessageCodecTest, CachedRequestCarriesOnlyNameAndId) {
  RequestList full, brief;
  Request r = full_request();
  full.requests.push_back(r);
  r.cache_id = 3;
  brief.requests.push_back(r);
  EXPECT_LT(encode(brief).size(), encode(full).size());
  Request back = decode_request_list(encode(brief)).requests.at(0);
  EXPECT_EQ(back.name, r.name);
  EXPECT_EQ(back.cache_id, 3);
  EXPECT_TRUE(back.shape.empty());  // metadata did not travel
}

TEST(MessageCodecTest, EmptyListsRoundTrip) {
  RequestList rq;
  RequestList rq2 = decode_request_list(encode(rq));
  EXPECT_TRUE(rq2.requests.empty());
  EXPECT_FALSE(rq2.shutdown);
  ResponseList rs;
  rs.shutdown = true;
  ResponseList rs2 = decode_response_list(encode(rs));
  EXPECT_TRUE(rs2.responses.empty());
  EXPECT_TRUE(rs2.estimates.empty());
  EXPECT_TRUE(rs2.shutdown);
}

TEST(MessageCodecTest, ResponseListRoundTripsEveryField) {
  ResponseList in = sample_response_list();
  ResponseList out = decode_response_list(encode(in));
  EXPECT_FALSE(out.shutdown);
  ASSERT_EQ(out.responses.size(), 2u);
  expect_same(out.responses[0], in.responses[0]);
  expect_same(out.responses[1], in.responses[1]);
  ASSERT_EQ(out.estimates.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(out.estimates[i].alpha_us, in.estimates[i].alpha_us);
    EXPECT_EQ(out.estimates[i].beta_gbps, in.estimates[i].beta_gbps);
    EXPECT_EQ(out.estimates[i].samples, in.estimates[i].samples);
  }
}

TEST(MessageCodecTest, EveryOpTypeDtypeAndReduceOpRoundTrips) {
  for (int t = 0; t <= static_cast<int>(OpType::kJoin); ++t)
    for (int d = 0; d < kNumDataTypes; ++d)
      for (int o = 0; o < kNumReduceOps; ++o) {
        RequestList rq;
        Request r = full_request();
        r.type = static_cast<OpType>(t);
        r.dtype = static_cast<DataType>(d);
        r.op = static_cast<ReduceOp>(o);
        rq.requests.push_back(r);
        expect_same(decode_request_list(encode(rq)).requests.at(0), r);
        ResponseList rs;
        Response p = full_response();
        p.type = r.type;
        p.dtype = r.dtype;
        p.op = r.op;
        rs.responses.push_back(p);
        expect_same(decode_response_list(encode(rs)).responses.at(0), p);
      }
}

TEST(MessageCodecTest, AnUnknownDeviceIsProtocolError) {
  RequestList cpu, gpu;
  cpu.requests.push_back(full_request());
  cpu.requests.back().device = Device::kCpu;
  gpu.requests.push_back(full_request());
  const std::string a = encode(cpu), b = encode(gpu);
  ASSERT_EQ(a.size(), b.size());
  size_t at = a.size();
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) { ASSERT_EQ(at, a.size()) << "more than one byte differs"; at = i; }
  ASSERT_LT(at, a.size());
  EXPECT_EQ(decode_request_list(a).requests.at(0).device, Device::kCpu);
  std::string bad = a;
  bad[at] = static_cast<char>(kNumDevices);
  EXPECT_THROW(decode_request_list(bad), ProtocolError);
}

TEST(MessageCodecTest, RequestAndResponseListsAreNotInterchangeable) {
  EXPECT_THROW(decode_response_list(encode(sample_request_list())), ProtocolError);
  EXPECT_THROW(decode_request_list(encode(sample_response_list())), ProtocolError);
}

TEST(MessageCodecTest, EveryTruncationIsProtocolError) {
  for (const std::string& whole : {encode(sample_request_list()), encode(sample_response_list())}) {
    const bool is_request = whole == encode(sample_request_list());
    for (size_t len = 0; len < whole.size(); ++len) {
      std::string cut = whole.substr(0, len);
      if (is_request) EXPECT_THROW(decode_request_list(cut), ProtocolError) << "length " << len;
      else EXPECT_THROW(decode_response_list(cut), ProtocolError) << "length " << len;
    }
  }
}

TEST(MessageCodecTest, TrailingBytesAreProtocolError) {
  EXPECT_THROW(decode_request_list(encode(sample_request_list()) + '\0'), ProtocolError);
  EXPECT_THROW(decode_response_list(encode(sample_response_list()) + "xyz"), ProtocolError);
}

TEST(MessageCodecTest, BadEnumValuesAreProtocolError) {
  RequestList rq;
  rq.requests.push_back(full_request());
  const std::string good = encode(rq);
  // Layout: tag, shutdown, u32 count, then i32 cache_id, u32 name length, name, u32 inline input
  // length, inline input, u8 type, u8 dtype.
  const size_t type_at = 1 + 1 + 4 + 4 + 4 + full_request().name.size() + 4 + full_request().inline_input.size();
  std::string bad_type = good, bad_dtype = good;
  bad_type[type_at] = 7;
  bad_dtype[type_at + 1] = static_cast<char>(kNumDataTypes);
  EXPECT_THROW(decode_request_list(bad_type), ProtocolError);
  EXPECT_THROW(decode_request_list(bad_dtype), ProtocolError);
}

TEST(MessageCodecTest, HugeCountsAreRejectedWithoutAllocating) {
  // A request list claiming 0xFFFFFFFF requests must fail on the count, not try to reserve them.
  std::string msg = encode(RequestList{});
  msg[2] = msg[3] = msg[4] = msg[5] = static_cast<char>(0xff);
  EXPECT_THROW(decode_request_list(msg), ProtocolError);
  // A shape vector claiming 2^20 dims with no bytes behind it.
  RequestList rq;
  rq.requests.push_back(full_request());
  std::string s = encode(rq);
  const size_t shape_count_at =
      1 + 1 + 4 + 4 + 4 + full_request().name.size() + 4 + full_request().inline_input.size() + 2;
  s[shape_count_at] = 0;
  s[shape_count_at + 1] = 0;
  s[shape_count_at + 2] = 0x10;
  s[shape_count_at + 3] = 0;
  EXPECT_THROW(decode_request_list(s), ProtocolError);
}

TEST(MessageCodecTest, CorruptEstimatesAreProtocolError) {
  ResponseList rs = sample_response_list();
  std::string s = encode(rs);
  // Tag, shutdown, u32 length of the estimates blob, then its magic.
  s[6] ^= 0x5a;
  EXPECT_THROW(decode_response_list(s), ProtocolError);
}

// Random corruption of valid messages: flipped bytes, overwritten spans, cuts and insertions. The
// decoder must either return a list or throw ProtocolError; anything else (another exception type,
// a crash, a sanitizer report) fails.
TEST(MessageCodecTest, RandomMutationsDecodeOrThrowProtocolError) {
  std::mt19937_64 rng(20240917);
  const std::vector<std::string> seeds = {encode(sample_request_list()), encode(sample_response_list()),
                                          encode(RequestList{}), encode(ResponseList{})};
  int decoded = 0, rejected = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    const size_t which = iter % seeds.size();
    std::string m = seeds[which];
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      switch (rng() % 5) {
        case 0:
          if (!m.empty()) m[rng() % m.size()] ^= static_cast<char>(1u << (rng() % 8));
          break;
        case 1:
          if (!m.empty()) m[rng() % m.size()] = static_cast<char>(rng());
          break;
        case 2:
          if (!m.empty()) m.resize(rng() % m.size());
          break;
        case 3:
          m.insert(m.begin() + static_cast<std::ptrdiff_t>(m.empty() ? 0 : rng() % m.size()),
                   static_cast<char>(rng()));
          break;
        case 4:  // 0xff runs make lengths and counts huge
          if (m.size() > 4) {
            size_t at = rng() % (m.size() - 4);
            for (size_t k = 0; k < 4; ++k) m[at + k] = static_cast<char>(0xff);
          }
          break;
      }
    }
    try {
      if (which % 2 == 0) decode_request_list(m);
      else decode_response_list(m);
      ++decoded;
    } catch (const ProtocolError&) {
      ++rejected;
    } catch (const std::exception& ex) {
      ADD_FAILURE() << "iteration " << iter << ": " << typeid(ex).name() << ": " << ex.what();
    }
  }
  EXPECT_GT(rejected, 10000);
  EXPECT_GT(decoded, 0);  // byte flips inside doubles and names still decode
}

TEST(MessageCodecTest, PureRandomBytesNeverCrash) {
  std::mt19937_64 rng(7);
  for (int iter = 0; iter < 5000; ++iter) {
    std::string m(rng() % 64, '\0');
    for (auto& c : m) c = static_cast<char>(rng());
    if (!m.empty() && iter % 2) m[0] = static_cast<char>(iter % 4 == 1 ? 0xA1 : 0xB2);
    try {
      decode_request_list(m);
    } catch (const ProtocolError&) {
    }
    try {
      decode_response_list(m);
    } catch (const ProtocolError&) {
    }
  }
}

TEST(MessageCodecTest, OverlongNameIsRejectedWhenEncodingNotWhenDecoding) {
  // Was a bug (core/src/engine/message_codec.cc, Writer::put_string): the decoder caps strings at
  // kMaxString (64 KiB) but the encoder writes any length. A tensor name (or an error message) over
  // 64 KiB encodes fine on a worker and then makes decode_request_list on rank 0 throw
  // ProtocolError, which stops rank 0's engine loop ("engine stopped: control message: string
  // count ... exceeds the limit") and with it the whole job, instead of failing that one tensor.
  // Fix: put_string throws InvalidArgument above kMaxString (and Engine::enqueue rejects names
  // that long up front; the coordinator truncates error messages to fit).
  RequestList rq;
  Request r = full_request();
  r.name = std::string(70000, 'n');
  rq.requests.push_back(r);
  std::string bytes;
  try {
    bytes = encode(rq);
  } catch (const InvalidArgument&) {
    return;  // the fixed behaviour: refused before anything is sent
  }
  EXPECT_NO_THROW(decode_request_list(bytes)) << "encode produced a message decode rejects";
}

}  // namespace
}  // namespace nezha::engine

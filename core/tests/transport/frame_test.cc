#include "transport/frame.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace nezha::transport {
namespace {

TEST(Frame, HeaderRoundTrip) {
  const HeaderBytes raw = encode_header(FrameType::kControl, 0x0123456789abcdefULL, 4097);
  // The wire layout is fixed: "NZH1", version, type, flags, tag, length, little endian.
  EXPECT_EQ(raw[0], 'N');
  EXPECT_EQ(raw[1], 'Z');
  EXPECT_EQ(raw[2], 'H');
  EXPECT_EQ(raw[3], '1');
  EXPECT_EQ(raw[4], 2);
  EXPECT_EQ(raw[5], static_cast<uint8_t>(FrameType::kControl));
  EXPECT_EQ(raw[8], 0xef);
  EXPECT_EQ(raw[15], 0x01);
  EXPECT_EQ(raw[16], 0x01);  // 4097 = 0x1001
  EXPECT_EQ(raw[17], 0x10);
  for (size_t i = 24; i < kFrameHeaderBytes; ++i) EXPECT_EQ(raw[i], 0) << "reserved byte " << i;
  const FrameHeader h = parse_header(raw.data());
  EXPECT_EQ(h.type, FrameType::kControl);
  EXPECT_EQ(h.flags, 0);
  EXPECT_EQ(h.tag, 0x0123456789abcdefULL);
  EXPECT_EQ(h.length, 4097u);
}

TEST(Frame, EveryTypeRoundTrips) {
  for (FrameType t : {FrameType::kHello, FrameType::kChallenge, FrameType::kAuthResponse,
                      FrameType::kAuthResult, FrameType::kData, FrameType::kControl}) {
    const HeaderBytes raw = encode_header(t, 7, 0);
    EXPECT_EQ(parse_header(raw.data()).type, t) << frame_type_name(t);
  }
}

TEST(Frame, ParseRejectsBadMagic) {
  HeaderBytes raw = encode_header(FrameType::kData, 1, 2);
  raw[0] = 'G';  // e.g. an HTTP client: "GET "
  EXPECT_THROW(parse_header(raw.data()), ProtocolError);
}

TEST(Frame, ParseRejectsBadVersion) {
  HeaderBytes raw = encode_header(FrameType::kData, 1, 2);
  raw[4] = 1;  // a peer built before the 64-byte header
  try {
    parse_header(raw.data());
    FAIL() << "version 1 accepted";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("version 1"), std::string::npos) << e.what();
  }
}

TEST(Frame, HeaderIsOneCacheLineSoPayloadsStayAligned) {
  // Frames are packed back to back in the kernel's socket buffers: a payload whose size is a
  // multiple of 64 must leave the next frame's payload on a cache-line boundary too.
  EXPECT_EQ(kFrameHeaderBytes, 64u);
  EXPECT_EQ(encode_header(FrameType::kData, 1, 2).size(), 64u);
}

TEST(Frame, ParseRejectsNonZeroReservedBytes) {
  HeaderBytes raw = encode_header(FrameType::kData, 1, 2);
  raw[40] = 9;
  try {
    parse_header(raw.data());
    FAIL() << "reserved byte accepted";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("reserved frame header byte 40 is 9"), std::string::npos)
        << e.what();
  }
}

TEST(Frame, ParseRejectsUnknownType) {
  HeaderBytes raw = encode_header(FrameType::kData, 1, 2);
  raw[5] = 0;
  EXPECT_THROW(parse_header(raw.data()), ProtocolError);
  raw[5] = 7;
  EXPECT_THROW(parse_header(raw.data()), ProtocolError);
}

TEST(Frame, ParseWithContextNamesPeerAndRail) {
  HeaderBytes raw = encode_header(FrameType::kData, 1, 2);
  raw[1] = 0;
  try {
    parse_header(raw.data(), 3, "eth1");
    FAIL() << "bad magic accepted";
  } catch (const ProtocolError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rail eth1"), std::string::npos) << what;
    EXPECT_NE(what.find("rank 3"), std::string::npos) << what;
  }
}

std::string check_error(const FrameHeader& h, FrameType type, uint64_t tag, uint64_t len, bool exact) {
  try {
    check_header(h, type, tag, len, exact, 2, "10.0.0.1");
  } catch (const ProtocolError& e) {
    return e.what();
  }
  return "";
}

TEST(Frame, CheckAcceptsMatchingHeaders) {
  const FrameHeader h = parse_header(encode_header(FrameType::kData, 0x42, 100).data());
  EXPECT_EQ(check_error(h, FrameType::kData, 0x42, 100, true), "");
  EXPECT_EQ(check_error(h, FrameType::kData, 0x42, 100, false), "");
  EXPECT_EQ(check_error(h, FrameType::kData, 0x42, 101, false), "");
}

TEST(Frame, CheckRejectsWrongTagNamingPeerRailAndBothTags) {
  const FrameHeader h = parse_header(encode_header(FrameType::kData, 0x42, 100).data());
  const std::string what = check_error(h, FrameType::kData, 0x43, 100, true);
  EXPECT_EQ(what, "rail 10.0.0.1: frame from rank 2 has tag 0x42 where 0x43 was expected");
}

TEST(Frame, CheckRejectsWrongType) {
  const FrameHeader h = parse_header(encode_header(FrameType::kControl, 0, 100).data());
  const std::string what = check_error(h, FrameType::kData, 0, 100, true);
  EXPECT_NE(what.find("type control where data was expected"), std::string::npos) << what;
}

TEST(Frame, CheckRejectsWrongExactLength) {
  const FrameHeader h = parse_header(encode_header(FrameType::kData, 9, 100).data());
  const std::string what = check_error(h, FrameType::kData, 9, 99, true);
  EXPECT_NE(what.find("length 100 where 99 was expected"), std::string::npos) << what;
  EXPECT_NE(what.find("rank 2"), std::string::npos) << what;
}

TEST(Frame, CheckRejectsOversizedControlLength) {
  // A garbage length must be refused before anything is allocated for it.
  const FrameHeader h =
      parse_header(encode_header(FrameType::kControl, 0, kMaxControlPayloadBytes + 1).data());
  const std::string what = check_error(h, FrameType::kControl, 0, kMaxControlPayloadBytes, false);
  EXPECT_NE(what.find("at most"), std::string::npos) << what;
  const FrameHeader ok = parse_header(encode_header(FrameType::kControl, 0, kMaxControlPayloadBytes).data());
  EXPECT_EQ(check_error(ok, FrameType::kControl, 0, kMaxControlPayloadBytes, false), "");
}

}  // namespace
}  // namespace nezha::transport

"""Property-based fuzzing of the wire parsers through the bindings: any bytes either parse into
something valid or raise NezhaError (ProtocolError); never a crash, hang or huge allocation."""
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nezha
from nezha._core import testing

FUZZ = settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.binary(min_size=64, max_size=64))
def test_random_frame_headers_are_rejected_or_valid(raw):
    try:
        ftype, flags, tag, length = testing.parse_frame_header(raw)
    except nezha.NezhaError:
        return
    assert raw[:4] == testing.encode_frame_header(ftype, tag, length)[:4]  # magic checked


@FUZZ
@given(st.integers(1, 6), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_frame_header_round_trip(ftype, tag, length):
    raw = testing.encode_frame_header(ftype, tag, length)
    assert testing.parse_frame_header(raw) == (ftype, 0, tag, length)


@pytest.mark.parametrize("bad", [b"XXXX" + bytes(60), bytes(64)])
def test_bad_magic_is_a_protocol_error(bad):
    with pytest.raises(nezha.NezhaError, match="magic"):
        testing.parse_frame_header(bad)


def _mutate(data, edits):
    b = bytearray(data)
    for pos, val in edits:
        if b:
            b[pos % len(b)] = val
    return bytes(b)


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=6),
       st.integers(0, 400))
def test_mutated_or_truncated_control_messages_never_crash(edits, cut):
    for seed, decode in ((testing.sample_request_list(), testing.decode_request_list),
                         (testing.sample_response_list(), testing.decode_response_list),
                         (testing.sample_round_message(), testing.decode_round_message)):
        for data in (_mutate(seed, edits), seed[:cut], seed + bytes([cut % 256])):
            try:
                decode(data)
            except nezha.NezhaError:
                pass


@FUZZ
@given(st.binary(max_size=300))
def test_random_control_messages_never_crash(raw):
    for decode in (testing.decode_request_list, testing.decode_response_list,
                   testing.decode_round_message):
        try:
            decode(raw)
        except nezha.NezhaError:
            pass


def test_valid_samples_decode_and_huge_counts_are_refused():
    assert testing.decode_request_list(testing.sample_request_list()) == (2, False)
    assert testing.decode_response_list(testing.sample_response_list()) == (1, False)
    assert testing.decode_round_message(testing.sample_round_message()) == (5, 3, 1, 1)
    # A request list claiming 2^32-1 requests must be refused before any allocation.
    huge = bytes([0xA1, 0]) + struct.pack("<I", 0xFFFFFFFF)
    with pytest.raises(nezha.NezhaError):
        testing.decode_request_list(huge)


def test_round_message_with_huge_id_count_is_refused():
    # Tag, u64 round, u32 join generation, then a pending-id count of 2^32-1.
    huge = bytes([0xC3]) + struct.pack("<QI", 1, 0) + struct.pack("<I", 0xFFFFFFFF)
    with pytest.raises(nezha.NezhaError):
        testing.decode_round_message(huge)

"""nezha.compression on numpy arrays, and its hooks specialised for another tensor type (single
process, no job)."""
import ml_dtypes
import numpy as np
import pytest

from nezha.compression import (CastCompressor, Compression, Compressor, compress_all,
                               decompress_all)


@pytest.mark.parametrize("compressor,wire", [(Compression.fp16, np.float16),
                                             (Compression.bf16, ml_dtypes.bfloat16)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cast_compressors_send_floats_narrow_and_give_them_back_in_their_dtype(compressor, wire,
                                                                                dtype):
    x = np.linspace(-3, 3, 7, dtype=dtype)
    sent, ctx = compressor.compress(x)
    assert sent.dtype == np.dtype(wire)
    back = compressor.decompress(sent, ctx)
    assert back.dtype == dtype
    assert np.array_equal(back, x.astype(wire).astype(dtype))


@pytest.mark.parametrize("compressor", [Compression.none, Compression.fp16, Compression.bf16])
def test_integers_pass_untouched(compressor):
    for x in (np.arange(5, dtype=np.int32), np.ones(3, bool)):
        sent, ctx = compressor.compress(x)
        assert sent is x and compressor.decompress(sent, ctx) is x


def test_the_wire_dtype_itself_passes_untouched_and_bfloat16_is_a_float():
    for compressor, x in ((Compression.fp16, np.ones(3, np.float16)),
                          (Compression.bf16, np.ones(3, ml_dtypes.bfloat16))):
        sent, ctx = compressor.compress(x)
        assert sent is x and ctx is None
    bf16 = np.ones(3, ml_dtypes.bfloat16)
    assert Compression.fp16.compress(bf16)[0].dtype == np.float16  # bf16 is a float too


def test_compress_all_and_decompress_all_round_trip_a_mixed_list():
    tensors = [np.full(2, 1.5, np.float32), np.arange(3), np.float64(2.25) * np.ones(1)]
    sent, ctxs = compress_all(Compression.fp16, tensors)
    assert [s.dtype for s in sent] == [np.float16, tensors[1].dtype, np.float16]
    back = decompress_all(Compression.fp16, sent, ctxs)
    assert [b.dtype for b in back] == [t.dtype for t in tensors]
    assert all(np.array_equal(b, t) for b, t in zip(back, tensors))
    assert compress_all(Compression.none, []) == ([], [])


def test_a_framework_specialises_the_cast_compressor_by_three_hooks():
    class Tagged:
        """A toy tensor type: a value and a dtype name."""

        def __init__(self, value, dtype):
            self.value, self.dtype = value, dtype

    class TaggedFP16(CastCompressor):
        wire_dtype = "half"
        is_floating = staticmethod(lambda t: t.dtype in ("half", "float"))
        cast = staticmethod(lambda t, dtype: Tagged(t.value, dtype))

    sent, ctx = TaggedFP16.compress(Tagged(1.0, "float"))
    assert (sent.dtype, ctx) == ("half", "float")
    assert TaggedFP16.decompress(sent, ctx).dtype == "float"
    assert TaggedFP16.compress(Tagged(1, "int"))[1] is None


def test_the_interface_is_horovods():
    with pytest.raises(NotImplementedError):
        Compressor.compress(np.ones(1))
    assert issubclass(Compression.fp16, Compressor) and issubclass(Compression.none, Compressor)

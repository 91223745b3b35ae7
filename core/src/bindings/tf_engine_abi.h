/* The C ABI between nezha._core and nezha.tensorflow's op library (core/src/tf_ops/).
 *
 * Why a C ABI: the op library is a TensorFlow custom-op library (loaded by tf.load_op_library) and
 * must reach the engine nezha._core already runs, never a second copy of it (STYLE, "worth
 * avoiding" 1). _core fills this table and hands it to the library (_core.tf_bind_ops); the two
 * share nothing else, so neither needs the other's C++ types, allocator or build flags.
 *
 * Contract: start() submits one call's tensors to the engine nezha.init() attached and returns at
 * once; `done` then runs exactly once, on a thread of _core's (or on the calling thread when the
 * call is refused before anything was submitted), with error == NULL on success. The tensors'
 * buffers must stay valid until `release(owner)` has run (also exactly once, possibly after `done`:
 * the engine may hold a failed operation's buffers a little longer). A NezhaTfResult is readable
 * only during `done`. Every field is plain data; strings are NUL-terminated UTF-8. */
#ifndef NEZHA_BINDINGS_TF_ENGINE_ABI_H_
#define NEZHA_BINDINGS_TF_ENGINE_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped on any change to the structs below; the library refuses a table of another version. */
#define NEZHA_TF_ABI_VERSION 1

/* One tensor of a call. dtype: a nezha DataType value (common/dtype.h). `output`: where allreduce
 * and broadcast write their result (same size as the input); NULL for the other kinds, whose
 * result the engine allocates (read it from the NezhaTfResult). */
typedef struct NezhaTfTensor {
  int32_t dtype;
  int32_t ndim;
  const int64_t* dims;
  const void* data;
  void* output;
} NezhaTfTensor;

/* The kinds of call (engine/request.h's OpType values; tf_engine.cc checks that they match). */
enum {
  NEZHA_TF_ALLREDUCE = 0,
  NEZHA_TF_ALLGATHER = 1,
  NEZHA_TF_BROADCAST = 2,
  NEZHA_TF_ALLTOALL = 3,
  NEZHA_TF_REDUCESCATTER = 4,
  NEZHA_TF_JOIN = 6
};

/* One call: kind is one of NEZHA_TF_*, reduce_op a nezha ReduceOp value (common/dtype.h). Several tensors of allreduce, broadcast, allgather and reducescatter are
 * negotiated as one group named `name` (members `name.0`, `name.1`, ...); alltoall takes one
 * tensor and `splits` (rows to each rank of the set, in rank order); join takes none. */
typedef struct NezhaTfCall {
  int32_t kind;
  const char* name;
  int32_t reduce_op;
  double prescale;
  double postscale;
  int32_t root;
  int32_t process_set;
  const int64_t* splits;
  int32_t num_splits;
} NezhaTfCall;

typedef struct NezhaTfResult NezhaTfResult;

typedef void (*NezhaTfDone)(void* arg, const NezhaTfResult* result, const char* error);
typedef void (*NezhaTfRelease)(void* owner);

typedef struct NezhaTfEngineApi {
  uint32_t abi_version;
  uint32_t struct_size;
  void (*start)(const NezhaTfCall* call, const NezhaTfTensor* tensors, int32_t num_tensors,
                NezhaTfDone done, void* arg, NezhaTfRelease release, void* owner);
  /* Tensor i's engine-allocated result (allgather, reducescatter, alltoall): bytes and shape. */
  const void* (*output)(const NezhaTfResult* result, int32_t i, size_t* bytes,
                        const int64_t** dims, int32_t* ndim);
  /* alltoall: rows received from each rank. */
  const int64_t* (*received_splits)(const NezhaTfResult* result, int32_t i, int32_t* n);
  /* join: the rank that joined last. */
  int32_t (*last_joined_rank)(const NezhaTfResult* result);
} NezhaTfEngineApi;

/* Exported by the op library; _core calls it with its table. Returns 0, or -1 when the table's
 * version differs from the library's (a stale build: the library then fails every op clearly). */
typedef int (*NezhaTfBindFn)(const NezhaTfEngineApi* api);
#define NEZHA_TF_BIND_SYMBOL "nezha_tf_bind"

#ifdef __cplusplus
}
#endif

#endif /* NEZHA_BINDINGS_TF_ENGINE_ABI_H_ */

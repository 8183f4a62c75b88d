// Shared by every unit of hpcrep's compiled allreduce: constants, the numbering of reductions
// and of engine errors (both mirrored in Python, and checked there when the library loads), and
// how an engine error becomes a TensorFlow Status.
//
// The op (ops.cc) packs a step's tensors into a request and queues it on a communicator's
// engine (engine.h), whose thread agrees with the other ranks on what is ready (negotiate.cc) and
// reduces it (execute.cc); the element-wise work lives in kernels.cc, the C interface for the
// Python side (ctypes) in c_api.cc. Built by hpcrep/tensorflow/native/build.py.

#ifndef HPCREP_NATIVE_COMMON_H_
#define HPCREP_NATIVE_COMMON_H_

#include <cstdint>
#include <string>

#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/platform/status.h"

namespace hpcrep {

constexpr int64_t kAlign = 64;  // bytes; the same as hpcrep.comm.fusion.ALIGN
constexpr int kMaxBatch = 32;   // requests agreed in one cycle

// Reductions, numbered as Python's hpcrep.comm.ops.ReduceOp (Horovod's values); the op's
// reduce_op attribute is that value. 2 (Adasum) is not supported. hpcrep_native_reduce_ops()
// reports this table and the loader refuses a library whose numbers differ.
enum ReduceKind : int { kAverage = 0, kSum = 1, kMin = 3, kMax = 4, kProduct = 5 };
constexpr int kReduceKinds = 6;  // size of tables indexed by ReduceKind

// Why an allreduce failed, carried by the Status's payload kPayloadKey (the decimal number),
// mirrored by hpcrep.tensorflow.native.EngineError, which maps it to hpcrep's error types.
enum class ErrorKind : int {
  kMismatch = 1,  // ranks passed different requests at the same point
  kJoin = 2,      // a request that cannot run while a rank waits in join()
  kMpi = 3,       // MPI returned an error code
  kFreed = 4,     // the op names an engine that has been unregistered
};
constexpr char kPayloadKey[] = "hpcrep.error";

// A Status with TensorFlow's code for `kind` (FailedPrecondition for mismatch, join and freed
// engines, as Horovod's ops raise; Internal for MPI) and the kind as its payload.
tensorflow::Status EngineError(ErrorKind kind, const std::string& message);

// Elements of a request slot rounded up to whole 64-byte lines (hpcrep.comm.fusion.padded_count).
inline int64_t Padded(int64_t count, int64_t itemsize) {
  int64_t per = itemsize >= kAlign ? 1 : kAlign / itemsize;
  return (count + per - 1) / per * per;
}

}  // namespace hpcrep

#endif  // HPCREP_NATIVE_COMMON_H_

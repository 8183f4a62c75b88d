// Element types and the element-wise work on request buffers: MPI types and reductions per
// TensorFlow dtype (half precision included), and the scaling around the sum.

#ifndef HPCREP_NATIVE_KERNELS_H_
#define HPCREP_NATIVE_KERNELS_H_

#include <mpi.h>

#include <cstdint>

#include "common.h"
#include "tensorflow/core/framework/types.h"

namespace hpcrep {

struct TypeInfo {
  MPI_Datatype mpi = MPI_DATATYPE_NULL;
  int itemsize = 0;
  bool floating = false;
  MPI_Op half_ops[kReduceKinds] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL,
                                   MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
};

// The dtypes the op takes (its "T" attribute). The first call creates the half-precision MPI
// operations, so make it on a thread that may call MPI (registration does).
const TypeInfo& Info(tensorflow::DataType dtype);

// The MPI operation that reduces `dtype` with `kind` (Average: a sum, scaled around it).
MPI_Op MpiOp(tensorflow::DataType dtype, int kind);

// float32 <-> float16, round to nearest even (F16C where the CPU has it): the tuned fp16 wire.
void FloatToHalf(const float* src, Eigen::half* dst, int64_t n);
void HalfToFloat(const Eigen::half* src, float* dst, int64_t n);

// The scaling of one reduction, in one place for both ends of it: before the sum, the pre-scale
// (with Average's 1/size folded in for floating types, so it costs nothing extra); after it,
// integer Average's floor division by size, then the post-scale. The same rules as
// hpcrep.comm.collectives.allreduce_into_buckets, so both paths give the same bits.
class Scaling {
 public:
  Scaling(tensorflow::DataType dtype, int kind, int size, double prescale, double postscale);

  // dst = src * pre-scale (n elements; src may be dst).
  void Before(const void* src, void* dst, int64_t n) const;
  // In place, after the sum: floor division (integer Average), then the post-scale.
  void After(void* data, int64_t n) const;

 private:
  tensorflow::DataType dtype_;
  double pre_;
  int64_t divisor_;  // 1: none
  double post_;
};

}  // namespace hpcrep

#endif  // HPCREP_NATIVE_KERNELS_H_

// PowerSGD's arithmetic in three fused passes over a gradient's bytes (hpcrep/tensorflow/powersgd.py).
//
// On one core per rank PowerSGD is bound by how often it streams the [n, m] matrices through
// memory, not by its flops (rank r is 1-4). Written with TensorFlow ops, one step reads or writes
// them about nine times (M = G + E; M Q; M^T P; P Q^T; E = M - P Q^T); these kernels do it in
// seven, each row loaded once per pass and kept in cache for its r dot products or updates:
//
//   HpcrepPowersgdProject(G, E, Q) -> (M, P):  M = G + E, P = M Q         reads 2, writes 1
//   HpcrepPowersgdBack(M, P) -> Q:             Q = M^T P                   reads 1
//   HpcrepPowersgdApprox(M, P, Q) -> (A, E):   A = P Q^T, E = M - A        reads 1, writes 2
//
// (the averages of P and Q, and P's orthonormalisation, happen between them, in the graph). The
// results are a deterministic function of the inputs: rows are independent in Project and Approx,
// and Back sums fixed blocks of rows in a fixed order, so the bits do not depend on how many
// threads TensorFlow gives the op.

#include <algorithm>
#include <vector>

#include "Eigen/Core"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/platform/threadpool.h"

namespace hpcrep {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

namespace {

template <typename T>
using Row = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, 1>>;
template <typename T>
using ConstRow = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, 1>>;

// Rows summed together by one task of HpcrepPowersgdBack: fixed, so that the summation order (and
// the result's bits) is the same whatever the thread count.
constexpr int64_t kBackBlockRows = 128;

// Runs fn(begin, end) over [0, total) on the op's CPU worker threads (inline when it has one).
void ForRows(OpKernelContext* ctx, int64_t total, int64_t cost_per_row,
             const std::function<void(int64_t, int64_t)>& fn) {
  const auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  if (workers == nullptr || workers->num_threads <= 1 || total <= 1) {
    fn(0, total);
    return;
  }
  workers->workers->ParallelFor(total, cost_per_row, fn);
}

// Q [m, r] as r contiguous rows of m (Q^T), so each dot product and update runs over contiguous
// memory.
template <typename T>
std::vector<T> Transposed(const T* q, int64_t m, int64_t r) {
  std::vector<T> qt(static_cast<size_t>(m * r));
  for (int64_t j = 0; j < m; ++j)
    for (int64_t k = 0; k < r; ++k) qt[k * m + j] = q[j * r + k];
  return qt;
}

// Checks that `matrix` is [n, m] and `factor` is [rows, r], and returns r.
absl::Status CheckFactor(const Tensor& factor, int64_t rows, const char* what, int64_t* r) {
  if (factor.dims() != 2 || factor.dim_size(0) != rows || factor.dim_size(1) < 1)
    return tensorflow::errors::InvalidArgument("hpcrep PowerSGD: ", what, " must be [", rows,
                                               ", r] with r >= 1, got ",
                                               factor.shape().DebugString());
  *r = factor.dim_size(1);
  return absl::OkStatus();
}

absl::Status CheckMatrix(const Tensor& matrix, const char* what) {
  if (matrix.dims() != 2)
    return tensorflow::errors::InvalidArgument("hpcrep PowerSGD: ", what,
                                               " must be a matrix, got ",
                                               matrix.shape().DebugString());
  return absl::OkStatus();
}

}  // namespace

template <typename T>
class PowersgdProjectOp : public OpKernel {
 public:
  explicit PowersgdProjectOp(OpKernelConstruction* c) : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& grad = ctx->input(0);
    const Tensor& error = ctx->input(1);
    const Tensor& q = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckMatrix(error, "the error buffer"));
    const int64_t n = error.dim_size(0), m = error.dim_size(1);
    OP_REQUIRES(ctx, grad.NumElements() == n * m,
                tensorflow::errors::InvalidArgument(
                    "hpcrep PowerSGD: the gradient has ", grad.NumElements(),
                    " elements, its error buffer ", n * m));
    int64_t r = 0;
    OP_REQUIRES_OK(ctx, CheckFactor(q, m, "Q", &r));
    Tensor* matrix = nullptr;
    Tensor* p = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, m}), &matrix));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n, r}), &p));
    const std::vector<T> qt = Transposed(q.flat<T>().data(), m, r);
    const T* g = grad.flat<T>().data();
    const T* e = error.flat<T>().data();
    T* out = matrix->flat<T>().data();
    T* pp = p->flat<T>().data();
    ForRows(ctx, n, 3 * m * static_cast<int64_t>(sizeof(T)) * (r + 1), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        Row<T> row(out + i * m, m);
        row = ConstRow<T>(g + i * m, m) + ConstRow<T>(e + i * m, m);
        for (int64_t k = 0; k < r; ++k) pp[i * r + k] = row.dot(ConstRow<T>(qt.data() + k * m, m));
      }
    });
  }
};

template <typename T>
class PowersgdBackOp : public OpKernel {
 public:
  explicit PowersgdBackOp(OpKernelConstruction* c) : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& matrix = ctx->input(0);
    const Tensor& p = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckMatrix(matrix, "M"));
    const int64_t n = matrix.dim_size(0), m = matrix.dim_size(1);
    int64_t r = 0;
    OP_REQUIRES_OK(ctx, CheckFactor(p, n, "P", &r));
    Tensor* q = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({m, r}), &q));
    const int64_t blocks = std::max<int64_t>(1, (n + kBackBlockRows - 1) / kBackBlockRows);
    // One [r, m] partial sum per block, summed in block order afterwards.
    std::vector<T> partial(static_cast<size_t>(blocks * r * m), T(0));
    const T* mm = matrix.flat<T>().data();
    const T* pp = p.flat<T>().data();
    ForRows(ctx, blocks, kBackBlockRows * m * static_cast<int64_t>(sizeof(T)) * (r + 1),
            [&](int64_t lo, int64_t hi) {
              for (int64_t b = lo; b < hi; ++b) {
                T* acc = partial.data() + b * r * m;
                const int64_t end = std::min(n, (b + 1) * kBackBlockRows);
                int64_t i = b * kBackBlockRows;
                // Four rows at a time: the partial sums are loaded and stored once per four rows.
                for (; i + 4 <= end; i += 4) {
                  ConstRow<T> r0(mm + i * m, m), r1(mm + (i + 1) * m, m),
                      r2(mm + (i + 2) * m, m), r3(mm + (i + 3) * m, m);
                  const T* f = pp + i * r;
                  for (int64_t k = 0; k < r; ++k)
                    Row<T>(acc + k * m, m) +=
                        f[k] * r0 + f[r + k] * r1 + f[2 * r + k] * r2 + f[3 * r + k] * r3;
                }
                for (; i < end; ++i) {
                  ConstRow<T> row(mm + i * m, m);
                  for (int64_t k = 0; k < r; ++k) Row<T>(acc + k * m, m) += pp[i * r + k] * row;
                }
              }
            });
    for (int64_t b = 1; b < blocks; ++b)
      Row<T>(partial.data(), r * m) += ConstRow<T>(partial.data() + b * r * m, r * m);
    T* out = q->flat<T>().data();
    for (int64_t j = 0; j < m; ++j)
      for (int64_t k = 0; k < r; ++k) out[j * r + k] = partial[k * m + j];
  }
};

template <typename T>
class PowersgdApproxOp : public OpKernel {
 public:
  explicit PowersgdApproxOp(OpKernelConstruction* c) : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& matrix = ctx->input(0);
    const Tensor& p = ctx->input(1);
    const Tensor& q = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckMatrix(matrix, "M"));
    const int64_t n = matrix.dim_size(0), m = matrix.dim_size(1);
    int64_t r = 0, rq = 0;
    OP_REQUIRES_OK(ctx, CheckFactor(p, n, "P", &r));
    OP_REQUIRES_OK(ctx, CheckFactor(q, m, "Q", &rq));
    OP_REQUIRES(ctx, r == rq,
                tensorflow::errors::InvalidArgument("hpcrep PowerSGD: P has ", r,
                                                    " columns and Q ", rq));
    Tensor* approx = nullptr;
    Tensor* error = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, m}), &approx));
    // The new error overwrites M where nothing else holds it (M is this step's own temporary).
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({0}, 1, TensorShape({n, m}), &error));
    const std::vector<T> qt = Transposed(q.flat<T>().data(), m, r);
    const T* mm = matrix.flat<T>().data();
    const T* pp = p.flat<T>().data();
    T* aa = approx->flat<T>().data();
    T* ee = error->flat<T>().data();
    ForRows(ctx, n, 3 * m * static_cast<int64_t>(sizeof(T)) * (r + 1), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        Row<T> a(aa + i * m, m);
        a = pp[i * r] * ConstRow<T>(qt.data(), m);
        for (int64_t k = 1; k < r; ++k) a += pp[i * r + k] * ConstRow<T>(qt.data() + k * m, m);
        Row<T>(ee + i * m, m) = ConstRow<T>(mm + i * m, m) - a;
      }
    });
  }
};

}  // namespace hpcrep

using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

REGISTER_OP("HpcrepPowersgdProject")
    .Input("grad: T")
    .Input("error: T")
    .Input("q: T")
    .Output("matrix: T")
    .Output("p: T")
    .Attr("T: {float, double}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle error, q;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &error));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 2, &q));
      c->set_output(0, error);
      c->set_output(1, c->Matrix(c->Dim(error, 0), c->Dim(q, 1)));
      return absl::OkStatus();
    });

REGISTER_OP("HpcrepPowersgdBack")
    .Input("matrix: T")
    .Input("p: T")
    .Output("q: T")
    .Attr("T: {float, double}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle matrix, p;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &matrix));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &p));
      c->set_output(0, c->Matrix(c->Dim(matrix, 1), c->Dim(p, 1)));
      return absl::OkStatus();
    });

REGISTER_OP("HpcrepPowersgdApprox")
    .Input("matrix: T")
    .Input("p: T")
    .Input("q: T")
    .Output("approx: T")
    .Output("error: T")
    .Attr("T: {float, double}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle matrix;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &matrix));
      c->set_output(0, matrix);
      c->set_output(1, matrix);
      return absl::OkStatus();
    });

#define HPCREP_REGISTER_POWERSGD(T)                                                         \
  REGISTER_KERNEL_BUILDER(                                                                  \
      Name("HpcrepPowersgdProject").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),  \
      hpcrep::PowersgdProjectOp<T>);                                                        \
  REGISTER_KERNEL_BUILDER(                                                                  \
      Name("HpcrepPowersgdBack").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),     \
      hpcrep::PowersgdBackOp<T>);                                                           \
  REGISTER_KERNEL_BUILDER(                                                                  \
      Name("HpcrepPowersgdApprox").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),   \
      hpcrep::PowersgdApproxOp<T>);

HPCREP_REGISTER_POWERSGD(float)
HPCREP_REGISTER_POWERSGD(double)

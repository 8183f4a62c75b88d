// Element types and element-wise kernels (see kernels.h).

#include "kernels.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "tensorflow/core/framework/numeric_types.h"

namespace hpcrep {
namespace {

template <typename T>
struct Wide {  // the type scale factors are applied in
  using type = float;
};
template <>
struct Wide<double> {
  using type = double;
};
template <>
struct Wide<int32_t> {
  using type = double;
};
template <>
struct Wide<int64_t> {
  using type = double;
};

// float16 on x86 with F16C: eight elements per instruction instead of one conversion at a time in
// software (12.8 M sums: 1.7 against 38 ms here). Round to nearest even as the scalar code and
// numpy do, so the bits are the same for every number (NaN payloads may differ).
#if defined(__x86_64__)
bool HasF16C() {
  static const bool yes = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return yes;
}

__attribute__((target("avx,f16c"))) int64_t HalfSumF16C(const Eigen::half* a, Eigen::half* b,
                                                        int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    __m256 y = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b + i),
                     _mm256_cvtps_ph(_mm256_add_ps(x, y), _MM_FROUND_TO_NEAREST_INT));
  }
  return i;  // the caller finishes the tail
}

__attribute__((target("avx,f16c"))) int64_t HalfScaleF16C(const Eigen::half* src,
                                                          Eigen::half* dst, int64_t n, float s) {
  const __m256 scale = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_mul_ps(x, scale), _MM_FROUND_TO_NEAREST_INT));
  }
  return i;
}
__attribute__((target("avx,f16c"))) int64_t ToHalfF16C(const float* src, Eigen::half* dst,
                                                       int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  return i;
}

__attribute__((target("avx,f16c"))) int64_t FromHalfF16C(const Eigen::half* src, float* dst,
                                                         int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  return i;
}
#else
bool HasF16C() { return false; }
int64_t HalfSumF16C(const Eigen::half*, Eigen::half*, int64_t) { return 0; }
int64_t HalfScaleF16C(const Eigen::half*, Eigen::half*, int64_t, float) { return 0; }
int64_t ToHalfF16C(const float*, Eigen::half*, int64_t) { return 0; }
int64_t FromHalfF16C(const Eigen::half*, float*, int64_t) { return 0; }
#endif


// dst = T(wide(src) * wide(T(scale))), numpy's rule for an array times a Python float (the
// float is cast to the array's dtype first, except for integers, which numpy multiplies in
// float64 and casts back, truncating).
template <typename T>
void ScaleCopy(const T* src, T* dst, int64_t n, double scale) {
  using W = typename Wide<T>::type;
  if (scale == 1.0) {
    if (src != dst) std::memcpy(dst, src, n * sizeof(T));
    return;
  }
  if (std::is_integral<T>::value) {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(static_cast<double>(src[i]) * scale);
    return;
  }
  const W s = static_cast<W>(static_cast<T>(scale));
  int64_t i = 0;
  if constexpr (std::is_same<T, Eigen::half>::value) {
    if (HasF16C()) i = HalfScaleF16C(src, dst, n, s);
  }
  for (; i < n; ++i) dst[i] = static_cast<T>(static_cast<W>(src[i]) * s);
}

template <typename T>
void FloorDivide(T* buf, int64_t n, int64_t d) {  // numpy floor_divide for integers
  if constexpr (std::is_integral<T>::value) {
    for (int64_t i = 0; i < n; ++i) {
      T q = buf[i] / static_cast<T>(d);
      if ((buf[i] % static_cast<T>(d) != 0) && ((buf[i] < 0) != (d < 0))) --q;
      buf[i] = q;
    }
  }
}

// Half-precision reductions: MPI has none, so they are user-defined operations that compute in
// float and round once, as numpy does.
template <typename T, int K>
void HalfReduce(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  int i = 0;
  if constexpr (std::is_same<T, Eigen::half>::value && K == kSum) {
    if (HasF16C()) i = static_cast<int>(HalfSumF16C(a, b, *len));
  }
  for (; i < *len; ++i) {
    float x = static_cast<float>(a[i]), y = static_cast<float>(b[i]);
    float r = K == kMin ? std::min(x, y) : K == kMax ? std::max(x, y) : K == kProduct ? x * y : x + y;
    if (K == kMin && (x != x || y != y)) r = x != x ? x : y;  // numpy propagates NaN
    if (K == kMax && (x != x || y != y)) r = x != x ? x : y;
    b[i] = static_cast<T>(r);
  }
}

template <typename T>
void CreateHalfOps(TypeInfo* info) {
  MPI_Op_create(&HalfReduce<T, kSum>, 1, &info->half_ops[kSum]);
  info->half_ops[kAverage] = info->half_ops[kSum];
  MPI_Op_create(&HalfReduce<T, kMin>, 1, &info->half_ops[kMin]);
  MPI_Op_create(&HalfReduce<T, kMax>, 1, &info->half_ops[kMax]);
  MPI_Op_create(&HalfReduce<T, kProduct>, 1, &info->half_ops[kProduct]);
}

#define HPCREP_DISPATCH(DTYPE, CALL)                                               \
  switch (DTYPE) {                                                                 \
    case tensorflow::DT_FLOAT: { using T = float; CALL; break; }                    \
    case tensorflow::DT_DOUBLE: { using T = double; CALL; break; }                  \
    case tensorflow::DT_INT32: { using T = int32_t; CALL; break; }                  \
    case tensorflow::DT_INT64: { using T = int64_t; CALL; break; }                  \
    case tensorflow::DT_HALF: { using T = Eigen::half; CALL; break; }               \
    case tensorflow::DT_BFLOAT16: { using T = Eigen::bfloat16; CALL; break; }       \
    default: break;                                                                \
  }

}  // namespace

void FloatToHalf(const float* src, Eigen::half* dst, int64_t n) {
  int64_t i = HasF16C() ? ToHalfF16C(src, dst, n) : 0;
  for (; i < n; ++i) dst[i] = static_cast<Eigen::half>(src[i]);
}

void HalfToFloat(const Eigen::half* src, float* dst, int64_t n) {
  int64_t i = HasF16C() ? FromHalfF16C(src, dst, n) : 0;
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

const TypeInfo& Info(tensorflow::DataType dtype) {
  static std::map<tensorflow::DataType, TypeInfo>* table = [] {
    auto* t = new std::map<tensorflow::DataType, TypeInfo>;
    (*t)[tensorflow::DT_FLOAT] = {MPI_FLOAT, 4, true};
    (*t)[tensorflow::DT_DOUBLE] = {MPI_DOUBLE, 8, true};
    (*t)[tensorflow::DT_INT32] = {MPI_INT32_T, 4, false};
    (*t)[tensorflow::DT_INT64] = {MPI_INT64_T, 8, false};
    (*t)[tensorflow::DT_HALF] = {MPI_UINT16_T, 2, true};
    (*t)[tensorflow::DT_BFLOAT16] = {MPI_UINT16_T, 2, true};
    CreateHalfOps<Eigen::half>(&(*t)[tensorflow::DT_HALF]);
    CreateHalfOps<Eigen::bfloat16>(&(*t)[tensorflow::DT_BFLOAT16]);
    return t;
  }();
  return table->at(dtype);
}

MPI_Op MpiOp(tensorflow::DataType dtype, int kind) {
  const TypeInfo& info = Info(dtype);
  if (info.half_ops[kSum] != MPI_OP_NULL) return info.half_ops[kind];
  switch (kind) {
    case kMin: return MPI_MIN;
    case kMax: return MPI_MAX;
    case kProduct: return MPI_PROD;
    default: return MPI_SUM;
  }
}

Scaling::Scaling(tensorflow::DataType dtype, int kind, int size, double prescale,
                 double postscale)
    : dtype_(dtype), pre_(prescale), divisor_(1), post_(postscale) {
  if (kind == kAverage) {
    if (Info(dtype).floating) {
      pre_ *= 1.0 / size;
    } else {
      divisor_ = size;
    }
  }
}

void Scaling::Before(const void* src, void* dst, int64_t n) const {
  HPCREP_DISPATCH(dtype_, {
    ScaleCopy<T>(static_cast<const T*>(src), static_cast<T*>(dst), n, pre_);
  });
}

void Scaling::After(void* data, int64_t n) const {
  HPCREP_DISPATCH(dtype_, {
    T* values = static_cast<T*>(data);
    if (divisor_ != 1) FloorDivide<T>(values, n, divisor_);
    if (post_ != 1.0) ScaleCopy<T>(values, values, n, post_);
  });
}

}  // namespace hpcrep

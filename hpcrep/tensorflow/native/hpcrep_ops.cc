// hpcrep's compiled allreduce: TensorFlow ops that hand tensors to one communication thread per
// communicator, which calls MPI in the same order on every rank and fuses what is queued.
//
// HpcrepAllreduceEnqueue (stateful, synchronous, cheap) packs its inputs into one 64-byte-aligned
// buffer, folding in the pre-scale, queues it and returns a handle. tf.function's automatic
// control dependencies keep stateful ops in program order, so every rank queues its requests in
// the same order. HpcrepAllreduceWait (asynchronous) returns the reduced buffer once the thread
// has finished it; it does not hold a TensorFlow thread while waiting, so the backward pass goes
// on computing while gradients travel.
//
// The thread works in cycles. A cycle starts when this rank has something queued: one small
// MPI_Allreduce (MAX) tells every rank how many requests all ranks have queued (the common
// prefix, up to kMaxBatch), whether the signatures of that prefix agree (cumulative hashes, as
// hpcrep.comm.check does for one call), and whether ranks wait in join(). The prefix is then
// reduced, requests of one dtype and operation fused into one MPI_Allreduce up to the fusion
// threshold. The prefix length depends on timing, but it is the same on every rank, so results are
// bitwise equal across ranks.
//
// Built by hpcrep/tensorflow/native/build.py against the installed TensorFlow and MPI.

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#if defined(__linux__)
#include <sys/prctl.h>
#endif

#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/types.h"

namespace hpcrep {

using tensorflow::AsyncOpKernel;
using tensorflow::DataType;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;

constexpr int64_t kAlign = 64;     // bytes; the same as hpcrep.comm.fusion.ALIGN
constexpr int kMaxBatch = 32;      // requests agreed in one cycle
std::atomic<int> spin_micros{100};  // HPCREP_NATIVE_SPIN_US: how long threads look before sleeping
constexpr int64_t kNone = std::numeric_limits<int64_t>::min();  // neutral for MAX

enum ReduceKind { kSum = 0, kAverage = 1, kMin = 2, kMax = 3, kProduct = 4 };

// Messages the Python side recognises (hpcrep/tensorflow/native/__init__.py).
const char kMismatch[] = "hpcrep collective mismatch: ";
const char kJoinError[] = "hpcrep join error: ";

int64_t Padded(int64_t count, int64_t itemsize) {
  int64_t per = std::max<int64_t>(1, kAlign / itemsize);
  return (count + per - 1) / per * per;
}

// ---------------------------------------------------------------------------------------------
// Element types.

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

template <typename T>
bool IsFloating() {
  return !std::is_integral<T>::value;
}

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
#else
bool HasF16C() { return false; }
int64_t HalfSumF16C(const Eigen::half*, Eigen::half*, int64_t) { return 0; }
int64_t HalfScaleF16C(const Eigen::half*, Eigen::half*, int64_t, float) { return 0; }
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
  for (int64_t i = 0; i < n; ++i) {
    T q = buf[i] / static_cast<T>(d);
    if ((buf[i] % static_cast<T>(d) != 0) && ((buf[i] < 0) != (d < 0))) --q;
    buf[i] = q;
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

struct TypeInfo {
  MPI_Datatype mpi = MPI_DATATYPE_NULL;
  int itemsize = 0;
  bool floating = false;
  MPI_Op half_ops[5] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
};

template <typename T>
void CreateHalfOps(TypeInfo* info) {
  MPI_Op_create(&HalfReduce<T, kSum>, 1, &info->half_ops[kSum]);
  info->half_ops[kAverage] = info->half_ops[kSum];
  MPI_Op_create(&HalfReduce<T, kMin>, 1, &info->half_ops[kMin]);
  MPI_Op_create(&HalfReduce<T, kMax>, 1, &info->half_ops[kMax]);
  MPI_Op_create(&HalfReduce<T, kProduct>, 1, &info->half_ops[kProduct]);
}

const TypeInfo& Info(DataType dtype) {
  static std::map<DataType, TypeInfo>* table = [] {
    auto* t = new std::map<DataType, TypeInfo>;
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

MPI_Op MpiOp(DataType dtype, int kind) {
  const TypeInfo& info = Info(dtype);
  if (info.half_ops[0] != MPI_OP_NULL) return info.half_ops[kind];
  switch (kind) {
    case kMin: return MPI_MIN;
    case kMax: return MPI_MAX;
    case kProduct: return MPI_PROD;
    default: return MPI_SUM;
  }
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

// ---------------------------------------------------------------------------------------------
// Requests and the communication thread.

struct Request {
  DataType dtype;
  int kind = kSum;
  double postscale = 1.0;
  int64_t signature = 0;
  int64_t chunk_bytes = 0;  // largest single MPI_Allreduce (HPCREP_ALLREDUCE_CHUNK); 0: no limit
  std::string description;
  Tensor buffer;  // packed, pre-scaled; reduced in place
  int64_t length = 0;

  std::mutex mu;
  std::atomic<bool> finished{false};
  Status status;
  std::function<void()> on_finish;  // set by the Wait kernel if it arrives first

  void Finish(Status s) {
    std::function<void()> callback;
    {
      std::lock_guard<std::mutex> lock(mu);
      status = s;
      finished = true;
      callback = std::move(on_finish);
    }
    if (callback) callback();
  }
};

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class Engine {
 public:
  Engine(MPI_Comm comm, bool check, int64_t fusion_bytes, bool polled)
      : comm_(comm), check_(check), fusion_bytes_(fusion_bytes), polled_(polled) {
    MPI_Comm_size(comm_, &size_);
    thread_ = std::thread([this] { Loop(); });
  }

  void Enqueue(std::shared_ptr<Request> request) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(request));
      queued_.fetch_add(1);
    }
    cv_.notify_one();
  }

  int size() const { return size_; }

  // Cycles that reduced something, and requests reduced, since the engine started.
  void Stats(int64_t* cycles, int64_t* reduced) const {
    *cycles = cycles_.load();
    *reduced = reduced_.load();
  }

  // Called by the Python thread in join(): take part in every cycle with zeros until all ranks
  // have joined; JoinPending() turns false then.
  void BeginJoin() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      joined_ = true;
    }
    cv_.notify_one();
  }
  bool JoinPending() {
    std::lock_guard<std::mutex> lock(mu_);
    return joined_;
  }

  // Seconds since the thread started waiting for other ranks with requests of its own (0 if
  // it is not), and what it waits for.
  double Busy(std::string* what) {
    std::lock_guard<std::mutex> lock(busy_mu_);
    if (busy_since_ == 0) return 0;
    *what = busy_what_;
    return busy_since_;
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void SetBusy(double since, const std::string& what) {
    std::lock_guard<std::mutex> lock(busy_mu_);
    busy_since_ = since;
    busy_what_ = what;
  }

  void Loop() {
#if defined(__linux__)
    // Await's short sleeps (5 us and up) would otherwise last Linux's default timer slack, 50 us,
    // longer than a small allreduce: a rank that arrives first would oversleep its partner.
    prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
#endif
    std::vector<int64_t> control(3 + 2 * kMaxBatch);
    while (true) {
      std::vector<std::shared_ptr<Request>> pending;
      bool joined;
      SpinForWork();
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || joined_ || !queue_.empty(); });
        if (stop_ && queue_.empty()) return;
        joined = joined_ && queue_.empty();
        for (size_t i = 0; i < queue_.size() && i < static_cast<size_t>(kMaxBatch); ++i)
          pending.push_back(queue_[i]);
      }
      if (!pending.empty()) SetBusy(Now(), pending[0]->description);
      // control = [max(-count), max(joined), max(-joined), max(H_i), max(-H_i) ...]
      std::fill(control.begin(), control.end(), kNone);
      int64_t n = static_cast<int64_t>(pending.size());
      control[0] = joined ? -std::numeric_limits<int64_t>::max() : -n;
      control[1] = joined ? 1 : 0;
      control[2] = joined ? -1 : 0;
      uint64_t h = 1469598103934665603ull;
      for (int64_t i = 0; i < n && !joined; ++i) {
        h = (h ^ static_cast<uint64_t>(pending[i]->signature)) * 1099511628211ull;
        int64_t v = static_cast<int64_t>(h >> 2);
        control[3 + 2 * i] = v;
        control[4 + 2 * i] = -v;
      }
      MPI_Request request;
      int rc = MPI_Iallreduce(MPI_IN_PLACE, control.data(), static_cast<int>(control.size()),
                              MPI_INT64_T, MPI_MAX, comm_, &request);
      if (rc == MPI_SUCCESS) rc = Await(&request);
      if (rc != MPI_SUCCESS) {
        FailAll(pending, n, tensorflow::errors::Internal("hpcrep: MPI_Allreduce failed (", rc, ")"));
        continue;
      }
      bool all_joined = control[2] == -1;
      bool some_joined = control[1] == 1;
      if (all_joined) {
        std::lock_guard<std::mutex> lock(mu_);
        joined_ = false;
        continue;
      }
      int64_t agreed = -control[0];
      std::vector<std::shared_ptr<Request>> batch(pending.begin(),
                                                   pending.begin() + (joined ? 0 : agreed));
      // Signatures: the cumulative hash over the agreed prefix must be the same everywhere.
      bool mismatch = check_ && control[3 + 2 * (agreed - 1)] != -control[4 + 2 * (agreed - 1)];
      // The rank that describes the batch to waiting ranks: the lowest active one.
      std::vector<int64_t> layout;  // per request: dtype, kind, length, postscale bits
      if (some_joined) {
        if (!ShareLayout(batch, agreed, joined, &layout)) continue;
      }
      if (!joined) {
        std::lock_guard<std::mutex> lock(mu_);
        queue_.erase(queue_.begin(), queue_.begin() + agreed);
        queued_.fetch_sub(agreed);
      }
      if (mismatch) {
        Status s = MismatchStatus(batch, agreed);
        for (auto& r : batch) r->Finish(s);
        SetBusy(0, "");
        continue;
      }
      if (some_joined) {
        if (!JoinableOrFail(batch, layout, agreed)) {
          // Every rank fails this batch; waiting ranks leave join mode (their join() goes on
          // waiting in Python), so that the job can carry on.
          std::lock_guard<std::mutex> lock(mu_);
          joined_ = false;
          SetBusy(0, "");
          continue;
        }
        if (joined) {
          batch = ZeroRequests(layout, agreed);
        }
      }
      Reduce(batch);
      SetBusy(0, "");
    }
  }

  // Requests come in bursts (a step's buckets, its small collectives): after a cycle, look for
  // more for a short while before sleeping, since waking a sleeping thread costs tens of
  // microseconds here, more than a small allreduce. Yields while it looks.
  void SpinForWork() {
    auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_micros.load());
    while (queued_.load() == 0 && std::chrono::steady_clock::now() < until) {
      std::this_thread::yield();
    }
  }

  void FailAll(const std::vector<std::shared_ptr<Request>>& pending, int64_t n, Status s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.erase(queue_.begin(), queue_.begin() + n);
      queued_.fetch_sub(n);
    }
    for (auto& r : pending) r->Finish(s);
  }

  // With ranks waiting in join(), the lowest active rank broadcasts each request's dtype, kind,
  // length and post-scale so that waiting ranks can take part with zeros.
  bool ShareLayout(const std::vector<std::shared_ptr<Request>>& batch, int64_t agreed,
                   bool joined, std::vector<int64_t>* layout) {
    int me;
    MPI_Comm_rank(comm_, &me);
    int64_t candidate = joined ? std::numeric_limits<int64_t>::max() : me;
    int64_t root = 0;
    MPI_Allreduce(&candidate, &root, 1, MPI_INT64_T, MPI_MIN, comm_);
    layout->assign(4 * agreed, 0);
    if (!joined && root == me) {
      for (int64_t i = 0; i < agreed; ++i) {
        (*layout)[4 * i] = batch[i]->dtype;
        (*layout)[4 * i + 1] = batch[i]->kind;
        (*layout)[4 * i + 2] = batch[i]->length;
        std::memcpy(&(*layout)[4 * i + 3], &batch[i]->postscale, sizeof(double));
      }
    }
    MPI_Bcast(layout->data(), static_cast<int>(layout->size()), MPI_INT64_T,
              static_cast<int>(root), comm_);
    return true;
  }

  bool JoinableOrFail(const std::vector<std::shared_ptr<Request>>& batch,
                      const std::vector<int64_t>& layout, int64_t agreed) {
    for (int64_t i = 0; i < agreed; ++i) {
      int kind = static_cast<int>(layout[4 * i + 1]);
      if (kind != kSum && kind != kAverage) {
        Status s = tensorflow::errors::FailedPrecondition(
            kJoinError,
            "an allreduce with a reduction other than Sum or Average ran while a rank waits in "
            "join(); only Sum and Average allreduces (and allgathers) can run without every rank. "
            "Reduce with Sum or Average, or call join() after the last such collective.");
        for (auto& r : batch) r->Finish(s);
        return false;
      }
    }
    return true;
  }

  std::vector<std::shared_ptr<Request>> ZeroRequests(const std::vector<int64_t>& layout,
                                                      int64_t agreed) {
    std::vector<std::shared_ptr<Request>> out;
    for (int64_t i = 0; i < agreed; ++i) {
      auto r = std::make_shared<Request>();
      r->dtype = static_cast<DataType>(layout[4 * i]);
      r->kind = static_cast<int>(layout[4 * i + 1]);
      r->length = layout[4 * i + 2];
      std::memcpy(&r->postscale, &layout[4 * i + 3], sizeof(double));
      r->buffer = Tensor(r->dtype, TensorShape({r->length}));
      std::memset(r->buffer.data(), 0, r->buffer.TotalBytes());
      out.push_back(r);
    }
    return out;
  }

  Status MismatchStatus(const std::vector<std::shared_ptr<Request>>& batch, int64_t agreed) {
    std::string mine;
    for (int64_t i = 0; i < agreed && i < static_cast<int64_t>(batch.size()); ++i) {
      if (i) mine += "; then ";
      mine += batch[i]->description;
    }
    int len = static_cast<int>(mine.size());
    std::vector<int> lens(size_), displs(size_);
    MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm_);
    int total = 0;
    for (int r = 0; r < size_; ++r) {
      displs[r] = total;
      total += lens[r];
    }
    std::string all(total, '\0');
    MPI_Allgatherv(mine.data(), len, MPI_CHAR, &all[0], lens.data(), displs.data(), MPI_CHAR,
                   comm_);
    std::string message = "ranks disagree on the allreduce they run at this point: ";
    for (int r = 0; r < size_; ++r) {
      if (lens[r] == 0) continue;
      message += "rank " + std::to_string(r) + " passed " + all.substr(displs[r], lens[r]);
      message += r + 1 < size_ ? "; " : ". ";
    }
    message += "Every rank must call the same collectives in the same order, with tensors of the "
               "same dtype and shape.";
    return tensorflow::errors::FailedPrecondition(kMismatch, message);
  }

  // Reduce the agreed requests: consecutive ones of one dtype and reduction are fused into one
  // MPI_Allreduce up to the fusion threshold; a request bigger than that is reduced in place.
  void Reduce(const std::vector<std::shared_ptr<Request>>& batch) {
    cycles_.fetch_add(1);  // counted before any request finishes, so waiters see them
    reduced_.fetch_add(static_cast<int64_t>(batch.size()));
    size_t i = 0;
    while (i < batch.size()) {
      size_t j = i + 1;
      int64_t bytes = batch[i]->buffer.TotalBytes();
      while (j < batch.size() && batch[j]->dtype == batch[i]->dtype &&
             batch[j]->kind == batch[i]->kind &&
             bytes + static_cast<int64_t>(batch[j]->buffer.TotalBytes()) <= fusion_bytes_) {
        bytes += batch[j]->buffer.TotalBytes();
        ++j;
      }
      Status s = ReduceGroup(batch, i, j);
      for (size_t k = i; k < j; ++k) {
        if (s.ok()) Finalize(batch[k].get());
        batch[k]->Finish(s);
      }
      i = j;
    }
  }

  Status ReduceGroup(const std::vector<std::shared_ptr<Request>>& batch, size_t i, size_t j) {
    const Request& first = *batch[i];
    const TypeInfo& info = Info(first.dtype);
    MPI_Op op = MpiOp(first.dtype, first.kind);
    if (size_ == 1) return Status();
    if (j == i + 1) {
      int rc = AllreduceLarge(first.buffer.data(), first.length, info, op, first.chunk_bytes);
      return rc == MPI_SUCCESS ? Status() : tensorflow::errors::Internal("hpcrep: MPI error ", rc);
    }
    int64_t total = 0;
    for (size_t k = i; k < j; ++k) total += batch[k]->length;
    if (static_cast<int64_t>(scratch_.size()) < total * info.itemsize)
      scratch_.resize(total * info.itemsize);
    char* p = scratch_.data();
    for (size_t k = i; k < j; ++k) {
      std::memcpy(p, batch[k]->buffer.data(), batch[k]->buffer.TotalBytes());
      p += batch[k]->buffer.TotalBytes();
    }
    int rc = AllreduceLarge(scratch_.data(), total, info, op, first.chunk_bytes);
    p = scratch_.data();
    for (size_t k = i; k < j; ++k) {
      std::memcpy(batch[k]->buffer.data(), p, batch[k]->buffer.TotalBytes());
      p += batch[k]->buffer.TotalBytes();
    }
    return rc == MPI_SUCCESS ? Status() : tensorflow::errors::Internal("hpcrep: MPI error ", rc);
  }

  // Reduce in consecutive pieces of at most chunk_bytes (0: no limit), cut as the Python path
  // cuts them (hpcrep.comm.collectives.chunks), so both give the same bits; and at most 2^30
  // elements, since MPI counts are ints.
  int AllreduceLarge(void* data, int64_t count, const TypeInfo& info, MPI_Op op,
                     int64_t chunk_bytes) {
    int64_t kPiece = std::numeric_limits<int>::max() / 2;
    if (chunk_bytes > 0)
      kPiece = std::min(kPiece, std::max<int64_t>(1, chunk_bytes / info.itemsize));
    char* p = static_cast<char*>(data);
    for (int64_t done = 0; done < count; done += kPiece) {
      int n = static_cast<int>(std::min(kPiece, count - done));
      // Within one node, the blocking MPI_Allreduce: through shared memory it reduced ResNet-50's
      // 102 MB in 11 ms where MPI_Iallreduce took 32 (2 ranks here). Across nodes, where the
      // network sets the pace, MPI_Iallreduce polled by Await: a blocking call spins a core
      // for as long as the bytes travel, a core the backward pass needs (ResNet-50 across the
      // test cluster's 2 Gb/s link: 0.68 of the unsynchronised step against 0.61). Both paths
      // take the choice from hpcrep.comm.collectives.nonblocking, so both give the same bits.
      void* piece = p + done * info.itemsize;
      int rc;
      if (polled_) {
        MPI_Request request;
        rc = MPI_Iallreduce(MPI_IN_PLACE, piece, n, info.mpi, op, comm_, &request);
        if (rc == MPI_SUCCESS) rc = Await(&request);
      } else {
        rc = MPI_Allreduce(MPI_IN_PLACE, piece, n, info.mpi, op, comm_);
      }
      if (rc != MPI_SUCCESS) return rc;
    }
    return MPI_SUCCESS;
  }

  // Wait for the cycle's agreement without burning a core while other ranks are still
  // computing: poll (which also drives MPI's progress) a few times, then sleep between polls,
  // longer the longer it takes (at most 200 us). A blocking MPI call spins at full speed for as
  // long as it waits, taking the core from the backward pass it is meant to overlap with, and
  // from other ranks on an oversubscribed node.
  static int Await(MPI_Request* request) {
    auto start = std::chrono::steady_clock::now();
    for (int polls = 0;; ++polls) {
      int done = 0;
      int rc = MPI_Test(request, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS || done) return rc;
      if (polls < 64) continue;
      auto waited = std::chrono::steady_clock::now() - start;
      auto pause = std::min<std::chrono::steady_clock::duration>(
          waited / 16, std::chrono::microseconds(200));
      std::this_thread::sleep_for(std::max<std::chrono::steady_clock::duration>(
          pause, std::chrono::microseconds(5)));
    }
  }

  // After the sum: integer Average is a floor division; then the post-scale.
  void Finalize(Request* r) {
    HPCREP_DISPATCH(r->dtype, {
      T* data = r->buffer.flat<T>().data();
      if (r->kind == kAverage && !IsFloating<T>()) {
        if constexpr (std::is_integral<T>::value) FloorDivide<T>(data, r->length, size_);
      }
      if (r->postscale != 1.0) ScaleCopy<T>(data, data, r->length, r->postscale);
    });
  }

  MPI_Comm comm_;
  int size_ = 1;
  bool check_;
  int64_t fusion_bytes_;
  bool polled_;  // the communicator spans nodes: MPI_Iallreduce, polled (see AllreduceLarge)
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Request>> queue_;
  std::atomic<int64_t> queued_{0};  // queue_.size(), readable without the lock
  bool stop_ = false;
  bool joined_ = false;
  std::vector<char> scratch_;
  std::atomic<int64_t> cycles_{0}, reduced_{0};
  std::mutex busy_mu_;
  double busy_since_ = 0;
  std::string busy_what_;
};

// ---------------------------------------------------------------------------------------------
// Registries: engines by id (registered from Python), requests by handle.

std::mutex registry_mu;
std::map<int64_t, std::unique_ptr<Engine>> engines;
std::unordered_map<int64_t, std::shared_ptr<Request>> requests;
int64_t next_engine = 1;
std::atomic<int64_t> next_handle{1};

Engine* FindEngine(int64_t id) {
  std::lock_guard<std::mutex> lock(registry_mu);
  auto it = engines.find(id);
  return it == engines.end() ? nullptr : it->second.get();
}

// ---------------------------------------------------------------------------------------------
// Kernels.

class EnqueueOp : public OpKernel {
 public:
  explicit EnqueueOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("T", &dtype_));
    OP_REQUIRES_OK(c, c->GetAttr("engine", &engine_));
    OP_REQUIRES_OK(c, c->GetAttr("reduce_op", &kind_));
    OP_REQUIRES_OK(c, c->GetAttr("prescale_bits", &pre_bits_));
    OP_REQUIRES_OK(c, c->GetAttr("postscale_bits", &post_bits_));
    OP_REQUIRES_OK(c, c->GetAttr("signature", &signature_));
    OP_REQUIRES_OK(c, c->GetAttr("description", &description_));
    OP_REQUIRES_OK(c, c->GetAttr("chunk_bytes", &chunk_bytes_));
  }

  // Cheap (a copy into the request's buffer): the executor runs it inline, in the thread that
  // produced its last input, instead of queueing it on the inter-op pool, so a bucket is handed
  // to the communication thread as soon as its gradients exist.
  bool IsExpensive() override { return false; }

  void Compute(OpKernelContext* ctx) override {
    Engine* engine = FindEngine(engine_);
    OP_REQUIRES(ctx, engine != nullptr,
                tensorflow::errors::FailedPrecondition(
                    "hpcrep: this allreduce belongs to a communicator that has been freed "
                    "(hpcrep shut down, or its process set was removed); trace the function "
                    "again after hpcrep.init()"));
    const TypeInfo& info = Info(dtype_);
    auto request = std::make_shared<Request>();
    request->dtype = dtype_;
    request->kind = kind_;
    std::memcpy(&request->postscale, &post_bits_, sizeof(double));
    double pre;
    std::memcpy(&pre, &pre_bits_, sizeof(double));
    if (kind_ == kAverage && info.floating) pre *= 1.0 / engine->size();
    int64_t length = 0;
    for (int i = 0; i < ctx->num_inputs(); ++i)
      length += Padded(ctx->input(i).NumElements(), info.itemsize);
    request->length = length;
    // Describe the request by its inputs' shapes as well as the traced signature, so that two
    // ranks whose dynamic shapes differ do not pass the check. Every dimension counts, not
    // only the element count: [2, 3] against [3, 2] is a mismatch.
    uint64_t sig = static_cast<uint64_t>(signature_);
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      const TensorShape& shape = ctx->input(i).shape();
      sig = (sig * 1000003ull) ^ static_cast<uint64_t>(shape.dims());
      for (int d = 0; d < shape.dims(); ++d)
        sig = (sig * 1000003ull) ^ static_cast<uint64_t>(shape.dim_size(d));
    }
    request->signature = static_cast<int64_t>(sig);
    request->description = description_;
    request->chunk_bytes = chunk_bytes_;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(dtype_, TensorShape({length}), &request->buffer));
    char* base = static_cast<char*>(request->buffer.data());
    int64_t offset = 0;
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      const Tensor& t = ctx->input(i);
      int64_t n = t.NumElements();
      HPCREP_DISPATCH(dtype_, {
        ScaleCopy<T>(t.flat<T>().data(), reinterpret_cast<T*>(base) + offset, n, pre);
      });
      int64_t padded = Padded(n, info.itemsize);
      if (padded > n)
        std::memset(base + (offset + n) * info.itemsize, 0, (padded - n) * info.itemsize);
      offset += padded;
    }
    int64_t handle = next_handle.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(registry_mu);
      requests[handle] = request;
    }
    engine->Enqueue(request);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = handle;
  }

 private:
  DataType dtype_;
  int64_t engine_;
  int kind_;
  int64_t pre_bits_, post_bits_, signature_;
  std::string description_;
  int64_t chunk_bytes_ = 0;
};

class WaitOp : public AsyncOpKernel {
 public:
  explicit WaitOp(OpKernelConstruction* c) : AsyncOpKernel(c) {}

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    int64_t handle = ctx->input(0).scalar<int64_t>()();
    std::shared_ptr<Request> request;
    {
      std::lock_guard<std::mutex> lock(registry_mu);
      auto it = requests.find(handle);
      if (it != requests.end()) {
        request = it->second;
        requests.erase(it);
      }
    }
    OP_REQUIRES_ASYNC(ctx, request != nullptr,
                      tensorflow::errors::Internal("hpcrep: unknown allreduce handle ", handle),
                      done);
    auto finish = [ctx, request, done]() {
      if (!request->status.ok()) {
        ctx->SetStatus(request->status);
      } else {
        ctx->set_output(0, request->buffer);
      }
      done();
    };
    // A small allreduce is often done within microseconds: finishing here, on this thread,
    // spares TensorFlow a wake-up from the communication thread.
    auto until = std::chrono::steady_clock::now() +
                 std::chrono::microseconds(hpcrep::spin_micros.load() / 2);
    while (!request->finished.load() && std::chrono::steady_clock::now() < until) {
      std::this_thread::yield();
    }
    {
      std::unique_lock<std::mutex> lock(request->mu);
      if (!request->finished.load()) {
        request->on_finish = finish;
        return;
      }
    }
    finish();
  }
};

}  // namespace hpcrep

// ---------------------------------------------------------------------------------------------
// Registration.

REGISTER_OP("HpcrepAllreduceEnqueue")
    .Input("tensors: N * T")
    .Output("handle: int64")
    .Attr("T: {float, double, int32, int64, half, bfloat16}")
    .Attr("N: int >= 1")
    .Attr("engine: int")
    .Attr("reduce_op: int")
    .Attr("prescale_bits: int")
    .Attr("postscale_bits: int")
    .Attr("signature: int")
    .Attr("description: string")
    .Attr("chunk_bytes: int = 0")  // HPCREP_ALLREDUCE_CHUNK when the function traced
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape);

REGISTER_OP("HpcrepAllreduceWait")
    .Input("handle: int64")
    .Output("buffer: T")
    .Attr("T: {float, double, int32, int64, half, bfloat16}")
    .Attr("length: int = -1")  // the buffer's length when known at trace time, else -1
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      int64_t length;
      TF_RETURN_IF_ERROR(c->GetAttr("length", &length));
      c->set_output(0, c->Vector(length >= 0 ? c->MakeDim(length) : c->UnknownDim()));
      return absl::OkStatus();
    });

REGISTER_KERNEL_BUILDER(Name("HpcrepAllreduceEnqueue").Device(tensorflow::DEVICE_CPU),
                        hpcrep::EnqueueOp);
REGISTER_KERNEL_BUILDER(Name("HpcrepAllreduceWait").Device(tensorflow::DEVICE_CPU),
                        hpcrep::WaitOp);

// ---------------------------------------------------------------------------------------------
// C interface for the Python side (ctypes).

extern "C" {

// Register a communicator (an MPI_Comm handle from mpi4py, already duplicated for this use);
// starts its communication thread. Returns the engine id for the ops' "engine" attribute.
int64_t hpcrep_native_register(int64_t comm_handle, int check, int64_t fusion_bytes,
                               int spin_micros, int polled) {
  hpcrep::spin_micros.store(spin_micros);
  MPI_Comm comm;
  static_assert(sizeof(MPI_Comm) <= sizeof(int64_t), "MPI_Comm must fit in 64 bits");
  std::memset(&comm, 0, sizeof(comm));
  std::memcpy(&comm, &comm_handle, sizeof(MPI_Comm));
  hpcrep::Info(tensorflow::DT_FLOAT);  // create the half-precision MPI ops now, on this thread
  std::lock_guard<std::mutex> lock(hpcrep::registry_mu);
  int64_t id = hpcrep::next_engine++;
  hpcrep::engines[id] =
      std::make_unique<hpcrep::Engine>(comm, check != 0, fusion_bytes, polled != 0);
  return id;
}

// Stop the engine's thread (after it has finished what is queued) and forget it.
void hpcrep_native_unregister(int64_t id) {
  std::unique_ptr<hpcrep::Engine> engine;
  {
    std::lock_guard<std::mutex> lock(hpcrep::registry_mu);
    auto it = hpcrep::engines.find(id);
    if (it == hpcrep::engines.end()) return;
    engine = std::move(it->second);
    hpcrep::engines.erase(it);
  }
  engine->Stop();
}

void hpcrep_native_begin_join(int64_t id) {
  if (hpcrep::Engine* e = hpcrep::FindEngine(id)) e->BeginJoin();
}

int hpcrep_native_join_pending(int64_t id) {
  hpcrep::Engine* e = hpcrep::FindEngine(id);
  return e != nullptr && e->JoinPending() ? 1 : 0;
}

// Cycles and requests reduced by engine id so far (for tests and benchmarks).
void hpcrep_native_stats(int64_t id, int64_t* cycles, int64_t* reduced) {
  *cycles = *reduced = 0;
  if (hpcrep::Engine* e = hpcrep::FindEngine(id)) e->Stats(cycles, reduced);
}

// The longest current wait of any engine: its start (steady clock seconds, as Python's
// time.monotonic) or 0, and what it waits for (copied into what, at most size bytes).
double hpcrep_native_busy(char* what, int64_t size) {
  std::lock_guard<std::mutex> lock(hpcrep::registry_mu);
  double oldest = 0;
  for (auto& kv : hpcrep::engines) {
    std::string text;
    double since = kv.second->Busy(&text);
    if (since > 0 && (oldest == 0 || since < oldest)) {
      oldest = since;
      std::snprintf(what, size, "%s", text.c_str());
    }
  }
  return oldest;
}

}  // extern "C"

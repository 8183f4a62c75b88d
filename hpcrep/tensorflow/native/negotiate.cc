// A cycle's negotiation: what every rank has ready, whether it agrees, who waits in join(); and
// what ranks waiting in join() need to take part (see engine.h). Every MPI call here is
// nonblocking and polled (Engine::Await), so a thread waiting for other ranks leaves its core to
// the computation it overlaps with, in join mode too.

#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>

#include "engine.h"
#include "tensorflow/core/platform/errors.h"

namespace hpcrep {
namespace {

constexpr int64_t kNone = std::numeric_limits<int64_t>::min();  // neutral for MAX

// The control vector every rank contributes to the cycle's MPI_Iallreduce (MAX):
// [max(-count), max(joined), max(-joined), max(H_1), max(-H_1), ... max(H_k), max(-H_k)], where
// H_i is the cumulative hash of the signatures and names of the first i requests. A MAX of x and of -x
// gives the largest and (negated) smallest value over ranks, so equal pairs mean agreement.
// Two more entries say who came last to the previous negotiation and how late (Stragglers).
std::vector<int64_t> Control(const Offer& offer) {
  std::vector<int64_t> control(3 + 2 * kMaxBatch + 2, kNone);
  int64_t n = static_cast<int64_t>(offer.pending.size());
  control[0] = offer.joined ? -std::numeric_limits<int64_t>::max() : -n;
  control[1] = offer.joined ? 1 : 0;
  control[2] = offer.joined ? -1 : 0;
  uint64_t h = 1469598103934665603ull;
  for (int64_t i = 0; i < n && !offer.joined; ++i) {
    h = (h ^ static_cast<uint64_t>(offer.pending[i]->signature)) * 1099511628211ull;
    h = (h ^ static_cast<uint64_t>(offer.pending[i]->name_key)) * 1099511628211ull;
    int64_t v = static_cast<int64_t>(h >> 2);
    control[3 + 2 * i] = v;
    control[4 + 2 * i] = -v;
  }
  return control;
}

// The encoding of hpcrep/comm/stragglers.py (encode/decode): the MAX of the first entry is the
// rank that waited least in the previous negotiation (it came last) with its wait, the MAX of
// the second the longest wait (how long the first waited for it), in microseconds.
constexpr int kWaitBits = 40, kRankBits = 20;
constexpr int64_t kWaitMax = (int64_t{1} << kWaitBits) - 1;

void PutWait(int64_t wait_ns, int rank, int64_t* least, int64_t* longest) {
  int64_t us = std::min(kWaitMax, std::max<int64_t>(0, wait_ns / 1000));
  *least = ((kWaitMax - us) << kRankBits) | rank;
  *longest = us;
}

}  // namespace

Agreement Engine::Negotiate(const Offer& offer) {
  std::vector<int64_t> control = Control(offer);
  const size_t straggler = control.size() - 2;
  if (!offer.joined && last_wait_ns_ >= 0) {
    PutWait(last_wait_ns_, rank_, &control[straggler], &control[straggler + 1]);
  }
  Agreement agreement;
  MPI_Request request;
  const int64_t started = NowNs();
  agreement.negotiate_start = TimelineOn() ? started : 0;
  agreement.rc = MPI_Iallreduce(MPI_IN_PLACE, control.data(), static_cast<int>(control.size()),
                                MPI_INT64_T, MPI_MAX, comm_, &request);
  if (agreement.rc == MPI_SUCCESS) agreement.rc = Await(&request);
  const int64_t ended = NowNs();
  agreement.negotiate_end = agreement.negotiate_start ? ended : 0;
  if (agreement.rc != MPI_SUCCESS) return agreement;
  if (!offer.joined) last_wait_ns_ = ended - started;
  if (control[straggler] != kNone && control[straggler + 1] != kNone) {
    int64_t last = control[straggler] & ((int64_t{1} << kRankBits) - 1);
    int64_t shortest = kWaitMax - (control[straggler] >> kRankBits);
    std::lock_guard<std::mutex> lock(straggler_mu_);
    if (stragglers_.size() >= kStragglerKept) stragglers_.pop_front();
    stragglers_.emplace_back(last, std::max<int64_t>(0, control[straggler + 1] - shortest));
  }
  agreement.all_joined = control[2] == -1;
  agreement.some_joined = control[1] == 1;
  if (agreement.all_joined) return agreement;
  // Some rank is active, and an active rank only starts a cycle with a request queued: ready >= 1.
  agreement.ready = -control[0];
  // Signatures: the cumulative hash over the agreed prefix must be the same everywhere.
  int64_t last = agreement.ready - 1;
  agreement.mismatch = settings_.check && control[3 + 2 * last] != -control[4 + 2 * last];
  return agreement;
}

// With ranks waiting in join(), the lowest active rank broadcasts each request's dtype, kind,
// length and post-scale so that waiting ranks can take part with zeros. Collective; returns the
// MPI error code.
int Engine::ShareLayout(const Batch& batch, int64_t count, bool joined,
                        std::vector<Layout>* layout) {
  int64_t candidate = joined ? std::numeric_limits<int64_t>::max() : rank_;
  int64_t root = 0;
  MPI_Request request;
  int rc = MPI_Iallreduce(&candidate, &root, 1, MPI_INT64_T, MPI_MIN, comm_, &request);
  if (rc == MPI_SUCCESS) rc = Await(&request);
  if (rc != MPI_SUCCESS) return rc;
  layout->assign(count, Layout{0, 0, 0, 0, 0, 0, 0});
  if (!joined && root == rank_) {
    for (int64_t i = 0; i < count; ++i) {
      Layout& l = (*layout)[i];
      l.dtype = batch[i]->dtype;
      l.kind = batch[i]->kind;
      l.length = batch[i]->length;
      std::memcpy(&l.postscale_bits, &batch[i]->postscale, sizeof(double));
      l.chunk_bytes = batch[i]->chunk_bytes;
      l.fusion_bytes = batch[i]->fusion_bytes;
      l.half_wire = batch[i]->half_wire ? 1 : 0;
    }
  }
  constexpr int kWords = sizeof(Layout) / sizeof(int64_t);
  static_assert(sizeof(Layout) == kWords * sizeof(int64_t), "Layout travels as int64 words");
  rc = MPI_Ibcast(layout->data(), static_cast<int>(kWords * count), MPI_INT64_T,
                  static_cast<int>(root), comm_, &request);
  if (rc == MPI_SUCCESS) rc = Await(&request);
  return rc;
}

// Only Sum and Average can run without every rank (waiting ranks contribute zeros).
tensorflow::Status Engine::JoinableStatus(const std::vector<Layout>& layout) {
  for (const Layout& l : layout) {
    if (l.kind != kSum && l.kind != kAverage) {
      return EngineError(
          ErrorKind::kJoin,
          "an allreduce with a reduction other than Sum or Average ran while a rank waits in "
          "join(); only Sum and Average allreduces (and allgathers) can run without every rank. "
          "Reduce with Sum or Average, or call join() after the last such collective.");
    }
  }
  return tensorflow::Status();
}

// What a rank waiting in join() reduces: zeros shaped as the active ranks' requests.
Batch Engine::ZeroRequests(const std::vector<Layout>& layout) {
  Batch out;
  for (const Layout& l : layout) {
    auto r = std::make_shared<Request>();
    r->dtype = static_cast<tensorflow::DataType>(l.dtype);
    r->kind = static_cast<int>(l.kind);
    r->length = l.length;
    std::memcpy(&r->postscale, &l.postscale_bits, sizeof(double));
    r->chunk_bytes = l.chunk_bytes;
    r->fusion_bytes = l.fusion_bytes;
    r->half_wire = l.half_wire != 0;
    r->buffer = tensorflow::Tensor(r->dtype, tensorflow::TensorShape({r->length}));
    std::memset(r->buffer.data(), 0, r->buffer.TotalBytes());
    out.push_back(r);
  }
  return out;
}

// Gather every rank's description of the cycle's requests into one message naming the ranks
// that disagree. Collective.
tensorflow::Status Engine::MismatchStatus(const Batch& batch, int64_t count,
                                          const std::string& lead) {
  std::string mine;
  for (int64_t i = 0; i < count && i < static_cast<int64_t>(batch.size()); ++i) {
    if (i) mine += "; then ";
    mine += batch[i]->description;
  }
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(size_), displs(size_);
  MPI_Request request;
  int rc = MPI_Iallgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm_, &request);
  if (rc == MPI_SUCCESS) rc = Await(&request);
  if (rc != MPI_SUCCESS)
    return EngineError(ErrorKind::kMpi, "hpcrep: MPI error " + std::to_string(rc) +
                                            " while describing a collective mismatch");
  int total = 0;
  for (int r = 0; r < size_; ++r) {
    displs[r] = total;
    total += lens[r];
  }
  std::string all(total, '\0');
  rc = MPI_Iallgatherv(mine.data(), len, MPI_CHAR, &all[0], lens.data(), displs.data(), MPI_CHAR,
                       comm_, &request);
  if (rc == MPI_SUCCESS) rc = Await(&request);
  if (rc != MPI_SUCCESS)
    return EngineError(ErrorKind::kMpi, "hpcrep: MPI error " + std::to_string(rc) +
                                            " while describing a collective mismatch");
  std::string message = lead;
  for (int r = 0; r < size_; ++r) {
    if (lens[r] == 0) continue;
    message += "rank " + std::to_string(r) + " passed " + all.substr(displs[r], lens[r]);
    message += r + 1 < size_ ? "; " : ". ";
  }
  message += "Every rank must call the same collectives in the same order, with tensors of the "
             "same dtype and shape.";
  return EngineError(ErrorKind::kMismatch, message);
}

int64_t Engine::TakeStragglers(int64_t* ranks, int64_t* late_us, int64_t max) {
  std::lock_guard<std::mutex> lock(straggler_mu_);
  int64_t n = 0;
  for (; n < max && !stragglers_.empty(); ++n) {
    ranks[n] = stragglers_.front().first;
    late_us[n] = stragglers_.front().second;
    stragglers_.pop_front();
  }
  return n;
}

}  // namespace hpcrep

// A cycle's execution, given what the ranks agreed (see engine.h): fail, leave join mode, report
// a mismatch, or reduce the agreed requests, fused.

#include <algorithm>
#include <cstring>
#include <limits>

#include "engine.h"

namespace hpcrep {
namespace {

tensorflow::Status MpiError(int rc) {
  return EngineError(ErrorKind::kMpi, "hpcrep: MPI error " + std::to_string(rc));
}

}  // namespace

void Engine::Execute(const Offer& offer, const Agreement& agreement) {
  int64_t mine = static_cast<int64_t>(offer.pending.size());
  if (!offer.joined) active_cycles_.fetch_add(1);
  if (agreement.rc != MPI_SUCCESS) {
    Dequeue(mine);
    for (auto& r : offer.pending) r->Finish(MpiError(agreement.rc));
    return;
  }
  if (agreement.all_joined) {
    LeaveJoin();
    return;
  }
  // The same requests in another order (or requests that differ): match them by name. Not
  // while a rank waits in join(): it has no names to offer.
  if (agreement.mismatch && !agreement.some_joined) {
    MatchByName(offer);
    return;
  }
  // A rank in join() has nothing queued; the others take the agreed prefix off their queues.
  int64_t count = offer.joined ? 0 : agreement.ready;
  Batch batch(offer.pending.begin(), offer.pending.begin() + count);
  Dequeue(count);
  if (agreement.mismatch) {
    tensorflow::Status s = MismatchStatus(batch, count);
    for (auto& r : batch) r->Finish(s);
    return;
  }
  if (agreement.some_joined) {
    std::vector<Layout> layout;
    int rc = ShareLayout(batch, agreement.ready, offer.joined, &layout);
    tensorflow::Status s = rc == MPI_SUCCESS ? JoinableStatus(layout) : MpiError(rc);
    if (!s.ok()) {
      // The active ranks fail this batch. Waiting ranks have no request in it and stay in join
      // mode: their join() goes on, and their thread must go on serving the active ranks' next
      // collectives with zeros (leaving join mode here hung the active ranks' next allreduce).
      for (auto& r : batch) r->Finish(s);
      return;
    }
    if (offer.joined) batch = ZeroRequests(layout);
  }
  if (agreement.negotiate_start != 0) {
    for (auto& r : batch) {
      r->stamps[kNegotiateStart] = agreement.negotiate_start;
      r->stamps[kNegotiateEnd] = agreement.negotiate_end;
      r->cycle = cycles_.load() + 1;
    }
  }
  Reduce(batch);
}

// Reduce the agreed requests: consecutive ones of one dtype and reduction are fused into one
// MPI_Allreduce up to the fusion threshold of the group's first request (each request carries
// the one it was traced with, or the tuned one: equal on every rank); a request bigger than
// that is reduced in place.
void Engine::Reduce(const Batch& batch) {
  cycles_.fetch_add(1);  // counted before any request finishes, so waiters see them
  reduced_.fetch_add(static_cast<int64_t>(batch.size()));
  size_t i = 0;
  while (i < batch.size()) {
    size_t j = i + 1;
    int64_t bytes = batch[i]->buffer.TotalBytes();
    while (j < batch.size() && batch[j]->dtype == batch[i]->dtype &&
           batch[j]->kind == batch[i]->kind && batch[j]->half_wire == batch[i]->half_wire &&
           bytes + static_cast<int64_t>(batch[j]->buffer.TotalBytes()) <=
               batch[i]->fusion_bytes) {
      bytes += batch[j]->buffer.TotalBytes();
      ++j;
    }
    tensorflow::Status s = ReduceGroup(batch, i, j);
    for (size_t k = i; k < j; ++k) {
      Request* r = batch[k].get();
      if (s.ok()) {
        Scaling(r->dtype, r->kind, size_, 1.0, r->postscale).After(r->buffer.data(), r->length);
      }
      if (r->stamps[kNegotiateStart] != 0) {
        r->stamps[kUnpackEnd] = r->stamps[kFinished] = NowNs();
        r->group = batch[i]->id;
        r->group_size = static_cast<int64_t>(j - i);
        r->group_bytes = bytes;
      }
      r->Finish(s);
    }
    i = j;
  }
}

tensorflow::Status Engine::ReduceGroup(const Batch& batch, size_t i, size_t j) {
  const Request& first = *batch[i];
  const TypeInfo& info = Info(first.dtype);
  MPI_Op op = MpiOp(first.dtype, first.kind);
  // While the timeline records: when the copy into the fusion buffer, MPI and the copy out
  // happen, for every request of the group.
  const bool stamped = first.stamps[kNegotiateStart] != 0;
  auto stamp = [&](int which) {
    if (!stamped) return;
    int64_t now = NowNs();
    for (size_t k = i; k < j; ++k) batch[k]->stamps[which] = now;
  };
  stamp(kFuseStart);
  if (size_ == 1) {
    stamp(kMpiStart);
    stamp(kMpiEnd);
    return tensorflow::Status();
  }
  if (first.half_wire && first.dtype == tensorflow::DT_FLOAT) {
    // The tuner's fp16 wire: pack the group as float16, sum in float16, unpack to float32 (as
    // Compression.fp16 does around the exchange, here inside it).
    int64_t total = 0;
    for (size_t k = i; k < j; ++k) total += batch[k]->length;
    if (static_cast<int64_t>(half_scratch_.size()) < total) half_scratch_.resize(total);
    int64_t at = 0;
    for (size_t k = i; k < j; ++k) {
      FloatToHalf(static_cast<const float*>(batch[k]->buffer.data()), half_scratch_.data() + at,
                  batch[k]->length);
      at += batch[k]->length;
    }
    stamp(kMpiStart);
    const tensorflow::DataType half = tensorflow::DT_HALF;
    int rc = AllreduceLarge(half_scratch_.data(), total, Info(half), MpiOp(half, first.kind),
                            first.chunk_bytes);
    stamp(kMpiEnd);
    at = 0;
    for (size_t k = i; k < j; ++k) {
      HalfToFloat(half_scratch_.data() + at, static_cast<float*>(batch[k]->buffer.data()),
                  batch[k]->length);
      at += batch[k]->length;
    }
    return rc == MPI_SUCCESS ? tensorflow::Status() : MpiError(rc);
  }
  if (j == i + 1) {
    stamp(kMpiStart);
    int rc = AllreduceLarge(first.buffer.data(), first.length, info, op, first.chunk_bytes);
    stamp(kMpiEnd);
    return rc == MPI_SUCCESS ? tensorflow::Status() : MpiError(rc);
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
  stamp(kMpiStart);
  int rc = AllreduceLarge(scratch_.data(), total, info, op, first.chunk_bytes);
  stamp(kMpiEnd);
  p = scratch_.data();
  for (size_t k = i; k < j; ++k) {
    std::memcpy(batch[k]->buffer.data(), p, batch[k]->buffer.TotalBytes());
    p += batch[k]->buffer.TotalBytes();
  }
  return rc == MPI_SUCCESS ? tensorflow::Status() : MpiError(rc);
}

// Reduce in consecutive pieces of at most chunk_bytes (0: no limit), cut as the Python path
// cuts them (hpcrep.comm.collectives.chunks), so both give the same bits; and at most 2^30
// elements, since MPI counts are ints.
int Engine::AllreduceLarge(void* data, int64_t count, const TypeInfo& info, MPI_Op op,
                           int64_t chunk_bytes) {
  int64_t piece_items = std::numeric_limits<int>::max() / 2;
  if (chunk_bytes > 0)
    piece_items = std::min(piece_items, std::max<int64_t>(1, chunk_bytes / info.itemsize));
  char* p = static_cast<char*>(data);
  for (int64_t done = 0; done < count; done += piece_items) {
    int n = static_cast<int>(std::min(piece_items, count - done));
    // Within one node, the blocking MPI_Allreduce: through shared memory it reduced ResNet-50's
    // 102 MB in 11 ms where MPI_Iallreduce took 32 (2 ranks here). Across nodes, where the
    // network sets the pace, MPI_Iallreduce polled by Await: a blocking call spins a core
    // for as long as the bytes travel, a core the backward pass needs (ResNet-50 across the
    // test cluster's 2 Gb/s link: 0.68 of the unsynchronised step against 0.61). Both paths
    // take the choice from hpcrep.comm.collectives.nonblocking, so both give the same bits.
    void* piece = p + done * info.itemsize;
    int rc;
    if (settings_.polled) {
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

}  // namespace hpcrep

// Matching by name, for a cycle whose order-based agreement failed (see engine.h).
//
// In a TF1 graph the executor runs independent ops in any order, so ranks may queue the same
// requests in different orders. When the hashes of the common prefix differ, every rank shares
// its pending requests' (name, signature) pairs (one MPI_Iallgather of fixed-size records), and
// every rank computes the same plan from the same data: in the lowest rank's queue order, each
// name pending on every rank runs if its signatures agree and fails with a mismatch on every
// rank if they do not; names not yet pending everywhere stay queued for a later cycle. The k-th
// request of one name on a rank meets the k-th of that name elsewhere.
//
// If nothing runs and the pending names do not change for HPCREP_MATCH_TIMEOUT seconds (on any
// rank's clock, shared in the records), every pending request fails with a mismatch on every
// rank: the names never meet (a rank called other collectives), and a hang would be worse.

#include <chrono>
#include <thread>

#include "engine.h"

namespace hpcrep {
namespace {

constexpr int kHeader = 2;                      // pending count, "my stall timer ran out"
constexpr int kRecord = kHeader + 2 * kMaxBatch;  // then (key, signature) per request

uint64_t Mix(uint64_t h, uint64_t v) { return (h ^ v) * 1099511628211ull; }

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The key of pending[i]: its name and how many earlier requests of that name precede it.
int64_t Key(const Batch& pending, size_t i) {
  uint64_t occurrence = 0;
  for (size_t j = 0; j < i; ++j) occurrence += pending[j]->name_key == pending[i]->name_key;
  return static_cast<int64_t>(Mix(Mix(1469598103934665603ull,
                                      static_cast<uint64_t>(pending[i]->name_key)),
                                  occurrence));
}

}  // namespace

void Engine::MatchByName(const Offer& offer) {
  const Batch& pending = offer.pending;
  const int64_t n = static_cast<int64_t>(pending.size());
  std::vector<int64_t> mine(kRecord, 0), all(static_cast<size_t>(kRecord) * size_);
  mine[0] = n;
  mine[1] = stalled_ && Now() - stall_since_ > settings_.match_timeout;
  for (int64_t i = 0; i < n; ++i) {
    mine[kHeader + 2 * i] = Key(pending, i);
    mine[kHeader + 2 * i + 1] = pending[i]->signature;
  }
  MPI_Request request;
  int rc = MPI_Iallgather(mine.data(), kRecord, MPI_INT64_T, all.data(), kRecord, MPI_INT64_T,
                          comm_, &request);
  if (rc == MPI_SUCCESS) rc = Await(&request);
  if (rc != MPI_SUCCESS) {
    Remove(pending);
    for (auto& r : pending)
      r->Finish(EngineError(ErrorKind::kMpi, "hpcrep: MPI error " + std::to_string(rc) +
                                                 " while matching requests by name"));
    return;
  }
  auto record = [&](int r) { return all.data() + static_cast<size_t>(r) * kRecord; };
  // The plan, the same on every rank: rank 0's order (every rank is active here).
  Batch run, failed;
  bool expired = false;
  uint64_t everything = 1469598103934665603ull;
  for (int r = 0; r < size_; ++r) {
    expired = expired || record(r)[1] != 0;
    for (int64_t i = 0; i < record(r)[0]; ++i)
      everything = Mix(everything, static_cast<uint64_t>(record(r)[kHeader + 2 * i]));
  }
  for (int64_t i = 0; i < record(0)[0]; ++i) {
    const int64_t key = record(0)[kHeader + 2 * i];
    const int64_t signature = record(0)[kHeader + 2 * i + 1];
    bool everywhere = true, agree = true;
    int64_t at = -1;
    for (int r = 0; r < size_ && everywhere; ++r) {
      const int64_t* rec = record(r);
      int64_t found = -1;
      for (int64_t j = 0; j < rec[0] && found < 0; ++j)
        if (rec[kHeader + 2 * j] == key) found = j;
      everywhere = found >= 0;
      if (everywhere) agree = agree && rec[kHeader + 2 * found + 1] == signature;
      if (r == rank_) at = found;
    }
    if (everywhere) (agree ? run : failed).push_back(pending[at]);
  }
  if (!run.empty() || !failed.empty()) {
    stalled_ = false;
    Remove(run);
    Remove(failed);
    if (!failed.empty()) {
      tensorflow::Status s = MismatchStatus(
          failed, static_cast<int64_t>(failed.size()),
          "ranks disagree on allreduces of the same name: ");
      for (auto& r : failed) r->Finish(s);
    }
    if (!run.empty()) Reduce(run);
    return;
  }
  if (stalled_ && everything == stall_hash_ && expired) {
    stalled_ = false;
    Remove(pending);
    tensorflow::Status s = MismatchStatus(
        pending, n,
        "ranks disagree: they have allreduces pending whose names never met (no name pending "
        "on every rank and no new request for HPCREP_MATCH_TIMEOUT seconds): ");
    for (auto& r : pending) r->Finish(s);
    return;
  }
  if (!stalled_ || everything != stall_hash_) {
    stalled_ = true;
    stall_hash_ = everything;
    stall_since_ = Now();
  }
  // Nothing to run until another request arrives: do not spin the next cycle at once.
  std::this_thread::sleep_for(std::chrono::microseconds(500));
}

// Take these requests off the queue, wherever they sit in it.
void Engine::Remove(const Batch& done) {
  if (done.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& r : done) {
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {
      if (*it == r) {
        queue_.erase(it);
        queued_.fetch_sub(1);
        break;
      }
    }
  }
}

}  // namespace hpcrep

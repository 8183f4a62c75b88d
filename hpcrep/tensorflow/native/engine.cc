// The communication thread and its queue (see engine.h).

#include "engine.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>

#if defined(__linux__)
#include <sys/prctl.h>
#endif

namespace hpcrep {

void Request::Finish(tensorflow::Status s) {
  std::function<void()> callback;
  {
    std::lock_guard<std::mutex> lock(mu);
    status = s;
    finished = true;
    callback = std::move(on_finish);
  }
  if (callback) callback();
}

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

Engine::Engine(MPI_Comm comm, const EngineSettings& settings) : comm_(comm), settings_(settings) {
  MPI_Comm_size(comm_, &size_);
  MPI_Comm_rank(comm_, &rank_);
  tuned_fusion_.store(settings_.fusion_bytes);
  thread_ = std::thread([this] { Loop(); });
}

Engine::~Engine() { Stop(); }

void Engine::Enqueue(std::shared_ptr<Request> request) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(request));
    queued_.fetch_add(1);
  }
  cv_.notify_one();
}

void Engine::Stats(int64_t* cycles, int64_t* reduced) const {
  *cycles = cycles_.load();
  *reduced = reduced_.load();
}

void Engine::BeginJoin() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    joined_ = true;
  }
  cv_.notify_one();
}

bool Engine::JoinPending() {
  std::lock_guard<std::mutex> lock(mu_);
  return joined_;
}

double Engine::Busy(std::string* what) {
  std::lock_guard<std::mutex> lock(busy_mu_);
  if (busy_since_ == 0) return 0;
  *what = busy_what_;
  return busy_since_;
}

void Engine::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void Engine::SetBusy(double since, const std::string& what) {
  std::lock_guard<std::mutex> lock(busy_mu_);
  busy_since_ = since;
  busy_what_ = what;
}

// One cycle after another: take what is queued, agree on it with the other ranks, execute it.
void Engine::Loop() {
#if defined(__linux__)
  // Await's short sleeps (5 us and up) would otherwise last Linux's default timer slack, 50 us,
  // longer than a small allreduce: a rank that arrives first would oversleep its partner.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
#endif
  Offer offer;
  while (NextOffer(&offer)) {
    if (!offer.pending.empty()) SetBusy(Now(), offer.pending[0]->description);
    int64_t cycle_start = TimelineCycles() ? NowNs() : 0;
    Execute(offer, Negotiate(offer));
    if (cycle_start != 0) RecordCycle(cycle_start, static_cast<int64_t>(offer.pending.size()));
    SetBusy(0, "");
  }
}

// With mark_cycles, one record per cycle: from its start to the end of its work.
void Engine::RecordCycle(int64_t start, int64_t offered) {
  TimelineRecord record{};
  record.kind = kCycleRecord;
  record.request = cycles_.load();
  record.cycle = cycles_.load();
  record.group_size = offered;
  record.t[kNegotiateStart] = start;
  record.t[kFinished] = NowNs();
  std::snprintf(record.name, kNameBytes, "cycle");
  TimelineWrite(record);
}

void RecordRequest(const Request& r) {
  if (r.stamps[kOpStart] == 0) return;
  TimelineRecord record{};
  record.kind = kRequestRecord;
  record.engine = r.engine;
  record.request = r.id;
  record.group = r.group;
  record.cycle = r.cycle;
  record.group_size = r.group_size;
  record.bytes = static_cast<int64_t>(r.buffer.TotalBytes());
  record.group_bytes = r.group_bytes;
  std::memcpy(record.t, r.stamps, sizeof(record.t));
  std::snprintf(record.name, kNameBytes, "%s", r.description.c_str());
  TimelineWrite(record);
}

// Wait until this rank has something for a cycle: queued requests or a join(). Returns false
// when the engine stops (with nothing left queued).
bool Engine::NextOffer(Offer* offer) {
  SpinForWork();
  offer->pending.clear();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return stop_ || joined_ || !queue_.empty(); });
  if (stop_ && queue_.empty()) return false;
  offer->joined = joined_ && queue_.empty();
  for (size_t i = 0; i < queue_.size() && i < static_cast<size_t>(kMaxBatch); ++i)
    offer->pending.push_back(queue_[i]);
  return true;
}

// Requests come in bursts (a step's buckets, its small collectives): after a cycle, look for
// more for a short while before sleeping, since waking a sleeping thread costs tens of
// microseconds here, more than a small allreduce. Yields while it looks.
void Engine::SpinForWork() {
  auto until =
      std::chrono::steady_clock::now() + std::chrono::microseconds(settings_.spin_micros);
  while (queued_.load() == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::yield();
  }
}

// Take the first n requests off the queue (they are this cycle's).
void Engine::Dequeue(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_.erase(queue_.begin(), queue_.begin() + n);
  queued_.fetch_sub(n);
}

void Engine::LeaveJoin() {
  std::lock_guard<std::mutex> lock(mu_);
  joined_ = false;
}

// Wait for a nonblocking collective without burning a core while other ranks are still
// computing: poll (which also drives MPI's progress) a few times, then sleep between polls,
// longer the longer it takes (at most 200 us). A blocking MPI call spins at full speed for as
// long as it waits, taking the core from the backward pass it is meant to overlap with, and
// from other ranks on an oversubscribed node.
int Engine::Await(MPI_Request* request) {
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

tensorflow::Status EngineError(ErrorKind kind, const std::string& message) {
  tensorflow::Status status =
      kind == ErrorKind::kMpi ? tensorflow::errors::Internal(message)
                              : tensorflow::errors::FailedPrecondition(message);
  const std::string code = std::to_string(static_cast<int>(kind));
  status.SetPayload(kPayloadKey, absl::Cord(absl::string_view(code)));
  return status;
}

}  // namespace hpcrep

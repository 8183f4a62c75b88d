// One communication thread per communicator: it calls MPI in the same order on every rank and
// fuses what is queued.
//
// HpcrepAllreduceStart (ops.cc) queues a request; the thread works in cycles. A cycle starts
// when this rank has something queued (or waits in join()): one small MPI_Iallreduce (MAX) tells
// every rank how many requests all ranks have queued (the common prefix, up to kMaxBatch), whether
// the signatures of that prefix agree (cumulative hashes, as hpcrep.comm.check does for one call),
// and whether ranks wait in join() (Negotiate: the answer is an Agreement). The signature hashed
// includes each request's name, so two ranks that queued the same requests in different orders
// disagree there; the engine then matches requests by name (match.cc) for that cycle. The agreed
// prefix is
// then reduced (Execute), requests of one dtype and operation fused into one MPI_Allreduce up to
// the fusion threshold. The prefix length depends on timing, but it is the same on every rank,
// so results are bitwise equal across ranks.

#ifndef HPCREP_NATIVE_ENGINE_H_
#define HPCREP_NATIVE_ENGINE_H_

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "kernels.h"
#include "timeline.h"
#include "tensorflow/core/framework/tensor.h"

namespace hpcrep {

struct Request {
  tensorflow::DataType dtype;
  int kind = kSum;
  double postscale = 1.0;
  int64_t signature = 0;  // dtype, shapes, reduction, scaling: must agree between ranks
  int64_t name_key = 0;   // hash of the request's name (match_name or the op's node name)
  int64_t chunk_bytes = 0;  // largest single MPI_Allreduce (HPCREP_ALLREDUCE_CHUNK); 0: no limit
  int64_t fusion_bytes = 0;  // largest fusion buffer this request opens (HPCREP_FUSION_THRESHOLD)
  bool half_wire = false;    // float32 sent and summed as float16 (autotune, where allowed)
  std::string description;
  tensorflow::Tensor buffer;  // packed, pre-scaled; reduced in place
  int64_t length = 0;
  int spin_micros = 0;  // the engine's: how long the Wait kernel looks before it sleeps

  std::mutex mu;
  std::atomic<bool> finished{false};
  tensorflow::Status status;
  std::function<void()> on_finish;  // set by the Wait kernel if it arrives first

  // For the timeline (timeline.h), filled only while it records: when each phase happened, and
  // the fusion group and cycle the request was reduced in.
  int64_t stamps[kStamps] = {};
  int64_t id = 0, engine = 0, group = 0, cycle = 0, group_size = 0, group_bytes = 0;

  void Finish(tensorflow::Status s);
};

// Write the request's timeline record (when it was stamped from its start). Any thread.
void RecordRequest(const Request& request);

using Batch = std::vector<std::shared_ptr<Request>>;

// Settings of one engine, given at registration (from hpcrep.config, equal on every rank).
struct EngineSettings {
  bool check = true;          // HPCREP_CHECK_COLLECTIVES: compare signatures every cycle
  int64_t fusion_bytes = 0;   // HPCREP_FUSION_THRESHOLD
  int spin_micros = 100;      // HPCREP_NATIVE_SPIN_US: how long threads look before sleeping
  bool polled = false;        // the communicator spans nodes: MPI_Iallreduce, polled (see
                              // Engine::AllreduceLarge)
  double match_timeout = 30;  // HPCREP_MATCH_TIMEOUT: seconds pending names may fail to meet
};

// What this rank brings to a cycle.
struct Offer {
  Batch pending;        // the first requests of this rank's queue (at most kMaxBatch)
  bool joined = false;  // this rank waits in join() and has nothing queued
};

// What the ranks agreed on in a cycle's negotiation: the same value on every rank.
struct Agreement {
  int rc = MPI_SUCCESS;      // the negotiation's MPI error code; nothing else is valid if not 0
  bool all_joined = false;   // every rank waits in join(): join mode ends
  bool some_joined = false;  // some rank waits in join() and takes part with zeros
  int64_t ready = 0;         // requests queued on every active rank (the common prefix)
  bool mismatch = false;     // the signatures of that prefix differ between ranks
  int64_t negotiate_start = 0, negotiate_end = 0;  // steady-clock ns, while the timeline records
};

// Per request, what a rank waiting in join() needs to take part: shared by the lowest active rank.
// chunk_bytes, fusion_bytes and half_wire too: a waiting rank must fuse its zeros, convert them
// and cut them into the same MPI calls (Reduce, AllreduceLarge).
struct Layout {
  int64_t dtype, kind, length, postscale_bits, chunk_bytes, fusion_bytes, half_wire;
};

class Engine {
 public:
  Engine(MPI_Comm comm, const EngineSettings& settings);
  ~Engine();  // stops the thread (after what is queued has finished) and joins it
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  void Enqueue(std::shared_ptr<Request> request);
  int size() const { return size_; }
  const EngineSettings& settings() const { return settings_; }

  // Cycles that reduced something, and requests reduced, since the engine started.
  void Stats(int64_t* cycles, int64_t* reduced) const;

  // The fusion threshold and piece size of requests traced as tuned (autotune): a request
  // takes them when it is queued, so every rank must set them at the same point of its
  // program, before any of the requests they are meant for (hpcrep/tensorflow/autotune.py sets
  // them at a step's start, before the step's gradients are queued).
  // half_wire: float32 requests travel and are summed as float16 (where the user allowed the
  // tuner to compress).
  void Tune(int64_t fusion_bytes, int64_t chunk_bytes, bool half_wire) {
    tuned_fusion_.store(fusion_bytes);
    tuned_chunk_.store(chunk_bytes);
    tuned_half_.store(half_wire);
  }
  int64_t TunedFusion() const { return tuned_fusion_.load(); }
  int64_t TunedChunk() const { return tuned_chunk_.load(); }
  bool TunedHalf() const { return tuned_half_.load(); }

  // Called by the Python thread in join(): take part in every cycle with zeros until all ranks
  // have joined; JoinPending() turns false then.
  void BeginJoin();
  bool JoinPending();

  // Cycles in which this rank took part with requests of its own (not waiting in join()): the
  // same count on every rank until one joins, so the last ranks to join have the highest.
  int64_t ActiveCycles() const { return active_cycles_.load(); }

  // Seconds since the thread started waiting for other ranks with requests of its own (0 if
  // it is not), and what it waits for.
  double Busy(std::string* what);

  // Who came last to each negotiation, and how late (hpcrep/comm/stragglers.py's encoding, two
  // more entries in the negotiation's MAX): moves up to max of them, oldest first, into ranks
  // and late_us and returns how many; the ring keeps the last kStragglerKept.
  int64_t TakeStragglers(int64_t* ranks, int64_t* late_us, int64_t max);

 private:
  // engine.cc: the thread and its queue.
  void Loop();
  bool NextOffer(Offer* offer);  // false: stop
  void SpinForWork();
  void Dequeue(int64_t n);
  void LeaveJoin();
  void SetBusy(double since, const std::string& what);
  void Stop();
  void RecordCycle(int64_t start, int64_t offered);
  static int Await(MPI_Request* request);

  // negotiate.cc: what every rank has ready, and what ranks in join() need.
  Agreement Negotiate(const Offer& offer);
  int ShareLayout(const Batch& batch, int64_t count, bool joined, std::vector<Layout>* layout);
  tensorflow::Status MismatchStatus(const Batch& batch, int64_t count,
                                    const std::string& lead =
                                        "ranks disagree on the allreduce they run at this point: ");
  static tensorflow::Status JoinableStatus(const std::vector<Layout>& layout);
  static Batch ZeroRequests(const std::vector<Layout>& layout);

  // match.cc: when the prefix disagrees, run the requests whose names are pending everywhere.
  void MatchByName(const Offer& offer);
  void Remove(const Batch& done);

  // execute.cc: one cycle's work, given its agreement.
  void Execute(const Offer& offer, const Agreement& agreement);
  void Reduce(const Batch& batch);
  tensorflow::Status ReduceGroup(const Batch& batch, size_t i, size_t j);
  int AllreduceLarge(void* data, int64_t count, const TypeInfo& info, MPI_Op op,
                     int64_t chunk_bytes);

  MPI_Comm comm_;
  int size_ = 1;
  int rank_ = 0;
  const EngineSettings settings_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Request>> queue_;
  std::atomic<int64_t> queued_{0};  // queue_.size(), readable without the lock
  bool stop_ = false;
  bool joined_ = false;
  std::vector<char> scratch_;
  std::atomic<int64_t> cycles_{0}, reduced_{0}, active_cycles_{0};
  std::atomic<int64_t> tuned_fusion_{0}, tuned_chunk_{0};  // see Tune
  std::atomic<bool> tuned_half_{false};
  std::vector<Eigen::half> half_scratch_;  // the fp16 wire's buffer (ReduceGroup)
  bool stalled_ = false;      // the last name matching found nothing to run (match.cc)
  uint64_t stall_hash_ = 0;   // what every rank had pending then
  double stall_since_ = 0;    // since when the pending names have not changed
  std::mutex busy_mu_;
  double busy_since_ = 0;
  std::string busy_what_;
  int64_t last_wait_ns_ = -1;  // this rank's wait in its last negotiation with requests
  std::mutex straggler_mu_;
  std::deque<std::pair<int64_t, int64_t>> stragglers_;  // (last rank, late us) per negotiation
};

constexpr size_t kStragglerKept = 4096;

}  // namespace hpcrep

#endif  // HPCREP_NATIVE_ENGINE_H_

// The engine's event ring: a fixed-size, per-process ring of allreduce records with steady-clock
// timestamps, always present and read through the C API (c_api.cc), for the timeline
// (hpcrep/tensorflow/native/timeline.py) and later a flight recorder.
//
// Off (the default), nothing is stamped or written: every hook first reads one relaxed atomic.
// On, a request carries the time of each of its phases (Request::stamps) and one record is
// written when its result is handed back to TensorFlow (WaitOp), by whichever thread does that;
// a cycle record per engine cycle with mark_cycles. Writers claim a slot with one fetch_add and
// publish it with a sequence number (no lock); a reader copies a slot and keeps it only if its
// sequence number is the same before and after the copy, so a slot overwritten while being read
// is dropped, never torn. The ring holds kSlots records; a reader that falls behind by more
// loses the oldest (counted).

#ifndef HPCREP_NATIVE_TIMELINE_H_
#define HPCREP_NATIVE_TIMELINE_H_

#include <atomic>
#include <chrono>
#include <cstdint>

namespace hpcrep {

// When each phase of a request began or ended (steady-clock ns; 0: did not happen).
enum Stamp : int {
  kOpStart = 0,     // the Start kernel began packing the inputs (TensorFlow's thread)
  kEnqueued,        // queued on the engine
  kNegotiateStart,  // the cycle that ran it began agreeing with the other ranks
  kNegotiateEnd,
  kFuseStart,       // its group's copy into the fusion buffer began
  kMpiStart,
  kMpiEnd,
  kUnpackEnd,       // copied out of the fusion buffer and scaled
  kFinished,        // result ready (Request::Finish)
  kReturned,        // handed back to TensorFlow (the Wait kernel's done callback)
  kStamps,
};

enum RecordKind : int64_t { kRequestRecord = 1, kCycleRecord = 2 };

constexpr int kNameBytes = 112;

// One record: plain data, the layout hpcrep/tensorflow/native/timeline.py mirrors (checked by
// its size when the library loads).
struct TimelineRecord {
  int64_t kind;         // RecordKind
  int64_t engine;       // engine id
  int64_t request;      // request handle (kRequestRecord) or cycle number (kCycleRecord)
  int64_t group;        // handle of the first request of its fusion group
  int64_t cycle;        // the engine cycle that reduced it
  int64_t group_size;   // requests fused into one MPI buffer with it
  int64_t bytes;        // this request's buffer
  int64_t group_bytes;  // the whole fusion buffer
  int64_t t[kStamps];
  char name[kNameBytes];  // the request's description, cut to fit
};

constexpr int64_t kSlots = 1 << 14;

inline int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace timeline_state {
extern std::atomic<bool> on;
extern std::atomic<bool> mark_cycles;
}  // namespace timeline_state

inline bool TimelineOn() { return timeline_state::on.load(std::memory_order_relaxed); }
inline bool TimelineCycles() {
  return TimelineOn() && timeline_state::mark_cycles.load(std::memory_order_relaxed);
}
inline int64_t StampIfOn() { return TimelineOn() ? NowNs() : 0; }

void TimelineEnable(bool on, bool mark_cycles);
void TimelineWrite(const TimelineRecord& record);
// Copy the records after `cursor` (the count of records written when last read) into out, at
// most max; *next is the new cursor and *lost the records overwritten before they were read.
int64_t TimelineRead(int64_t cursor, TimelineRecord* out, int64_t max, int64_t* next,
                     int64_t* lost);

}  // namespace hpcrep

#endif  // HPCREP_NATIVE_TIMELINE_H_

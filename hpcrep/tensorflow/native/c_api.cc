// C interface for the Python side (ctypes; hpcrep/tensorflow/native/library.py wraps it).

#include <cstdio>
#include <cstring>

#include "common.h"
#include "engine.h"
#include "kernels.h"
#include "registry.h"
#include "timeline.h"

extern "C" {

// Register a communicator (an MPI_Comm handle from mpi4py, already duplicated for this use);
// starts its communication thread with these settings. Returns the engine id for the ops'
// "engine" attribute.
int64_t hpcrep_native_register(int64_t comm_handle, int check, int64_t fusion_bytes,
                               int spin_micros, int polled, double match_timeout) {
  MPI_Comm comm;
  static_assert(sizeof(MPI_Comm) <= sizeof(int64_t), "MPI_Comm must fit in 64 bits");
  std::memset(&comm, 0, sizeof(comm));
  std::memcpy(&comm, &comm_handle, sizeof(MPI_Comm));
  hpcrep::Info(tensorflow::DT_FLOAT);  // create the half-precision MPI ops now, on this thread
  hpcrep::EngineSettings settings;
  settings.check = check != 0;
  settings.fusion_bytes = fusion_bytes;
  settings.spin_micros = spin_micros;
  settings.polled = polled != 0;
  settings.match_timeout = match_timeout;
  return hpcrep::AddEngine(comm, settings);
}

// Stop the engine's thread (after it has finished what is queued) and forget it.
void hpcrep_native_unregister(int64_t id) { hpcrep::TakeEngine(id).reset(); }

// Set the fusion threshold, piece size and fp16 wire that requests traced as tuned take from now
// on (Engine::Tune). Every rank must call it at the same point of its program.
void hpcrep_native_tune(int64_t id, int64_t fusion_bytes, int64_t chunk_bytes, int half_wire) {
  if (hpcrep::Engine* e = hpcrep::FindEngine(id)) e->Tune(fusion_bytes, chunk_bytes, half_wire);
}

void hpcrep_native_begin_join(int64_t id) {
  if (hpcrep::Engine* e = hpcrep::FindEngine(id)) e->BeginJoin();
}

int hpcrep_native_join_pending(int64_t id) {
  hpcrep::Engine* e = hpcrep::FindEngine(id);
  return e != nullptr && e->JoinPending() ? 1 : 0;
}

// Cycles this rank took part in with requests of its own (join() ranks who joined last).
int64_t hpcrep_native_active_cycles(int64_t id) {
  hpcrep::Engine* e = hpcrep::FindEngine(id);
  return e != nullptr ? e->ActiveCycles() : 0;
}

// Cycles and requests reduced by engine id so far (for tests and benchmarks).
void hpcrep_native_stats(int64_t id, int64_t* cycles, int64_t* reduced) {
  *cycles = *reduced = 0;
  if (hpcrep::Engine* e = hpcrep::FindEngine(id)) e->Stats(cycles, reduced);
}

// The longest current wait of any engine: its start (steady clock seconds, as Python's
// time.monotonic) or 0, and what it waits for (copied into what, at most size bytes).
double hpcrep_native_busy(char* what, int64_t size) {
  double oldest = 0;
  hpcrep::ForEachEngine([&](hpcrep::Engine* e) {
    std::string text;
    double since = e->Busy(&text);
    if (since > 0 && (oldest == 0 || since < oldest)) {
      oldest = since;
      std::snprintf(what, size, "%s", text.c_str());
    }
  });
  return oldest;
}

// The event ring (timeline.h): start or stop recording (the ring is made on the first call).
int64_t hpcrep_native_stragglers(int64_t id, int64_t* ranks, int64_t* late_us, int64_t max,
                                 int64_t* size) {
  *size = 0;
  hpcrep::Engine* e = hpcrep::FindEngine(id);
  if (e == nullptr) return 0;
  *size = e->size();
  return e->TakeStragglers(ranks, late_us, max);
}

void hpcrep_native_timeline_enable(int on, int mark_cycles) {
  hpcrep::TimelineEnable(on != 0, mark_cycles != 0);
}

// Copy at most max records written after cursor into out; returns how many. *next is the
// cursor for the next read, *lost how many records were overwritten before they were read.
int64_t hpcrep_native_timeline_read(int64_t cursor, void* out, int64_t max, int64_t* next,
                                    int64_t* lost) {
  return hpcrep::TimelineRead(cursor, static_cast<hpcrep::TimelineRecord*>(out), max, next,
                              lost);
}

// The size of one record and of the ring, for the reader to check its mirror of the layout.
int64_t hpcrep_native_timeline_layout(int64_t* slots, int64_t* stamps) {
  *slots = hpcrep::kSlots;
  *stamps = hpcrep::kStamps;
  return static_cast<int64_t>(sizeof(hpcrep::TimelineRecord));
}

// The numbering this library was built with, for the loader to check against Python's: the
// values of Average, Sum, Min, Max, Product (hpcrep.comm.ops.ReduceOp) and of the error kinds
// mismatch, join, MPI, freed (hpcrep.tensorflow.native.EngineError). Fills at most n entries;
// returns how many there are.
int hpcrep_native_reduce_ops(int64_t* out, int n) {
  const int64_t table[] = {hpcrep::kAverage, hpcrep::kSum, hpcrep::kMin, hpcrep::kMax,
                           hpcrep::kProduct};
  for (int i = 0; i < n && i < 5; ++i) out[i] = table[i];
  return 5;
}

int hpcrep_native_error_kinds(int64_t* out, int n) {
  const int64_t table[] = {static_cast<int64_t>(hpcrep::ErrorKind::kMismatch),
                           static_cast<int64_t>(hpcrep::ErrorKind::kJoin),
                           static_cast<int64_t>(hpcrep::ErrorKind::kMpi),
                           static_cast<int64_t>(hpcrep::ErrorKind::kFreed)};
  for (int i = 0; i < n && i < 4; ++i) out[i] = table[i];
  return 4;
}

}  // extern "C"

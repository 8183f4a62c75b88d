// The engine's event ring (see timeline.h).

#include "timeline.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>

namespace hpcrep {
namespace timeline_state {
std::atomic<bool> on{false};
std::atomic<bool> mark_cycles{false};
}  // namespace timeline_state

namespace {

struct Ring {
  std::unique_ptr<TimelineRecord[]> slots{new TimelineRecord[kSlots]};
  std::unique_ptr<std::atomic<int64_t>[]> seq{new std::atomic<int64_t>[kSlots]};
  std::atomic<int64_t> next{0};
  Ring() {
    for (int64_t i = 0; i < kSlots; ++i) seq[i].store(0);
  }
};

std::once_flag ring_once;
std::atomic<Ring*> ring{nullptr};

}  // namespace

// The ring is made on first enable (4 MB), never freed: a reader may hold its address.
void TimelineEnable(bool on, bool cycles) {
  std::call_once(ring_once, [] { ring.store(new Ring()); });
  timeline_state::mark_cycles.store(cycles);
  timeline_state::on.store(on);
}

void TimelineWrite(const TimelineRecord& record) {
  Ring* r = ring.load(std::memory_order_acquire);
  if (r == nullptr) return;
  int64_t index = r->next.fetch_add(1);
  int64_t slot = index % kSlots;
  r->seq[slot].store(-1, std::memory_order_release);  // being written
  std::atomic_thread_fence(std::memory_order_release);
  std::memcpy(&r->slots[slot], &record, sizeof(TimelineRecord));
  r->seq[slot].store(index + 1, std::memory_order_release);
}

int64_t TimelineRead(int64_t cursor, TimelineRecord* out, int64_t max, int64_t* next,
                     int64_t* lost) {
  *lost = 0;
  Ring* r = ring.load(std::memory_order_acquire);
  if (r == nullptr) {
    *next = cursor;
    return 0;
  }
  int64_t end = r->next.load(std::memory_order_acquire);
  if (end - cursor > kSlots) {
    *lost = end - kSlots - cursor;
    cursor = end - kSlots;
  }
  int64_t copied = 0;
  int64_t index = cursor;
  for (; index < end && copied < max; ++index) {
    int64_t slot = index % kSlots;
    int64_t before = r->seq[slot].load(std::memory_order_acquire);
    if (before != index + 1) {
      if (before == -1 || before < index + 1) break;  // still being written: read it next time
      ++*lost;                                        // already overwritten
      continue;
    }
    std::memcpy(&out[copied], &r->slots[slot], sizeof(TimelineRecord));
    std::atomic_thread_fence(std::memory_order_acquire);
    if (r->seq[slot].load(std::memory_order_acquire) != before) {
      ++*lost;
      continue;
    }
    ++copied;
  }
  *next = index;
  return copied;
}

}  // namespace hpcrep

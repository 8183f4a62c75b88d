// Engines by id (registered from Python through the C interface) and queued requests by handle
// (from the Start kernel to the Wait kernel).

#ifndef HPCREP_NATIVE_REGISTRY_H_
#define HPCREP_NATIVE_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "engine.h"

namespace hpcrep {

int64_t AddEngine(MPI_Comm comm, const EngineSettings& settings);
// Removes the engine and returns it (destroying it stops its thread); null if unknown.
std::unique_ptr<Engine> TakeEngine(int64_t id);
// The engine, or null. Engines are removed only by hpcrep's shutdown, after the ops that use
// them have finished, so the pointer stays valid for the caller's use.
Engine* FindEngine(int64_t id);
// Calls fn on every engine, under the registry's lock.
void ForEachEngine(const std::function<void(Engine*)>& fn);

int64_t AddRequest(std::shared_ptr<Request> request);  // returns its handle
std::shared_ptr<Request> TakeRequest(int64_t handle);   // null if unknown

}  // namespace hpcrep

#endif  // HPCREP_NATIVE_REGISTRY_H_

// Engines by id and requests by handle (see registry.h).

#include "registry.h"

#include <atomic>
#include <map>
#include <mutex>
#include <unordered_map>

namespace hpcrep {
namespace {

std::mutex registry_mu;
std::map<int64_t, std::unique_ptr<Engine>> engines;
std::unordered_map<int64_t, std::shared_ptr<Request>> requests;
int64_t next_engine = 1;
std::atomic<int64_t> next_handle{1};

}  // namespace

int64_t AddEngine(MPI_Comm comm, const EngineSettings& settings) {
  std::lock_guard<std::mutex> lock(registry_mu);
  int64_t id = next_engine++;
  engines[id] = std::make_unique<Engine>(comm, settings);
  return id;
}

std::unique_ptr<Engine> TakeEngine(int64_t id) {
  std::lock_guard<std::mutex> lock(registry_mu);
  auto it = engines.find(id);
  if (it == engines.end()) return nullptr;
  std::unique_ptr<Engine> engine = std::move(it->second);
  engines.erase(it);
  return engine;
}

Engine* FindEngine(int64_t id) {
  std::lock_guard<std::mutex> lock(registry_mu);
  auto it = engines.find(id);
  return it == engines.end() ? nullptr : it->second.get();
}

void ForEachEngine(const std::function<void(Engine*)>& fn) {
  std::lock_guard<std::mutex> lock(registry_mu);
  for (auto& kv : engines) fn(kv.second.get());
}

int64_t AddRequest(std::shared_ptr<Request> request) {
  int64_t handle = next_handle.fetch_add(1);
  std::lock_guard<std::mutex> lock(registry_mu);
  requests[handle] = std::move(request);
  return handle;
}

std::shared_ptr<Request> TakeRequest(int64_t handle) {
  std::lock_guard<std::mutex> lock(registry_mu);
  auto it = requests.find(handle);
  if (it == requests.end()) return nullptr;
  std::shared_ptr<Request> request = std::move(it->second);
  requests.erase(it);
  return request;
}

}  // namespace hpcrep

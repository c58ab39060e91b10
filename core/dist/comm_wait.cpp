#include "core/dist/comm_wait.h"

#include <chrono>
#include <cstdio>
#include <mutex>

namespace pt {

namespace {

using Clock = std::chrono::steady_clock;

// One rank has one main thread making calls: one mark at a time (calls do not nest).
struct Mark {
  const char* call = nullptr;  // nullptr: no call in progress
  const std::vector<int>* members = nullptr;
  int self = 0, peer = -1;
  Clock::time_point since;
};

std::mutex g_mu;
Mark g_mark;
std::vector<std::string> g_hosts;

// rank_and_host with g_mu held.
std::string rank_and_host_locked(int world_rank) {
  std::string s = std::to_string(world_rank);
  if (world_rank < static_cast<int>(g_hosts.size())) s += " (host " + g_hosts[world_rank] + ")";
  return s;
}

}  // namespace

std::string rank_and_host(int world_rank) {
  std::lock_guard<std::mutex> lock(g_mu);
  return rank_and_host_locked(world_rank);
}

void set_rank_hosts(std::vector<std::string> hosts) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_hosts = std::move(hosts);
}

CommWait::CommWait(const char* call, const std::vector<int>& members, int self, int peer) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_mark = {call, &members, self, peer, Clock::now()};
}

CommWait::~CommWait() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_mark.call = nullptr;
}

std::string describe_comm_wait() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_mark.call) return "";
  char waited[32];
  std::snprintf(waited, sizeof waited, "%.1f s", std::chrono::duration<double>(Clock::now() - g_mark.since).count());
  const std::vector<int>& m = *g_mark.members;
  std::string s = "this rank has waited " + std::string(waited) + " in " + g_mark.call;
  if (g_mark.peer >= 0) return s + " rank " + rank_and_host_locked(m[g_mark.peer]);
  s += " with rank" + std::string(m.size() > 2 ? "s " : " ");
  bool first = true;
  for (size_t i = 0; i < m.size(); i++) {
    if (static_cast<int>(i) == g_mark.self) continue;
    s += (first ? "" : ", ") + rank_and_host_locked(m[i]);
    first = false;
  }
  return s;
}

}  // namespace pt

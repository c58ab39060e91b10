#include "core/plan/comm_model.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <string>
#include <utility>

#include "core/common/error.h"
#include "core/common/split_list.h"

namespace pt {

double collective_s(Collective kind, double bytes, int n, const Link& link) {
  if (n <= 1 && kind != Collective::send) return 0;
  const double beta = 1.0 / (link.gbps * 1e9);
  const double ring_steps = n - 1, ring_factor = (n - 1.0) / n;
  switch (kind) {
    case Collective::all_reduce: {
      const double ring = 2 * ring_steps * link.latency_s + 2 * ring_factor * bytes * beta;
      const double tree = 2 * std::ceil(std::log2(n)) * link.latency_s + 2 * bytes * beta;
      return std::min(ring, tree);
    }
    case Collective::reduce_scatter:
    case Collective::all_gather:
    case Collective::all_to_all:
      return ring_steps * link.latency_s + ring_factor * bytes * beta;
    case Collective::send:
      return link.latency_s + bytes * beta;
  }
  return 0;
}

Overlap parse_overlap(const std::string& list) {
  if (list == "picotrain") return Overlap{};
  Overlap o;
  o.dp_grads = false;
  if (list == "none") return o;
  const std::pair<const char*, bool Overlap::*> names[] = {
      {"dp", &Overlap::dp_grads}, {"zero", &Overlap::zero}, {"tp", &Overlap::tp}, {"cp", &Overlap::cp},
      {"pp", &Overlap::pp}};
  for (const std::string& name : split_list(list)) {
    const auto* hit = std::find_if(std::begin(names), std::end(names), [&](const auto& n) { return name == n.first; });
    if (hit == std::end(names))
      throw ConfigError("plan --overlap '" + list + "': '" + name +
                        "' is not one of dp, zero, tp, cp, pp (or the whole list: none, picotrain)");
    if (o.*(hit->second)) throw ConfigError("plan --overlap '" + list + "' names " + name + " twice");
    o.*(hit->second) = true;
  }
  return o;
}

std::string describe(const Overlap& o) {
  std::string on, off;
  for (const auto& [name, overlapped] : {std::pair{"dp grads", o.dp_grads}, {"zero", o.zero},
                                         {"tp", o.tp}, {"cp", o.cp}, {"pp", o.pp}, {"ep", false}}) {
    std::string& list = overlapped ? on : off;
    list += (list.empty() ? "" : ", ") + std::string(name);
  }
  return "overlapped with compute: " + (on.empty() ? "none" : on) + "; exposed: " + (off.empty() ? "none" : off);
}

double exposed_s(double comm_s, double window_s, double tail_s) {
  return std::max(std::min(tail_s, comm_s), comm_s - window_s);
}

}  // namespace pt

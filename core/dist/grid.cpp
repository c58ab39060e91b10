#include "core/dist/grid.h"

#include <functional>
#include <sstream>

#include "core/common/error.h"

namespace pt {

int& Coord::operator[](Axis a) {
  switch (a) {
    case Axis::tp: return tp;
    case Axis::cp: return cp;
    case Axis::dp: return dp;
    case Axis::pp: return pp;
  }
  return tp;
}
int Coord::operator[](Axis a) const { return const_cast<Coord&>(*this)[a]; }

static Axis parse_axis(const std::string& s) {
  if (s == "tp") return Axis::tp;
  if (s == "cp") return Axis::cp;
  if (s == "dp") return Axis::dp;
  if (s == "pp") return Axis::pp;
  throw ConfigError("parallel.order: unknown axis '" + s + "' (expected tp, cp, dp, pp)");
}

Grid::Grid(const ParallelSection& p) {
  size_ = {p.tp, p.cp, p.dp, p.pp};
  std::stringstream ss(p.order);
  std::string part;
  int i = 0;
  while (std::getline(ss, part, '-')) {
    if (i == 4) throw ConfigError("parallel.order=" + p.order + " must name tp, cp, dp, pp once each");
    order_[i++] = parse_axis(part);
  }
  if (i != 4) throw ConfigError("parallel.order=" + p.order + " must name tp, cp, dp, pp once each");
  replicate_ = p.dp_replicate;
  ep_ = p.ep;
  if (ep_ < 1 || p.dp % ep_ != 0)
    throw ConfigError("parallel.ep=" + std::to_string(ep_) + " must divide parallel.dp=" + std::to_string(p.dp));
  if (replicate_ < 1 || p.dp % replicate_ != 0)
    throw ConfigError("parallel.dp_replicate=" + std::to_string(replicate_) + " must divide parallel.dp=" +
                      std::to_string(p.dp));
}

Coord Grid::coord(int rank) const {
  Coord c;
  for (Axis a : order_) {
    const int n = size(a);
    c[a] = rank % n;
    rank /= n;
  }
  return c;
}

int Grid::rank(const Coord& c) const {
  int r = 0;
  for (int i = 3; i >= 0; i--) r = r * size(order_[i]) + c[order_[i]];
  return r;
}

std::vector<int> Grid::group(int r, Axis axis) const {
  Coord c = coord(r);
  std::vector<int> g;
  for (int i = 0; i < size(axis); i++) {
    c[axis] = i;
    g.push_back(rank(c));
  }
  return g;
}

std::vector<int> Grid::dp_cp_group(int r) const {
  Coord c = coord(r);
  std::vector<int> g;
  for (int d = 0; d < size(Axis::dp); d++)
    for (int k = 0; k < size(Axis::cp); k++) {
      c.dp = d;
      c.cp = k;
      g.push_back(rank(c));
    }
  return g;
}

std::vector<int> Grid::dp_shard_group(int r) const {
  const int replica = coord(r).dp / dp_shard();
  std::vector<int> g;
  for (int member : dp_cp_group(r))
    if (coord(member).dp / dp_shard() == replica) g.push_back(member);
  return g;
}

std::vector<int> Grid::ep_group(int r) const {
  Coord c = coord(r);
  const int first = c.dp - c.dp % ep_;
  std::vector<int> g;
  for (int i = 0; i < ep_; i++) {
    c.dp = first + i;
    g.push_back(rank(c));
  }
  return g;
}

std::vector<int> Grid::expert_dp_cp_group(int r) const { return holding_experts_of(r, dp_cp_group(r)); }

std::vector<int> Grid::expert_shard_group(int r) const { return holding_experts_of(r, dp_shard_group(r)); }

std::vector<int> Grid::holding_experts_of(int r, const std::vector<int>& group) const {
  const int slot = coord(r).dp % ep_;
  std::vector<int> g;
  for (int member : group)
    if (coord(member).dp % ep_ == slot) g.push_back(member);
  return g;
}

std::vector<int> Grid::dp_replicate_group(int r) const {
  Coord c = coord(r);
  const int shard = c.dp % dp_shard();
  std::vector<int> g;
  for (int replica = 0; replica < replicate_; replica++) {
    c.dp = replica * dp_shard() + shard;
    g.push_back(rank(c));
  }
  return g;
}

namespace {

const char* axis_name(Axis a) {
  switch (a) {
    case Axis::tp: return "tp";
    case Axis::cp: return "cp";
    case Axis::dp: return "dp";
    case Axis::pp: return "pp";
  }
  return "?";
}

std::string list(const std::vector<int>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); i++) os << (i ? " " : "") << v[i];
  os << "]";
  return os.str();
}

// "[0 1] [2 3]": every distinct group, at most `shown` of them.
std::string groups_line(int world_size, const std::function<std::vector<int>(int)>& group_of) {
  constexpr size_t shown = 8;
  std::vector<std::vector<int>> seen;
  for (int r = 0; r < world_size; r++) {
    std::vector<int> members = group_of(r);
    bool known = false;
    for (const auto& s : seen) known = known || s == members;
    if (!known) seen.push_back(std::move(members));
  }
  std::ostringstream os;
  for (size_t i = 0; i < seen.size() && i < shown; i++) os << (i ? " " : "") << list(seen[i]);
  if (seen.size() > shown) os << " ... (" << seen.size() << " groups)";
  return os.str();
}

}  // namespace

std::string Grid::describe() const {
  constexpr int shown_ranks = 16;
  std::ostringstream os;
  std::string order;
  for (Axis a : order_) {
    if (!order.empty()) order += "-";
    order += axis_name(a);
  }
  os << "world " << world_size() << " = dp " << size(Axis::dp) << " x tp " << size(Axis::tp) << " x pp "
     << size(Axis::pp) << " x cp " << size(Axis::cp) << ", order " << order << " (innermost first)";
  if (replicate_ > 1) os << "; HSDP dp = " << replicate_ << " replicas x " << dp_shard() << " shards";
  os << "\nrank (tp cp dp pp):";
  for (int r = 0; r < world_size() && r < shown_ranks; r++) {
    const Coord c = coord(r);
    os << " " << r << " (" << c.tp << " " << c.cp << " " << c.dp << " " << c.pp << ")";
  }
  if (world_size() > shown_ranks) os << " ... (" << world_size() << " ranks)";
  auto line = [&](const std::string& name, std::vector<int> (Grid::*group)(int) const) {
    os << "\n" << name << " groups: " << groups_line(world_size(), [&](int r) { return (this->*group)(r); });
  };
  if (size(Axis::dp) * size(Axis::cp) > 1) line("dp x cp", &Grid::dp_cp_group);
  if (ep_ > 1) line("expert parallel", &Grid::ep_group);
  if (replicate_ > 1) {
    line("ZeRO shard", &Grid::dp_shard_group);
    line("replica", &Grid::dp_replicate_group);
  }
  for (Axis a : {Axis::tp, Axis::cp, Axis::pp})
    if (size(a) > 1)
      os << "\n" << axis_name(a) << " groups: " << groups_line(world_size(), [&](int r) { return group(r, a); });
  return os.str();
}

}  // namespace pt

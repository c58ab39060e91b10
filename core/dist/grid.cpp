#include "core/dist/grid.h"

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

std::string Grid::describe() const {
  std::ostringstream os;
  for (int r = 0; r < world_size(); r++) {
    const Coord c = coord(r);
    os << "rank " << r << ": tp " << c.tp << " cp " << c.cp << " dp " << c.dp << " pp " << c.pp << "\n";
  }
  return os.str();
}

}  // namespace pt

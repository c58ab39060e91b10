// Pipeline bubble formulas and the warning (derivation in the header).
#include "core/train/pp_bubble.h"

#include <iomanip>
#include <sstream>

namespace pt {

double pipeline_bubble_ratio(PipeSchedule kind, int pp, int v, int m) {
  check_pipeline_schedule(kind, pp, v, m);
  const int pieces = kind == PipeSchedule::interleaved ? v * m : m;
  return static_cast<double>(pp - 1) / pieces;
}

double pipeline_bubble_fraction(PipeSchedule kind, int pp, int v, int m) {
  const double ratio = pipeline_bubble_ratio(kind, pp, v, m);
  return ratio / (1.0 + ratio);
}

std::optional<std::string> pipeline_bubble_warning(PipeSchedule kind, int pp, int v, int m, double threshold) {
  const double ratio = pipeline_bubble_ratio(kind, pp, v, m);
  if (ratio <= threshold) return std::nullopt;
  const bool interleaved = kind == PipeSchedule::interleaved;
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << "pipeline bubble " << 100.0 * ratio << "% ("
    << (interleaved ? "(pp-1)/(v*m)" : "(pp-1)/m") << " with pp=" << pp;
  if (interleaved) s << ", v=" << v;
  s << ", m=" << m << "; pp = parallel.pp, " << (interleaved ? "v = parallel.pp_virtual_stages, " : "")
    << "m = batch.grad_accum_steps micro-batches) is above " << std::setprecision(0) << 100.0 * threshold
    << "% of compute time: raise batch.global_batch_tokens or lower batch.micro_batch_size to get more "
       "micro-batches"
    << (interleaved ? ", or raise parallel.pp_virtual_stages" : ", or use parallel.pp_schedule=\"interleaved\"");
  return s.str();
}

}  // namespace pt

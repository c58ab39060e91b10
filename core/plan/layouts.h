// The layouts a config can run on N GPUs: every (dp, tp, pp, cp) with dp*tp*pp*cp = N, each
// checked against the config's rules (core/config/config_rules.cpp: tp | n_heads and
// padded_vocab, pp*virtual stages | n_layers, 2*cp | seq_len, the global batch a multiple of
// micro_batch_size*seq_len*dp, ...) by resolving the config with those four keys set, exactly as
// `picotrain train` would on N ranks. Nothing else is assumed about which layouts are good.
#pragma once
#include <string>
#include <vector>

#include "core/config/run_config.h"

namespace pt {

struct LayoutCandidate {
  int dp = 1, tp = 1, pp = 1, cp = 1;
  std::string invalid;  // the rule it breaks (the config error), "" when valid
  RunConfig cfg;        // the resolved config when valid
  std::vector<std::string> sets;  // the overrides that resolved it (the user's, then the layout's)
  bool valid() const { return invalid.empty(); }
  std::string name() const;  // "dp4 tp2 pp1 cp1"
};

// Every divisor combination of `gpus`, ordered by (tp, pp, cp) ascending. config_path and
// overrides: as for `picotrain train --config FILE --set ...` (the parallel.dp/tp/pp/cp keys are
// set per layout, after the overrides). A config that is wrong whatever the layout (a missing
// file, invalid JSON, an unknown key: every layout fails with the same error) throws that
// ConfigError rather than marking every layout invalid.
std::vector<LayoutCandidate> enumerate_layouts(const std::string& config_path, const std::vector<std::string>& overrides,
                                               int gpus);

// The candidate's config resolved again with `extra` overrides after its own (e.g. another
// batch.micro_batch_size); the candidate with the rule it breaks in `invalid` when it does not.
LayoutCandidate resolve_with(const std::string& config_path, const LayoutCandidate& c, int gpus,
                             const std::vector<std::string>& extra);

// n_layers blocks over `chunks` virtual stages (parallel.pp_layers) as evenly as they go: each
// gets n_layers/chunks or one more, and the lighter ones go to the ends first (first, last,
// second, second to last, ...), since the first virtual stage also holds the embedding and the
// last the head and the loss. Llama 3 405B's 126 layers on 16 stages: 7, 8 x 14, 7, as Meta ran it.
std::vector<int> even_pp_layers(int n_layers, int chunks);

}  // namespace pt

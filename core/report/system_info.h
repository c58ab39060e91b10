// What the run report says about the machines: how many nodes the ranks are on and how they are
// connected, as detected on this host (nothing is assumed: where a tool or a file is missing the
// text says so).
#pragma once
#include <cstdint>
#include <string>

namespace pt {

// This host's name, and a 48-bit hash of it (exact in a double, so ranks can exchange it with a
// double all_reduce and count the distinct hosts).
std::string host_name();
double host_id();

struct Interconnect {
  std::string within_node;    // e.g. "NVLink (nvidia-smi topo -m: NV18)", "shared memory (3 ranks on one host)"
  std::string between_nodes;  // e.g. "InfiniBand/RoCE: mlx5_0 400 Gb/sec (4X NDR)", "none (one node)"
};

// gpu: ranks drive GPUs (else CPU ranks); ranks_per_node: on this node; nodes: in the run.
Interconnect detect_interconnect(bool gpu, int ranks_per_node, int nodes);

// The first line of `command`'s stdout ("" when it fails or prints nothing).
std::string command_output(const std::string& command);

}  // namespace pt

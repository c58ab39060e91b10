#include "core/report/system_info.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>

namespace pt {

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

double host_id() {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : host_name()) h = (h ^ c) * 1099511628211ull;
  return static_cast<double>(h >> 16);  // 48 bits
}

namespace {

// All of `command`'s stdout ("" when it cannot run). popen runs it through posix_spawn (glibc),
// which is safe in an MPI process.
std::string run_command(const std::string& command) {
  std::string out;
  FILE* p = popen((command + " 2>/dev/null").c_str(), "r");
  if (!p) return out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  if (pclose(p) != 0) return "";
  return out;
}

std::string read_line(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string gpu_links() {
  const std::string topo = run_command("nvidia-smi topo -m");
  if (topo.empty()) return "unknown (nvidia-smi topo -m did not run)";
  std::smatch nv;
  // NV<n>: n bonded NVLinks between two GPUs; PIX/PXB/PHB/NODE/SYS: PCIe paths.
  if (std::regex_search(topo, nv, std::regex("\\bNV[0-9]+\\b"))) return "NVLink (nvidia-smi topo -m: " + nv.str() + ")";
  return "PCIe (nvidia-smi topo -m shows no NVLink)";
}

std::string rdma_devices() {
  namespace fs = std::filesystem;
  std::string out;
  std::error_code ec;
  for (const auto& dev : fs::directory_iterator("/sys/class/infiniband", ec)) {
    const std::string rate = read_line(dev.path() / "ports" / "1" / "rate");
    const std::string layer = read_line(dev.path() / "ports" / "1" / "link_layer");
    out += (out.empty() ? "" : ", ") + dev.path().filename().string() + (rate.empty() ? "" : " " + rate) +
           (layer.empty() ? "" : " " + layer);
  }
  return out;
}

}  // namespace

std::string command_output(const std::string& command) {
  const std::string out = run_command(command);
  return out.substr(0, out.find('\n'));
}

Interconnect detect_interconnect(bool gpu, int ranks_per_node, int nodes) {
  Interconnect ic;
  if (ranks_per_node <= 1) ic.within_node = "none (one rank per node)";
  else if (gpu) ic.within_node = gpu_links();
  else ic.within_node = "shared memory (" + std::to_string(ranks_per_node) + " CPU ranks on one host)";
  if (nodes <= 1) {
    ic.between_nodes = "none (one node)";
  } else {
    const std::string rdma = rdma_devices();
    ic.between_nodes = rdma.empty() ? "TCP/Ethernet (no RDMA device under /sys/class/infiniband)"
                                    : "InfiniBand/RoCE: " + rdma;
  }
  return ic;
}

}  // namespace pt

// The test hosts of the cluster tests: network namespaces made by scripts/netns_cluster.sh, whose
// `run` starts the test binary with NETNS_CLUSTER (the cluster's name) and NETNS_CLUSTER_HOSTS
// (the hosts' addresses) set, and removes the hosts when it ends. Ranks on different hosts talk
// over TCP through veth links and a bridge: shared memory is switched off, so every collective
// and pipeline message crosses a network stack, and a test can take a host's link down or slow
// it. mpirun runs on host 0 and starts its daemons on the others through the script's `exec`
// (an "rsh" into a namespace).
#pragma once
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "run_test_support.h"

namespace pt::test {

struct Cluster {
  std::string name;
  std::vector<std::string> hosts;  // addresses, host 0 first

  // The cluster this process was started in; without one the test cannot run here (exit 77,
  // ctest's "skipped", with the reason: the script itself says why it made none).
  static Cluster from_env() {
    const char* name = std::getenv("NETNS_CLUSTER");
    const char* hosts = std::getenv("NETNS_CLUSTER_HOSTS");
    if (!name || !hosts) {
      std::fprintf(stderr, "skipped: no test hosts; start this test with scripts/netns_cluster.sh run NAME 2 %s\n",
                   "<test binary>");
      std::exit(77);
    }
    Cluster c{name, {}};
    std::istringstream in(hosts);
    for (std::string h; in >> h;) c.hosts.push_back(h);
    return c;
  }

  static std::string script() { return std::string(PICOTRAIN_SOURCE_DIR) + "/scripts/netns_cluster.sh"; }

  // A command of the script (link, slow); it must succeed.
  void control(const std::string& args) const {
    const Launch l = run_command(script() + " " + args, 30);
    INFO(args << ": " << l.output);
    REQUIRE(l.exit_code == 0);
  }
  void link(int host, bool up) const { control("link " + name + " " + std::to_string(host) + (up ? " up" : " down")); }
  // mbit > 0: host's link sends at most mbit Mbit/s; 0: at full speed again.
  void slow(int host, int mbit) const {
    control("slow " + name + " " + std::to_string(host) + " " + (mbit > 0 ? std::to_string(mbit) : "off"));
  }
  std::string host_name(int host) const { return name + "-h" + std::to_string(host); }

  // A shell command line that runs `picotrain <args>` under mpirun on host 0 with
  // `ranks_per_host` ranks on each of the first `n_hosts` hosts (ranks 0.. on host 0, the next
  // on host 1, ...), MPI over TCP on the cluster's subnet only. `wrap` runs the whole mpirun
  // line inside another command (e.g. a shell that mounts a file system first): "%s" in it is
  // replaced by the line. No single quotes in args.
  std::string mpirun(int ranks_per_host, const std::string& args, int n_hosts = 2, const std::string& wrap = "%s") const {
    REQUIRE(static_cast<int>(hosts.size()) >= n_hosts);
    std::string host_list;
    for (int h = 0; h < n_hosts; h++) host_list += (h ? "," : "") + hosts[h] + ":" + std::to_string(ranks_per_host);
    const std::string subnet = hosts[0].substr(0, hosts[0].rfind('.')) + ".0/24";
    std::string line = "env OMP_NUM_THREADS=1 OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=" + subnet +
                       " OMPI_MCA_oob_tcp_if_include=" + subnet + " OMPI_MCA_plm_rsh_agent=\"" + script() +
                       " exec\" NETNS_CLUSTER=" + name + " " + PICOTRAIN_MPIEXEC + " --host " + host_list + " -np " +
                       std::to_string(ranks_per_host * n_hosts) + " " + PICOTRAIN_BIN + " " + args;
    const size_t at = wrap.find("%s");
    if (at != std::string::npos) line = wrap.substr(0, at) + line + wrap.substr(at + 2);
    return script() + " exec " + hosts[0] + " '" + line + "'";
  }
};

// The same launch on one host (this test's own namespace, shared memory between the ranks).
inline std::string mpirun_one_host(int ranks, const std::string& args) {
  return "env OMP_NUM_THREADS=1 OMPI_MCA_btl=self,vader " + std::string(PICOTRAIN_MPIEXEC) + " -np " +
         std::to_string(ranks) + " " + PICOTRAIN_MPIEXEC_FLAGS + " " + PICOTRAIN_BIN + " " + args;
}

}  // namespace pt::test

// Every parallel axis with its ranks on separate hosts: dp with ZeRO, tp with sequence parallel,
// pp (1F1B) and cp (ring) with one rank on each of two test hosts, and dp x tp with two ranks per
// host (tp inside a host, dp between them), MPI over TCP between network namespaces
// (cluster_test_support.h). Each run's losses and gradient norms equal those of the same layout
// on one host over shared memory bit for bit: the network changes how bytes travel, never what
// is computed (the CPU backend is deterministic, and MPI picks its collective algorithms by group
// and message size, not by transport). The run report counts two nodes: the ranks were on two hosts.
#include <catch2/catch.hpp>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cluster_test_support.h"
#include "launch_test_support.h"

using namespace pt::test;
namespace fs = std::filesystem;

TEST_CASE("each parallel axis across two hosts over TCP equals the same layout on one host", "[cluster]") {
  const Cluster cluster = Cluster::from_env();
  const TempRun run("cluster_parity");
  struct Layout {
    std::string name;
    int ranks_per_host;
    std::string sets;
  };
  const std::vector<Layout> layouts = {
      {"dp2_zero2", 1, "--set parallel.zero_stage=2"},
      {"tp2_sp", 1, "--set parallel.tp=2 --set parallel.sequence_parallel=true"},
      {"pp2_1f1b", 1, "--set parallel.pp=2 --set parallel.pp_schedule=1f1b --set batch.global_batch_tokens=128"},
      {"cp2_ring", 1, "--set parallel.cp=2 --set parallel.cp_impl=ring"},
      {"tp2_dp2_zero1", 2, "--set parallel.tp=2 --set parallel.zero_stage=1"},
  };
  for (const Layout& layout : layouts) {
    INFO(layout.name);
    const int ranks = 2 * layout.ranks_per_host;
    auto train = [&](const std::string& where) {
      return run.train("--set schedule.total_steps=4 --set optim.lr=3e-3 " + layout.sets +
                       " --set run.out_dir=" + (run.dir / (layout.name + "_" + where)).string());
    };
    const Launch hosts = run_command(cluster.mpirun(layout.ranks_per_host, train("hosts")), 120);
    INFO(hosts.output);
    REQUIRE(hosts.exit_code == 0);
    const Launch one = run_command(mpirun_one_host(ranks, train("one")), 120);
    INFO(one.output);
    REQUIRE(one.exit_code == 0);

    const auto got = metrics(run.dir / (layout.name + "_hosts") / "metrics.jsonl");
    const auto want = metrics(run.dir / (layout.name + "_one") / "metrics.jsonl");
    REQUIRE(got.size() == 4);
    REQUIRE(want.size() == 4);
    for (const auto& [step, lg] : want) {
      INFO("step " << step);
      CHECK(got.at(step).first == lg.first);  // loss, bit for bit
      CHECK(got.at(step).second == lg.second);  // grad_norm
    }
    const auto report = nlohmann::json::parse(std::ifstream(run.dir / (layout.name + "_hosts") / "report.json"));
    INFO(report.dump());
    CHECK(report["hardware"]["nodes"].get<int>() == 2);
  }
}

// What `picotrain plan` searches besides dp/tp/pp/cp: the ZeRO stage, the recompute mode and,
// for a mixture of experts, the expert-parallel size (the micro-batch and pipeline searches are
// in test_plan_model). Each keeps a layout's fastest variant that fits, never a slower one, and
// the table and JSON say which it chose.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/plan/plan.h"
#include "run_test_support.h"

using namespace pt;
using namespace pt::test;
using Catch::Matchers::Contains;

namespace {

const std::string kConfigs = std::string(PICOTRAIN_SOURCE_DIR) + "/configs/";

const LayoutPlan& layout_of(const Plan& plan, const std::string& name) {
  for (const LayoutPlan& l : plan.layouts)
    if (l.layout.name() == name) return l;
  FAIL("no layout " << name);
  throw;
}

// Every layout of `searched` is at least as good as the same layout of `fixed`: it fits where
// that one does, and is no slower when both fit.
void check_never_worse(const Plan& fixed, const Plan& searched) {
  REQUIRE(fixed.layouts.size() == searched.layouts.size());
  for (const LayoutPlan& s : searched.layouts) {
    INFO(s.layout.name());
    const LayoutPlan& f = layout_of(fixed, s.layout.name());
    if (f.fits) CHECK(s.fits);
    if (f.fits && s.fits) CHECK(s.time.step_s <= f.time.step_s);
  }
}

}  // namespace

TEST_CASE("--search-zero and --search-recompute: what does not fit as configured fits with sharding or recompute",
          "[plan]") {
  // GPT-2 1.5B on 8 GPUs of 24 GiB (B 8, ZeRO-1, no recompute): dp8 needs more than 24 GiB of
  // activations and parameters as configured.
  const std::string cfg = kConfigs + "gpt2-1.5b.json";
  Hardware hw;
  hw.gpu_memory_gib = 24;
  const Plan fixed = make_plan(cfg, {}, 8, hw);
  const LayoutPlan& dp8 = layout_of(fixed, "dp8 tp1 pp1 cp1");
  REQUIRE_FALSE(dp8.fits);

  const Plan zero = make_plan(cfg, {}, 8, hw, PlanSearch{.zero_stages = true});
  check_never_worse(fixed, zero);
  const Plan recompute = make_plan(cfg, {}, 8, hw, PlanSearch{.recompute = true});
  check_never_worse(fixed, recompute);
  const LayoutPlan& rc = layout_of(recompute, "dp8 tp1 pp1 cp1");
  CHECK(rc.fits);
  CHECK(rc.layout.cfg.recompute.mode != "none");
  CHECK(rc.time.recompute_s > 0);

  const Plan both = make_plan(cfg, {}, 8, hw, PlanSearch{.zero_stages = true, .recompute = true});
  check_never_worse(zero, both);
  check_never_worse(recompute, both);
  int changed = 0;
  for (const LayoutPlan& l : both.layouts)
    changed += l.layout.cfg.parallel.zero_stage != 1 || l.layout.cfg.recompute.mode != "none";
  CHECK(changed > 0);
  // The recompute kept is the least that fits: selective before full when selective fits.
  for (const LayoutPlan& l : both.layouts)
    if (l.fits && l.layout.cfg.recompute.mode == "full") {
      INFO(l.layout.name());
      const Plan sel = make_plan(cfg,
                                 {"recompute.mode=selective", "parallel.zero_stage=" +
                                                                  std::to_string(l.layout.cfg.parallel.zero_stage)},
                                 8, hw, PlanSearch{.layout = l.layout.name()});
      CHECK((!sel.layouts.at(0).fits || sel.layouts.at(0).time.step_s >= l.time.step_s));
    }
}

TEST_CASE("--search-ep: a mixture of experts tries every ep dividing dp and the experts", "[plan][moe]") {
  // tiny-moe (8 experts) on 4 GPUs: dp4 with ep 1, 2 or 4. Memory just below what ep 1 needs
  // and above ep 4's: only sharding the experts fits.
  const std::string cfg = kConfigs + "tiny-moe.json";
  const std::vector<std::string> sets = {"batch.micro_batch_size=4"};  // 1024 tokens a step over dp4
  const PlanSearch dp4{.layout = "dp4 tp1 pp1 cp1"};
  const LayoutPlan ep1 = make_plan(cfg, sets, 4, Hardware{}, dp4).layouts.at(0);
  const LayoutPlan ep4 = make_plan(cfg, {sets[0], "parallel.ep=4"}, 4, Hardware{}, dp4).layouts.at(0);
  const double gib = 1024.0 * 1024 * 1024;
  REQUIRE(ep4.peak().total() < ep1.peak().total());
  Hardware hw;
  hw.gpu_memory_gib = (ep4.peak().total() + ep1.peak().total()) / 2 / gib;
  PlanSearch search = dp4;
  CHECK_FALSE(make_plan(cfg, sets, 4, hw, search).layouts.at(0).fits);
  search.expert_parallel = true;
  const LayoutPlan chosen = make_plan(cfg, sets, 4, hw, search).layouts.at(0);
  CHECK(chosen.fits);
  CHECK(chosen.layout.cfg.parallel.ep > 1);
  // A dense model has no ep to search: the same plan.
  const std::string dense = kConfigs + "gpt2-124m.json";
  CHECK(make_plan(dense, {}, 4, Hardware{}, PlanSearch{.expert_parallel = true}).layouts.size() ==
        make_plan(dense, {}, 4, Hardware{}).layouts.size());
}

TEST_CASE("plan --search-all: the table and --json say each layout's zero stage, recompute and ep", "[plan]") {
  const std::string cmd = std::string(PICOTRAIN_BIN) + " plan --config " + kConfigs +
                          "tiny-moe.json --gpus 4 --search-all --gpu-memory-gib 0.12";
  const Launch text = run_command(cmd);
  REQUIRE(text.exit_code == 0);
  CHECK_THAT(text.output, Contains("accum zero rcmp  ep |"));
  const Launch json = run_command(cmd + " --json");
  REQUIRE(json.exit_code == 0);
  const nlohmann::json j = nlohmann::json::parse(json.output.substr(json.output.find('{')));
  bool moved = false;
  for (const nlohmann::json& l : j["layouts"]) {
    INFO(l.dump());
    CHECK(l["zero_stage"].get<int>() >= 0);
    CHECK(l["zero_stage"].get<int>() <= 3);
    CHECK(l["recompute"].is_string());
    CHECK(l["ep"].get<int>() >= 1);
    // Each choice also appears in the overrides that reproduce it with `picotrain train`.
    for (const std::string& s : l["overrides"].get<std::vector<std::string>>())
      moved = moved || s.rfind("parallel.zero_stage=", 0) == 0 || s.rfind("recompute.mode=", 0) == 0 ||
              s.rfind("parallel.ep=", 0) == 0;
  }
  CHECK(moved);
}

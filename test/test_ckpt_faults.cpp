// What can go wrong around a checkpoint: the process dies part-way through a save, a file
// rots on disk, the disk fills up or the directory cannot be written. In every case the
// checkpoints committed before stay loadable, and the messages name the file.
#include <catch2/catch.hpp>

#include <cerrno>
#include <cstring>

#include "ckpt_test_support.h"
#include "core/ckpt/checkpoint_dir.h"
#include "core/ckpt/durable_io.h"
#include "core/ckpt/manifest.h"
#include "core/cpu/cpu_ops.h"

using namespace pt;
using namespace pt::test;
using Catch::Matchers::Contains;

namespace {

// Thrown by the fault hook to stand for SIGKILL: not a std::exception, so the writer's cleanup
// (which handles errors) does not run, exactly as after a real kill.
struct SimulatedKill {};

// Removes the fault hook when a test leaves, however it leaves.
struct HookGuard {
  explicit HookGuard(ckpt::FaultHook h) { ckpt::set_fault_hook(std::move(h)); }
  ~HookGuard() { ckpt::set_fault_hook(nullptr); }
};

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::vector<std::string> leftovers(const std::string& dir) { return ckpt::scan_checkpoint_dir(dir).leftovers; }

}  // namespace

TEST_CASE("a save killed part-way is never loaded; the next start resumes from the previous checkpoint", "[ckpt]") {
  struct Point {
    const char* name;
    std::function<bool(std::string_view, const std::string&)> at;
  };
  int writes = 0;
  const std::vector<Point> points = {
      {"in the middle of the data files", [&](std::string_view s, const std::string&) { return s == "write" && ++writes == 5; }},
      {"before the manifest", [](std::string_view s, const std::string& p) { return s == "open" && ends_with(p, "manifest.json"); }},
      {"after the rename, before latest", [](std::string_view s, const std::string& p) { return s == "open" && ends_with(p, "latest.tmp"); }},
  };
  for (const auto& point : points) {
    DYNAMIC_SECTION("killed " << point.name) {
      CkptFixture fx("ckpt_kill");
      const World world;
      std::vector<float> at4;
      {
        CpuOps ops;
        Trainer t(fx.config(), world, ops);
        for (int i = 0; i < 4; i++) t.step();
        t.save_checkpoint();
        at4 = full_state(t, ops);
        t.step();
        t.step();
        writes = 0;
        HookGuard hook([&](std::string_view s, const std::string& p) -> int {
          if (point.at(s, p)) throw SimulatedKill{};
          return 0;
        });
        CHECK_THROWS_AS(t.save_checkpoint(), SimulatedKill);
      }
      CHECK(read_text(fx.ckpt_dir() + "/latest") == "step_00000004\n");

      CpuOps ops;
      Trainer r(fx.config({"checkpoint.resume=auto"}), world, ops);
      CHECK(r.steps_done() == 4);
      CHECK(same_bytes(full_state(r, ops), at4));

      // The next save of step 6 replaces whatever the killed one left, and cleans up.
      r.step();
      r.step();
      r.save_checkpoint();
      CHECK(leftovers(fx.ckpt_dir()).empty());
      CpuOps ops2;
      Trainer again(fx.config({"checkpoint.resume=auto"}), world, ops2);
      CHECK(again.steps_done() == 6);
      CHECK(same_bytes(full_state(again, ops2), full_state(r, ops)));
    }
  }
}

TEST_CASE("a corrupt checkpoint is reported by file; auto falls back, an explicit path is an error", "[ckpt]") {
  struct Damage {
    const char* name;
    std::function<void(const std::string& step_dir)> apply;
    std::string file, says;
  };
  const std::vector<Damage> damages = {
      {"a flipped byte in a tensor file", [](const std::string& d) { flip_byte(d + "/adam_v_r00000.bin", 1000); },
       "adam_v_r00000.bin", "checksum mismatch"},
      {"a truncated tensor file",
       [](const std::string& d) { fs::resize_file(d + "/master_r00000.bin", fs::file_size(d + "/master_r00000.bin") - 4); },
       "master_r00000.bin", "truncated"},
      {"a missing tensor file", [](const std::string& d) { fs::remove(d + "/adam_m_r00000.bin"); },
       "adam_m_r00000.bin", "missing"},
      {"a manifest that does not parse",
       [](const std::string& d) { std::ofstream(d + "/manifest.json") << "{\"format\": \"picotrain-checkpoint\""; },
       "manifest.json", "not valid JSON"},
  };
  for (const auto& damage : damages) {
    DYNAMIC_SECTION(damage.name) {
      CkptFixture fx("ckpt_corrupt");
      const World world;
      std::vector<float> at3;
      {
        CpuOps ops;
        Trainer t(fx.config(), world, ops);
        for (int i = 0; i < 3; i++) t.step();
        t.save_checkpoint();
        at3 = full_state(t, ops);
        for (int i = 0; i < 3; i++) t.step();
        t.save_checkpoint();
      }
      damage.apply(fx.step_dir(6));

      CpuOps ops;
      Trainer r(fx.config({"checkpoint.resume=auto"}), world, ops);
      CHECK(r.steps_done() == 3);
      CHECK(same_bytes(full_state(r, ops), at3));
      REQUIRE(r.checkpointer().warnings().size() == 1);
      const std::string& warning = r.checkpointer().warnings()[0];
      CHECK_THAT(warning, Contains(fx.step_dir(6) + "/" + damage.file) && Contains(damage.says) &&
                              Contains("falling back to " + fx.step_dir(3)));

      // Named explicitly, the same checkpoint is an error (exit 1), not a silent fallback.
      const RunConfig explicit_cfg = fx.config({"checkpoint.resume=" + fx.step_dir(6)});
      CHECK_THROWS_AS(Trainer(explicit_cfg, world, ops), ckpt::CorruptCheckpoint);
      CHECK_THROWS_WITH(Trainer(explicit_cfg, world, ops), Contains(damage.file) && Contains(damage.says));

      // With every checkpoint damaged, auto refuses rather than silently starting over.
      flip_byte(fx.step_dir(3) + "/master_r00000.bin", 8);
      CHECK_THROWS_WITH(Trainer(fx.config({"checkpoint.resume=auto"}), world, ops),
                        Contains("none of the 2 checkpoint(s)"));
    }
  }
}

TEST_CASE("a failed write names the path and the error; earlier checkpoints stay loadable", "[ckpt]") {
  CkptFixture fx("ckpt_write_fail");
  const World world;

  SECTION("checkpoint.dir below a regular file (what a read-only or missing mount looks like to root)") {
    const fs::path file = fx.dir / "not_a_dir";
    std::ofstream(file) << "x";
    CpuOps ops;
    Trainer t(fx.config({"checkpoint.dir=" + (file / "ckpt").string()}), world, ops);
    t.step();
    CHECK_THROWS_AS(t.save_checkpoint(), RuntimeError);
    CHECK_THROWS_WITH(t.save_checkpoint(), Contains((file / "ckpt").string()) && Contains("Not a directory"));
  }

  struct Failure {
    const char* name;
    const char* step;  // the durable step that fails
    int nth;           // on its nth call
    int err;
    std::string says;
  };
  int calls = 0;
  for (const Failure& f : {Failure{"disk full while writing a tensor file", "write", 2, ENOSPC, "No space left on device"},
                           Failure{"an I/O error on fsync", "fsync", 2, EIO, "Input/output error"},
                           Failure{"a read-only file system at the rename", "rename", 1, EROFS, "Read-only file system"}}) {
    DYNAMIC_SECTION(f.name) {
      CpuOps ops;
      Trainer t(fx.config(), world, ops);
      t.step();
      t.step();
      t.save_checkpoint();
      const std::vector<float> at2 = full_state(t, ops);
      t.step();
      calls = 0;
      {
        HookGuard hook([&](std::string_view s, const std::string&) { return s == f.step && ++calls == f.nth ? f.err : 0; });
        CHECK_THROWS_WITH(t.save_checkpoint(), Contains(fx.ckpt_dir() + "/") && Contains(f.says));
      }
      CHECK(leftovers(fx.ckpt_dir()).empty());  // the temporary directory was removed
      CHECK(read_text(fx.ckpt_dir() + "/latest") == "step_00000002\n");
      CHECK_FALSE(fs::exists(fx.step_dir(3)));
      CpuOps ops2;
      Trainer r(fx.config({"checkpoint.resume=auto"}), world, ops2);
      CHECK(r.steps_done() == 2);
      CHECK(same_bytes(full_state(r, ops2), at2));
    }
  }
}

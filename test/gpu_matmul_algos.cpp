// precision.matmul_algos on the GPU (cuda/matmul_algo_timing.cu): timing cuBLASLt's candidates
// leaves every product's output as the heuristic's run computes it (the candidates write scratch,
// so an accumulating dW is added to once), finds a choice for each product, and the chosen
// algorithms, given to a fresh CudaOps, compute the same bits there; an algorithm the library
// refuses falls back to the heuristic's. The trainer's part (agreement, the file, resume) is
// test_matmul_algos.cpp's, on the CPU.
//
// Runs only on a GPU machine: catch_main_gpu exits 77 (skipped) when no device is visible.
#include <catch2/catch.hpp>

#include <tuple>
#include <vector>

#include "core/cpu/cpu_ops.h"
#include "test/gpu_test_support.h"

using namespace pt;
using namespace pt::gputest;

namespace {

// One layer's products on `ops`: forward with bias, the fc layer with GELU, and backward into an
// accumulating dW and dbias; every output read back, in order.
std::vector<std::vector<float>> layer_products(Ops& ops, DType mode, int N, int IC, int OC) {
  Tensors g(ops);
  const size_t NI = size_t(N) * IC, NO = size_t(N) * OC, WI = size_t(OC) * IC;
  Tensor x = g.make(rounded(mode, random_normal(NI, 1.0f, 31)), mode);
  Tensor w = g.make(rounded(mode, random_normal(WI, 0.05f, 32)), mode);
  Tensor b = g.make(rounded(mode, random_normal(OC, 0.5f, 33)), mode);
  Tensor dout = g.make(rounded(mode, random_normal(NO, 1.0f, 34)), mode);
  Tensor out = g.zeros(NO, mode), pre = g.zeros(NO, mode), act = g.zeros(NO, mode);
  Tensor dx = g.zeros(NI, mode), dw = g.make(random_normal(WI, 1.0f, 35), DType::f32);
  Tensor db = g.make(random_normal(OC, 1.0f, 36), DType::f32);
  ops.matmul_forward(out, x, w, b, N, IC, OC);
  ops.matmul_gelu_forward(act, pre, x, w, b, N, IC, OC);
  ops.matmul_backward(dx, dw, db, dout, x, w, N, IC, OC);
  return {g.read(out), g.read(pre), g.read(act), g.read(dx), g.read(dw), g.read(db)};
}

const char* kOutputs[] = {"out", "pre", "gelu", "dinp", "dw (accumulated)", "dbias (accumulated)"};

}  // namespace

TEST_CASE("timed matmul algorithms: outputs untouched by the timing, choices that reproduce", "[gpu][matmul_algos]") {
  const DType mode = DType::bf16;
  for (auto [N, IC, OC] : {std::tuple{512, 768, 2304}, std::tuple{256, 3072, 768}, std::tuple{37, 771, 133}}) {
    INFO("N " << N << " IC " << IC << " OC " << OC);
    // The heuristic's run, and one that times every product as it goes (still running the
    // heuristic's choices): the same bits.
    const auto plain = layer_products(*make_cuda_ops(mode), mode, N, IC, OC);
    auto timing_ops = make_cuda_ops(mode);
    REQUIRE_FALSE(timing_ops->matmul_library().empty());
    timing_ops->time_matmul_algos();
    const auto while_timing = layer_products(*timing_ops, mode, N, IC, OC);
    for (size_t i = 0; i < plain.size(); i++) {
      INFO(kOutputs[i]);
      CHECK(bitwise_equal(while_timing[i], plain[i]));
    }
    const MatmulAlgos timed = timing_ops->timed_matmul_algos();
    CHECK(timed.library == timing_ops->matmul_library());
    CHECK(timed.chosen.size() >= 3);  // forward, fc + GELU, dinp, dW: at least the ones cuBLASLt takes
    CHECK(timed.chosen_us > 0);
    CHECK(timed.chosen_us <= timed.heuristic_us);
    WARN("timed " << timed.chosen.size() << " products, " << timed.differs << " chosen otherwise: "
                  << timed.heuristic_us << " -> " << timed.chosen_us << " us");

    // The chosen algorithms: on the ops that timed them and on a fresh one, the same bits, close
    // to the heuristic's (another algorithm may sum in another order).
    timing_ops->use_matmul_algos(timed);
    const auto chosen = layer_products(*timing_ops, mode, N, IC, OC);
    auto fresh = make_cuda_ops(mode);
    fresh->use_matmul_algos(timed);
    const auto again = layer_products(*fresh, mode, N, IC, OC);
    CHECK(fresh->timed_matmul_algos().chosen.empty());  // nothing timed: it was given every choice
    for (size_t i = 0; i < plain.size(); i++) {
      INFO(kOutputs[i]);
      CHECK(bitwise_equal(chosen[i], again[i]));
      expect_close(kOutputs[i], chosen[i], plain[i], tolerance(mode, mode));
    }

    // An empty list: the heuristic's choices again, also for the products that ran others.
    timing_ops->use_matmul_algos({timed.library, {}});
    const auto restored = layer_products(*timing_ops, mode, N, IC, OC);
    for (size_t i = 0; i < plain.size(); i++) {
      INFO(kOutputs[i]);
      CHECK(bitwise_equal(restored[i], plain[i]));
    }

    // Bytes that are no algorithm of the product's (all zeros): whatever cublasLtMatmulAlgoCheck
    // makes of them, the products still compute (a refused one runs the heuristic's, with a warning).
    MatmulAlgos broken = timed;
    for (auto& [product, algo] : broken.chosen) algo = std::string(algo.size(), '0');
    auto refused = make_cuda_ops(mode);
    refused->use_matmul_algos(broken);
    const auto fallback = layer_products(*refused, mode, N, IC, OC);
    for (size_t i = 0; i < plain.size(); i++) expect_close(kOutputs[i], fallback[i], plain[i], tolerance(mode, mode));
  }
}

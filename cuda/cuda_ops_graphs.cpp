// CudaOps::record: work recorded as a CUDA graph and replayed with one launch.
//
// Why: a training step issues hundreds of kernels per micro-batch (GPT-2 124M: about 25 per block
// forward and backward, and the head's chunks); launched one by one the host spends a few
// microseconds on each, and the GPU idles wherever the host falls behind (short kernels, the first
// kernels after a wait). A graph launch hands the GPU the whole recorded sequence at once.
//
// How: a stream capture of the compute stream in thread-local mode: the ops issued by `work`
// are recorded, not run, and any call of this thread that a capture cannot hold (a synchronising
// copy, cudaMalloc or cudaFree, a synchronize) fails, ending the recording with its error, which
// record() returns as `why` with nothing run. The side stream joins the capture where an op forks
// to it (run_beside: an event recorded on the capturing stream, waited on by the side stream,
// and the join back), so the graph keeps both branches. Replays launch on the compute stream,
// ordered after everything issued before them like any op.
//
// What a graph holds: every kernel's arguments as they were when recorded (pointers, sizes,
// scalars such as the loss gradient), and the scratch buffer's address, which CudaOps::scratch
// therefore never frees while a recording lives.
// Host code only, compiled by g++ against the CUDA runtime headers.
#include <string>

#include "cuda/cuda_common.h"
#include "cuda/cuda_ops.h"

namespace pt {

class CudaOps::Graph final : public RecordedWork {
 public:
  Graph(CudaOps& ops, cudaGraph_t graph, cudaGraphExec_t exec) : ops_(ops), graph_(graph), exec_(exec) {
    ops_.recordings_++;
  }
  ~Graph() override {
    // No throwing: a failed replay reports itself at the next synchronising call.
    cudaStreamSynchronize(as_stream(ops_.stream_));
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
    if (--ops_.recordings_ == 0) {
      for (void* p : ops_.retired_scratch_) cudaFree(p);
      ops_.retired_scratch_.clear();
    }
  }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  void replay() override { CUDA_CHECK(cudaGraphLaunch(exec_, as_stream(ops_.stream_))); }

 private:
  CudaOps& ops_;
  cudaGraph_t graph_;
  cudaGraphExec_t exec_;
};

std::unique_ptr<RecordedWork> CudaOps::record(const std::function<void()>& work, std::string* why) {
  auto fail = [&](const std::string& reason) -> std::unique_ptr<RecordedWork> {
    cudaGetLastError();  // capture errors are not sticky: clear them so later calls are not blamed
    if (why) *why = reason;
    return nullptr;
  };
  cudaStream_t s = as_stream(stream_);
  cudaError_t err = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  if (err != cudaSuccess) return fail(std::string("cudaStreamBeginCapture: ") + cudaGetErrorString(err));
  std::string failed;
  try {
    work();
  } catch (const std::exception& e) {
    failed = e.what();
  }
  cudaGraph_t graph = nullptr;
  err = cudaStreamEndCapture(s, &graph);
  if (!failed.empty() || err != cudaSuccess || !graph) {
    if (graph) cudaGraphDestroy(graph);
    return fail(!failed.empty() ? failed : std::string("cudaStreamEndCapture: ") + cudaGetErrorString(err));
  }
  cudaGraphExec_t exec = nullptr;
  err = cudaGraphInstantiate(&exec, graph, 0);
  if (err != cudaSuccess) {
    cudaGraphDestroy(graph);
    return fail(std::string("cudaGraphInstantiate: ") + cudaGetErrorString(err));
  }
  return std::make_unique<Graph>(*this, graph, exec);
}

}  // namespace pt

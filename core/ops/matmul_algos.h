// Timed matmul algorithms (precision.matmul_algos = "timed" or a file): which cuBLASLt algorithm
// each product of a run uses, when it is not the heuristic's first choice.
//
// cuBLASLt's heuristic ranks its algorithms for a problem without running them; its first choice
// is usually, not always, the fastest. Timing its top candidates once per product finds the
// fastest on the machine at hand, but a timing can tip either way from one run to the next, and
// two algorithms may sum a dot product in different orders: the choice decides the last bits of
// the results. So the choice is made once, in the session's first step (which runs the heuristic's
// choices while the candidates are timed beside them), agreed by every rank (a product that two
// ranks both run, such as a replicated router under tp, gets one algorithm: the lowest such rank's),
// and written to <out_dir>/matmul_algos.json. A resumed session, or a run given that file, uses
// the same choices from its first step: the same bits as the run that made them.
//
// A choice holds only for the library and GPU that made it (`library`); elsewhere it is dropped.
// The header is plain data (the CUDA library fills it); JSON and the agreement are in the .cpp.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace pt {

struct MatmulAlgos {
  // The cuBLASLt version and GPU the choices were timed on, e.g. "cuBLASLt 130000, NVIDIA H200,
  // sm_90, 132 SMs"; "" for a backend without algorithms to choose (the CPU).
  std::string library;
  // product -> algorithm, for every product timed. The product key names the problem (transposes,
  // m, n, k, dtypes, leading dimensions, pointer alignments, epilogue, beta); the algorithm is
  // cublasLtMatmulAlgo_t's 64 bytes in hex.
  std::map<std::string, std::string> chosen;
  // What the timing found (the log's line; summed over the products, one call each): how many
  // choices differ from the heuristic's first, and the time of the heuristic's first and of the
  // chosen algorithms, in microseconds.
  int differs = 0;
  double heuristic_us = 0, chosen_us = 0;
};

// The file's text (JSON) and back; from_json throws ConfigError naming `where` on a malformed file.
std::string matmul_algos_json(const MatmulAlgos& a);
MatmulAlgos matmul_algos_from_json(const std::string& text, const std::string& where);

// Every rank's timed choices, in world rank order, agreed: each product timed by a rank of
// ranks[0]'s library gets the choice of the lowest such rank; ranks of another library contribute
// nothing. The result is the same on every rank, and what the run's file holds. Its counts are
// ranks[0]'s.
MatmulAlgos agree_matmul_algos(const std::vector<MatmulAlgos>& ranks);

}  // namespace pt

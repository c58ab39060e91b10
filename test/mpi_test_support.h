// Helpers shared by the multi-rank tests (test/mpi_*.cpp, run under mpirun).
#pragma once
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "core/data/shard.h"
#include "core/dist/world.h"

namespace pt::test {

inline World whole_world() {
  World w;
  MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &w.size);
  return w;
}

// The ranks 0..n-1.
inline std::vector<int> everyone(int n) {
  std::vector<int> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// Random-token shards (p_train_000000.bin and p_val_000000.bin, the val shard a prefix of the
// train tokens) in a directory every rank sees: rank 0 writes them, then tells the others where
// (the broadcast also orders the writes before anyone reads).
struct SharedShards {
  std::filesystem::path dir;
  int rank = whole_world().rank;
  SharedShards(const std::string& name, uint32_t seed, size_t train_tokens, size_t val_tokens, int vocab) {
    char path[512] = {};
    if (rank == 0) {
      const std::filesystem::path d =
          std::filesystem::temp_directory_path() / ("picotrain_" + name + "_" + std::to_string(::getpid()));
      std::filesystem::create_directories(d);
      std::mt19937 rng(seed);
      std::vector<uint16_t> tokens(train_tokens);
      for (auto& t : tokens) t = static_cast<uint16_t>(rng() % vocab);
      write_shard((d / "p_train_000000.bin").string(), tokens);
      write_shard((d / "p_val_000000.bin").string(), std::span(tokens).subspan(0, val_tokens));
      std::snprintf(path, sizeof path, "%s", d.c_str());
    }
    MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
    dir = path;
  }
  // Held in a function-local static, so this runs after main() (MPI is finalized by then): every
  // rank passed main's final all-reduce, so nobody reads the files any more.
  ~SharedShards() {
    if (rank == 0) std::filesystem::remove_all(dir);
  }
};

}  // namespace pt::test

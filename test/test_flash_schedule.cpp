// The flash kernels' tile schedule (core/common/flash_schedule.h), proved on the CPU against a
// brute-force walk of which (query, key) pairs are visible: the kernels run these very functions,
// and no GPU is needed to know that they visit every visible pair, that the backward's dQ turn
// chain names exactly the key blocks that add into a query tile, and that a KV cache's key split
// covers its keys. The kernels' tiles: forward 128 queries x 64 keys, backward 128 x 128 (sm_80)
// and 64 x 128 (Hopper; 64 x 64 at head size 256).
#include <catch2/catch.hpp>
#include <algorithm>
#include <random>
#include <vector>

#include "core/common/flash_schedule.h"

using namespace pt::flash_schedule;

namespace {

// Whether some query of [q_begin, q_end) sees some key of [k_begin, k_end).
bool any_visible(int q_begin, int q_end, int k_begin, int k_end, int Tq, int Tk, int delta) {
  for (int i = q_begin; i < std::min(q_end, Tq); ++i)
    for (int j = k_begin; j < std::min(k_end, Tk); ++j)
      if (j <= i + delta) return true;
  return false;
}

struct Problem {
  int Tq, Tk, delta;
};

// Random problems, plus the edges: causal self-attention, ring attention's blocks, decoding.
std::vector<Problem> problems(bool negative_delta) {
  std::vector<Problem> out = {{1, 1, 0},      {128, 128, 0},  {129, 129, 0},  {300, 300, 0},  {200, 200, 200},
                              {1, 8192, 8191}, {3, 700, 697}, {10, 300, 0},   {150, 300, 100}, {300, 257, 257}};
  if (negative_delta) out.insert(out.end(), {{40, 70, -30}, {9, 13, -9}, {2, 2000, -100}});
  std::mt19937 rng(7);
  for (int n = 0; n < 300; ++n) {
    const int Tq = 1 + static_cast<int>(rng() % 400), Tk = 1 + static_cast<int>(rng() % 500);
    const int lo = negative_delta ? -Tq : 0;
    out.push_back({Tq, Tk, lo + static_cast<int>(rng() % (Tk - lo + 1))});
  }
  return out;
}

}  // namespace

TEST_CASE("the forward visits exactly the key tiles its query tile sees", "[flash]") {
  constexpr int BM = 128, BN = 64;
  for (const Problem& p : problems(true)) {
    for (int q0 = 0; q0 < p.Tq; q0 += BM) {
      INFO("Tq " << p.Tq << " Tk " << p.Tk << " delta " << p.delta << " q0 " << q0);
      const int n = forward_key_tiles(q0, BM, p.Tq, p.Tk, p.delta, BN);
      const int tiles = (p.Tk + BN - 1) / BN;
      CHECK(n <= tiles);
      // Every tile it visits holds a key some row sees ... (the last one, so all before it too)
      if (n > 0) CHECK(any_visible(q0, q0 + BM, (n - 1) * BN, n * BN, p.Tq, p.Tk, p.delta));
      // ... and none after them does.
      CHECK_FALSE(any_visible(q0, q0 + BM, std::max(n, 0) * BN, p.Tk, p.Tq, p.Tk, p.delta));
    }
  }
}

// The backward's tiles: BM queries x BN keys (the sm_80 kernel 128 x 128, the Hopper kernel 64 x
// 128, whose key block kt starts at query tile 2 kt, and 64 x 64 at head size 256).
static void check_dq_order(int BM, int BN) {
  for (const Problem& p : problems(false)) {
    const int nq = (p.Tq + BM - 1) / BM, nk = (p.Tk + BN - 1) / BN;
    for (int qt = 0; qt < nq; ++qt) {
      INFO("tiles " << BM << " x " << BN << " Tq " << p.Tq << " Tk " << p.Tk << " delta " << p.delta << " query tile "
                    << qt);
      const int last = last_key_tile(qt, p.delta, nk, BN, BM);
      // The chain is last, ..., 0: key block 0 (every query sees key 0) ends every chain.
      REQUIRE(last >= 0);
      for (int kt = 0; kt < nk; ++kt) {
        const bool meets = first_query_tile(kt, p.delta, BN, BM) <= qt;
        CHECK(meets == (kt <= last));  // the two functions agree
        // A key block with a visible pair in this tile is in the chain (nothing is left out).
        if (any_visible(qt * BM, qt * BM + BM, kt * BN, kt * BN + BN, p.Tq, p.Tk, p.delta)) CHECK(meets);
      }
    }
    // Causal self-attention: the query tile holding the key block's first key, as the packed
    // kernels start there.
    if (p.delta == 0 && p.Tq == p.Tk)
      for (int kt = 0; kt < nk; ++kt) CHECK(first_query_tile(kt, 0, BN, BM) == kt * BN / BM);
  }
}

TEST_CASE("the backward's dQ order names exactly the key blocks that meet a query tile", "[flash]") {
  check_dq_order(128, 128);  // the sm_80 kernel
  check_dq_order(64, 128);   // the Hopper kernel
  check_dq_order(64, 64);    // the Hopper kernel at head size 256
}

TEST_CASE("a KV cache's keys split into whole tiles that cover them", "[flash]") {
  constexpr int BN = 64, kMin = 256, kMax = 64, kSms = 132;
  // Enough blocks already: no split.
  CHECK(key_split(132, 8192, kSms, BN, kMin, kMax).count == 1);
  CHECK(key_split(1000, 8192, kSms, BN, kMin, kMax).len == 8192);
  // Too few keys to split.
  CHECK(key_split(4, 300, kSms, BN, kMin, kMax).count == 1);
  // Decoding GPT-2 124M (12 heads) on an 8k cache: about two blocks an SM.
  const KeySplit d = key_split(12, 8192, kSms, BN, kMin, kMax);
  CHECK(d.count * 12 >= kSms);
  CHECK(d.count <= kMax);
  for (long long blocks : {1LL, 2LL, 4LL, 12LL, 32LL, 131LL})
    for (int Tk : {1, 255, 256, 511, 512, 2000, 2048, 5000, 8192, 100000}) {
      const KeySplit s = key_split(blocks, Tk, kSms, BN, kMin, kMax);
      INFO("blocks " << blocks << " Tk " << Tk << ": " << s.count << " x " << s.len);
      CHECK(s.count >= 1);
      CHECK(s.count <= kMax);
      if (s.count == 1) {
        CHECK(s.len == Tk);
        continue;
      }
      CHECK(s.len % BN == 0);
      CHECK(s.len >= kMin);                    // no range under the minimum
      CHECK((s.count - 1) * s.len < Tk);      // the last range holds a key
      CHECK(s.count * s.len >= Tk);           // together they hold every key
      CHECK(s.count <= (2 * kSms + blocks - 1) / blocks);
    }
}

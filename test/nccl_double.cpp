// The NCCL double of nccl_double.h: communicators shared by rank threads, collectives that meet
// in "rounds" (every rank's call and a copy of its input), point-to-point mailboxes, and the
// function table that nccl::install_for_testing puts in place of the loaded library.
#include "nccl_double.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <type_traits>

#include "core/common/error.h"
#include "nccl_fake_cuda.h"

namespace pt::test {

using namespace pt::nccl;

namespace {

// NCCL's enum values (nccl.h), beyond the few nccl_api.h names: a caller that passes the wrong
// one gets what NCCL would do with it, not an error.
enum Type { kInt8, kUint8, kInt32, kUint32, kInt64, kUint64, kFloat16, kFloat32, kFloat64, kBfloat16 };
enum Op { kSum, kProd, kMax, kMin, kAvg };

size_t type_size(int type) {
  switch (type) {
    case kInt8: case kUint8: return 1;
    case kFloat16: case kBfloat16: return 2;
    case kInt32: case kUint32: case kFloat32: return 4;
    case kInt64: case kUint64: case kFloat64: return 8;
  }
  return 0;  // not an NCCL type
}

enum class Kind { AllReduce, ReduceScatter, AllGather, Broadcast, Split, HostBroadcast };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::AllReduce: return "ncclAllReduce";
    case Kind::ReduceScatter: return "ncclReduceScatter";
    case Kind::AllGather: return "ncclAllGather";
    case Kind::Broadcast: return "ncclBroadcast";
    case Kind::Split: return "ncclCommSplit";
    case Kind::HostBroadcast: return "the host world's broadcast";
  }
  return "?";
}

// One rank's part in a collective: what it asked for and a copy of its input.
struct Call {
  Call() = default;
  Call(Kind k, size_t c, int t, int o, int r) : kind(k), count(c), type(t), op(o), root(r) {}
  Kind kind = Kind::AllReduce;
  size_t count = 0;
  int type = 0, op = 0, root = 0;  // root: also the split color
  int key = 0;                     // the split key
  std::vector<char> input;
  std::string describe() const {
    return std::string(kind_name(kind)) + "(count " + std::to_string(count) + ", type " + std::to_string(type) +
           ", op " + std::to_string(op) + ", root/color " + std::to_string(root) + ")";
  }
  bool matches(const Call& o) const {
    // Split colors and keys differ between ranks by design.
    if (kind == Kind::Split) return o.kind == kind;
    return kind == o.kind && count == o.count && type == o.type && op == o.op && root == o.root;
  }
};

struct Group;

// One collective on one communicator: complete when every rank has arrived.
struct Round {
  explicit Round(int size) : calls(size) {}
  std::vector<Call> calls;
  int arrived = 0;
  std::map<int, std::shared_ptr<Group>> children;  // a split's new communicators, by color
};

struct Message {
  int type = 0;
  size_t count = 0;
  std::vector<char> data;
  bool taken = false;
};

// A communicator, shared by its ranks.
struct Group {
  explicit Group(int n) : size(n), round(std::make_shared<Round>(n)), joined(n, false) {}
  int size;
  std::shared_ptr<Round> round;                                        // the collective being met
  std::map<std::pair<int, int>, std::deque<std::shared_ptr<Message>>> mail;  // (from, to) -> sends
  std::vector<bool> joined;                                           // ncclCommInitRank
};

// A send or receive queued between ncclGroupStart and ncclGroupEnd.
struct P2p {
  bool send = false;
  ncclComm_t comm = nullptr;
  void* buf = nullptr;
  size_t count = 0;
  int type = 0, peer = 0;
};

// The rank thread's own state: its turn (the world lock, held while it runs) and its group.
struct RankThread {
  std::unique_lock<std::mutex>* turn = nullptr;
  int rank = -1;  // the thread's world rank, for messages
  int group_depth = 0;
  std::vector<P2p> grouped;
};
thread_local RankThread self;

}  // namespace

}  // namespace pt::test

// NCCL's opaque communicator, defined by the double: a rank's handle on a shared Group.
struct pt::nccl::ncclComm {
  std::shared_ptr<pt::test::Group> group;
  int rank = 0;
};

namespace pt::test {

struct NcclDouble::World {
  std::chrono::milliseconds patience;
  std::mutex mutex;  // the turn: held by the rank thread that runs
  std::condition_variable changed;
  bool broken = false;  // a rank failed or gave up: the others stop waiting
  std::vector<std::string> errors;
  std::set<ncclComm_t> live;
  ncclResult_t async_state = ncclSuccess;
  int next_id = 0;
  std::map<std::string, std::shared_ptr<Group>> initializing;  // unique id -> communicator
  Api api;
};

namespace {

NcclDouble::World* current = nullptr;  // the installed double (the table's functions have no context)

// Records why a call is refused and returns the NCCL error for it.
ncclResult_t refuse(ncclResult_t rc, const std::string& why) {
  current->errors.push_back("rank " + std::to_string(self.rank) + ": " + why);
  return rc;
}

// Lets the other ranks run until done() or the world breaks; false (recorded, and breaking the
// world, so that no rank waits on one that gave up) after the double's patience.
template <class Done>
bool wait_until(Done done, const std::string& what) {
  NcclDouble::World& w = *current;
  const auto deadline = std::chrono::steady_clock::now() + w.patience;
  if (w.changed.wait_until(*self.turn, deadline, [&] { return w.broken || done(); }) && !w.broken) return true;
  if (!w.broken)
    refuse(ncclInternalError, "gave up after " + std::to_string(w.patience.count()) + " ms waiting for " + what);
  w.broken = true;
  w.changed.notify_all();
  return false;
}

// Every entry point starts here: a call from outside NcclDouble::run has no turn to wait with.
bool in_run() { return current && self.turn; }

bool live(ncclComm_t comm) { return comm && current->live.count(comm); }

// The usual argument checks of a call on `comm`; "" when they pass.
std::string bad_arguments(ncclComm_t comm, cudaStream_t stream, int type) {
  if (!live(comm)) return "not a live communicator";
  if (!fake_cuda::is_stream(stream)) return "not a stream of the fake CUDA runtime";
  if (type_size(type) == 0) return "data type " + std::to_string(type) + " is not an NCCL type";
  if (self.group_depth > 0) return "a collective inside ncclGroupStart/End (not modelled)";
  return "";
}

// `bytes` of device memory at p: a host pointer, or a buffer shorter than count x dtype, is refused.
bool device_buffer(const void* p, size_t bytes) { return bytes == 0 || fake_cuda::is_device(p, bytes); }

std::vector<char> copy_of(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  return std::vector<char>(c, c + bytes);
}

// Posts this rank's call on its communicator and waits for the others'; the completed round
// (every rank's call and input), or nullptr when they never all came or did not agree.
std::shared_ptr<Round> meet(Group& g, int rank, Call call) {
  std::shared_ptr<Round> round = g.round;
  const std::string what = call.describe();
  round->calls[rank] = std::move(call);
  if (++round->arrived == g.size) {
    g.round = std::make_shared<Round>(g.size);  // the next collective meets in a fresh round
    current->changed.notify_all();
  } else if (!wait_until([&] { return round->arrived == g.size; }, "the other ranks to join " + what)) {
    return nullptr;
  }
  for (int r = 0; r < g.size; r++)
    if (!round->calls[r].matches(round->calls[0])) {
      refuse(ncclInvalidUsage, "ranks disagree: rank 0 called " + round->calls[0].describe() + ", rank " +
                                   std::to_string(r) + " " + round->calls[r].describe());
      return nullptr;
    }
  return round;
}

// ---- reductions ----------------------------------------------------------------------------------

float bf16_to_float(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t float_to_bf16(float f) {  // round to nearest even; NaN stays NaN
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// Element i of `src` as the type's arithmetic type (bf16 computes in float).
template <class T>
auto load(const char* src, size_t i) {
  T v;
  std::memcpy(&v, src + i * sizeof(T), sizeof(T));
  if constexpr (std::is_same_v<T, uint16_t>) return bf16_to_float(v);
  else return v;
}
template <class T, class A>
void store(char* dst, size_t i, A v) {
  T t;
  if constexpr (std::is_same_v<T, uint16_t>) t = float_to_bf16(v);
  else t = v;
  std::memcpy(dst + i * sizeof(T), &t, sizeof(T));
}

template <class A>
A combine(int op, A a, A b) {
  if (op == kMax) return a < b ? b : a;
  if (op == kMin) return a < b ? a : b;
  if constexpr (std::is_integral_v<A>) {  // sums and products wrap, as on the GPU, instead of overflowing
    using U = std::make_unsigned_t<A>;
    return A(op == kProd ? U(U(a) * U(b)) : U(U(a) + U(b)));
  } else {
    return op == kProd ? a * b : a + b;  // kSum, kAvg (divided at the end)
  }
}

// out[i] = op over the ranks, in rank order, of element `offset + i` of every input.
template <class T>
void reduce_as(int op, const std::vector<const Call*>& in, size_t offset, size_t count, char* out) {
  for (size_t i = 0; i < count; i++) {
    auto acc = load<T>(in[0]->input.data(), offset + i);
    for (size_t r = 1; r < in.size(); r++) acc = combine(op, acc, load<T>(in[r]->input.data(), offset + i));
    if (op == kAvg) acc = acc / decltype(acc)(in.size());
    store<T>(out, i, acc);
  }
}

ncclResult_t reduce(int type, int op, const std::vector<const Call*>& in, size_t offset, size_t count, char* out) {
  if (op < kSum || op > kAvg)
    return refuse(ncclInvalidArgument, "reduction op " + std::to_string(op) + " is not NCCL's");
  switch (type) {
    case kInt8: reduce_as<int8_t>(op, in, offset, count, out); break;
    case kUint8: reduce_as<uint8_t>(op, in, offset, count, out); break;
    case kInt32: reduce_as<int32_t>(op, in, offset, count, out); break;
    case kUint32: reduce_as<uint32_t>(op, in, offset, count, out); break;
    case kInt64: reduce_as<int64_t>(op, in, offset, count, out); break;
    case kUint64: reduce_as<uint64_t>(op, in, offset, count, out); break;
    case kFloat32: reduce_as<float>(op, in, offset, count, out); break;
    case kFloat64: reduce_as<double>(op, in, offset, count, out); break;
    case kBfloat16: reduce_as<uint16_t>(op, in, offset, count, out); break;
    default: return refuse(ncclInvalidArgument, "the double does not reduce float16");
  }
  return ncclSuccess;
}

std::vector<const Call*> calls_of(const Round& round) {
  std::vector<const Call*> in;
  for (const Call& c : round.calls) in.push_back(&c);
  return in;
}

// ---- the table's functions -------------------------------------------------------------------------

const char* get_error_string(ncclResult_t rc) {
  switch (rc) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
  }
  return "unknown result code";
}

ncclResult_t get_version(int* version) {
  *version = 22105;  // reports itself as 2.21.5
  return ncclSuccess;
}

ncclResult_t get_unique_id(ncclUniqueId* id) {
  if (!in_run()) return ncclInvalidUsage;
  *id = ncclUniqueId{};
  const std::string name = "nccl double communicator " + std::to_string(current->next_id++);
  std::memcpy(id->internal, name.data(), name.size());
  return ncclSuccess;
}

ncclResult_t comm_init_rank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (!in_run()) return ncclInvalidUsage;
  NcclDouble::World& w = *current;
  const std::string key(id.internal, kUniqueIdBytes);
  std::shared_ptr<Group>& slot = w.initializing[key];
  if (!slot) slot = std::make_shared<Group>(nranks);
  const std::shared_ptr<Group> g = slot;
  if (g->size != nranks || rank < 0 || rank >= nranks || g->joined[rank])
    return refuse(ncclInvalidArgument, "ncclCommInitRank(nranks " + std::to_string(nranks) + ", rank " +
                                           std::to_string(rank) + ") does not fit the communicator's other ranks");
  g->joined[rank] = true;
  w.changed.notify_all();
  // NCCL's init blocks until every rank has joined with the same id.
  auto all_joined = [&] {
    for (bool j : g->joined)
      if (!j) return false;
    return true;
  };
  if (!wait_until(all_joined, "every rank's ncclCommInitRank")) return ncclInternalError;
  w.initializing.erase(key);  // the first rank back retires the id; the others hold g
  *comm = new ncclComm{g, rank};
  w.live.insert(*comm);
  return ncclSuccess;
}

ncclResult_t comm_split(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, void* config) {
  if (!in_run()) return ncclInvalidUsage;
  *newcomm = nullptr;
  if (!live(comm)) return refuse(ncclInvalidArgument, "ncclCommSplit: not a live communicator");
  if (config) return refuse(ncclInvalidArgument, "ncclCommSplit: the double takes no config");
  if (color < 0 && color != kSplitNoColor) return refuse(ncclInvalidArgument, "ncclCommSplit: negative color");
  Call call;
  call.kind = Kind::Split;
  call.root = color;
  call.key = key;
  const std::shared_ptr<Round> round = meet(*comm->group, comm->rank, std::move(call));
  if (!round) return ncclInvalidUsage;
  if (color == kSplitNoColor) return ncclSuccess;
  // Members of this color, ordered by key, then by rank in the parent (NCCL's rule).
  std::vector<std::pair<int, int>> order;
  for (int r = 0; r < comm->group->size; r++)
    if (round->calls[r].root == color) order.emplace_back(round->calls[r].key, r);
  std::sort(order.begin(), order.end());
  const int new_rank = int(std::find(order.begin(), order.end(), std::make_pair(key, comm->rank)) - order.begin());
  std::shared_ptr<Group>& child = round->children[color];
  if (!child) {
    child = std::make_shared<Group>(int(order.size()));
    child->joined.assign(order.size(), true);
  }
  *newcomm = new ncclComm{child, new_rank};
  current->live.insert(*newcomm);
  return ncclSuccess;
}

ncclResult_t comm_destroy(ncclComm_t comm) {
  if (!in_run()) return ncclInvalidUsage;
  if (current->live.erase(comm) == 0) return refuse(ncclInvalidArgument, "destroying a communicator that is not live");
  delete comm;
  return ncclSuccess;
}

ncclResult_t comm_get_async_error(ncclComm_t comm, ncclResult_t* state) {
  if (!in_run()) return ncclInvalidUsage;
  if (!live(comm)) return refuse(ncclInvalidArgument, "ncclCommGetAsyncError: not a live communicator");
  *state = current->async_state;
  return ncclSuccess;
}

// The checks every collective makes, then its meeting: the completed round, or nullptr (with
// `rc` set) when the call is refused.
std::shared_ptr<Round> collective(Call call, const void* send, size_t send_bytes, void* recv, size_t recv_bytes,
                                  ncclComm_t comm, cudaStream_t stream, ncclResult_t& rc) {
  const std::string what = call.describe();
  rc = ncclInvalidArgument;
  auto refused = [&](const std::string& why) {
    refuse(rc, what + ": " + why);
    return nullptr;
  };
  const std::string bad = bad_arguments(comm, stream, call.type);
  if (!bad.empty()) return refused(bad);
  if (call.root < 0 || call.root >= comm->group->size)
    return refused("root out of range for " + std::to_string(comm->group->size) + " ranks");
  if (!device_buffer(send, send_bytes) || !device_buffer(recv, recv_bytes))
    return refused("a buffer is not " + std::to_string(send_bytes) + " (send) / " + std::to_string(recv_bytes) +
                   " (recv) bytes of device memory");
  if (send) call.input = copy_of(send, send_bytes);
  const std::shared_ptr<Round> round = meet(*comm->group, comm->rank, std::move(call));
  rc = round ? ncclSuccess : ncclInvalidUsage;
  return round;
}

ncclResult_t all_reduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                        ncclComm_t comm, cudaStream_t stream) {
  if (!in_run()) return ncclInvalidUsage;
  const size_t bytes = count * type_size(type);
  ncclResult_t rc;
  const auto round = collective(Call{Kind::AllReduce, count, type, op, 0}, send, bytes, recv, bytes, comm, stream, rc);
  if (!round) return rc;
  return reduce(type, op, calls_of(*round), 0, count, static_cast<char*>(recv));
}

ncclResult_t reduce_scatter(const void* send, void* recv, size_t recvcount, ncclDataType_t type, ncclRedOp_t op,
                            ncclComm_t comm, cudaStream_t stream) {
  if (!in_run()) return ncclInvalidUsage;
  const size_t block = recvcount * type_size(type);
  const size_t n = live(comm) ? comm->group->size : 1;
  ncclResult_t rc;
  const auto round =
      collective(Call{Kind::ReduceScatter, recvcount, type, op, 0}, send, block * n, recv, block, comm, stream, rc);
  if (!round) return rc;
  return reduce(type, op, calls_of(*round), recvcount * comm->rank, recvcount, static_cast<char*>(recv));
}

ncclResult_t all_gather(const void* send, void* recv, size_t sendcount, ncclDataType_t type, ncclComm_t comm,
                        cudaStream_t stream) {
  if (!in_run()) return ncclInvalidUsage;
  const size_t block = sendcount * type_size(type);
  const size_t n = live(comm) ? comm->group->size : 1;
  ncclResult_t rc;
  const auto round =
      collective(Call{Kind::AllGather, sendcount, type, 0, 0}, send, block, recv, block * n, comm, stream, rc);
  if (!round) return rc;
  for (size_t r = 0; r < n; r++) std::memcpy(static_cast<char*>(recv) + r * block, round->calls[r].input.data(), block);
  return ncclSuccess;
}

ncclResult_t broadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                       cudaStream_t stream) {
  if (!in_run()) return ncclInvalidUsage;
  const size_t bytes = count * type_size(type);
  // Only the root's send buffer is read (NCCL ignores the others').
  const bool is_root = live(comm) && comm->rank == root;
  ncclResult_t rc;
  const auto round = collective(Call{Kind::Broadcast, count, type, 0, root}, is_root ? send : nullptr,
                                is_root ? bytes : 0, recv, bytes, comm, stream, rc);
  if (!round) return rc;
  if (bytes) std::memcpy(recv, round->calls[root].input.data(), bytes);
  return ncclSuccess;
}

// ---- point to point ----------------------------------------------------------------------------------

std::string p2p_bad_arguments(const char* what, const void* buf, size_t count, int type, int peer, ncclComm_t comm,
                              cudaStream_t stream) {
  if (!live(comm)) return std::string(what) + ": not a live communicator";
  if (!fake_cuda::is_stream(stream)) return std::string(what) + ": not a stream of the fake CUDA runtime";
  if (type_size(type) == 0) return std::string(what) + ": data type " + std::to_string(type) + " is not an NCCL type";
  if (peer < 0 || peer >= comm->group->size)
    return std::string(what) + ": peer " + std::to_string(peer) + " out of range";
  if (!device_buffer(buf, count * type_size(type)))
    return std::string(what) + ": the buffer is not " + std::to_string(count) + " elements of device memory";
  return "";
}

std::shared_ptr<Message> post(const P2p& s) {
  auto m = std::make_shared<Message>();
  m->type = s.type;
  m->count = s.count;
  m->data = copy_of(s.buf, s.count * type_size(s.type));
  s.comm->group->mail[{s.comm->rank, s.peer}].push_back(m);
  current->changed.notify_all();
  return m;
}

ncclResult_t take(const P2p& r) {
  auto& box = r.comm->group->mail[{r.peer, r.comm->rank}];
  const std::string what = "ncclRecv from rank " + std::to_string(r.peer) + " on rank " + std::to_string(r.comm->rank);
  if (!wait_until([&] { return !box.empty(); }, "a send for " + what)) return ncclInternalError;
  const std::shared_ptr<Message> m = box.front();
  box.pop_front();
  m->taken = true;
  current->changed.notify_all();
  if (m->type != r.type || m->count != r.count)
    return refuse(ncclInvalidUsage, what + " posted " + std::to_string(r.count) + " of type " + std::to_string(r.type) +
                                        ", the send " + std::to_string(m->count) + " of type " +
                                        std::to_string(m->type));
  std::memcpy(r.buf, m->data.data(), m->data.size());
  return ncclSuccess;
}

ncclResult_t point_to_point(P2p op, cudaStream_t stream) {
  if (!in_run()) return ncclInvalidUsage;
  const char* what = op.send ? "ncclSend" : "ncclRecv";
  const std::string bad = p2p_bad_arguments(what, op.buf, op.count, op.type, op.peer, op.comm, stream);
  if (!bad.empty()) return refuse(ncclInvalidArgument, bad);
  if (self.group_depth > 0) {
    self.grouped.push_back(op);
    return ncclSuccess;
  }
  if (!op.send) return take(op);
  // Outside a group a send completes only when its receive takes it, as NCCL's kernel does.
  const std::shared_ptr<Message> m = post(op);
  const std::string waiting = "rank " + std::to_string(op.peer) + " to receive an ncclSend outside a group";
  return wait_until([&] { return m->taken; }, waiting) ? ncclSuccess : ncclInternalError;
}

ncclResult_t send(const void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream) {
  return point_to_point(P2p{true, comm, const_cast<void*>(buf), count, type, peer}, stream);
}

ncclResult_t recv(void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream) {
  return point_to_point(P2p{false, comm, buf, count, type, peer}, stream);
}

ncclResult_t group_start() {
  if (!in_run()) return ncclInvalidUsage;
  self.group_depth++;
  return ncclSuccess;
}

// The outermost ncclGroupEnd runs the group: every send is posted first, so no receive of the
// group waits on a send queued after it.
ncclResult_t group_end() {
  if (!in_run()) return ncclInvalidUsage;
  if (self.group_depth == 0) return refuse(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--self.group_depth > 0) return ncclSuccess;
  std::vector<P2p> ops;
  ops.swap(self.grouped);
  for (const P2p& op : ops)
    if (op.send) post(op);
  for (const P2p& op : ops)
    if (!op.send)
      if (const ncclResult_t rc = take(op); rc != ncclSuccess) return rc;
  return ncclSuccess;
}

// ---- the host world: NcclComm::make_world's bootstrap Comm ----------------------------------------

class HostWorld final : public Comm {
 public:
  HostWorld(std::shared_ptr<Group> group, int rank) : group_(std::move(group)), rank_(rank) {
    for (int r = 0; r < group_->size; r++) members_.push_back(r);
  }
  int rank() const override { return rank_; }
  int size() const override { return group_->size; }
  const std::vector<int>& members() const override { return members_; }
  void broadcast(Tensor x, int root) override {
    Call call{Kind::HostBroadcast, x.bytes(), 0, 0, root};
    if (rank_ == root) call.input = copy_of(x.data, x.bytes());
    const std::shared_ptr<Round> round = meet(*group_, rank_, std::move(call));
    check(round != nullptr, "NcclDouble: the host world's broadcast failed");
    std::memcpy(x.data, round->calls[root].input.data(), x.bytes());
  }
  void all_reduce(Tensor) override { unused(); }
  void all_reduce(double*, size_t) override { unused(); }
  void reduce_scatter(Tensor, Tensor) override { unused(); }
  void all_gather(Tensor, Tensor) override { unused(); }
  void all_to_all(Tensor, Tensor) override { unused(); }
  void send(Tensor, int) override { unused(); }
  void recv(Tensor, int) override { unused(); }
  void barrier() override { unused(); }

 private:
  [[noreturn]] static void unused() {
    throw RuntimeError("NcclDouble's host world carries only broadcast (NcclComm::make_world's unique id)");
  }
  std::shared_ptr<Group> group_;
  int rank_;
  std::vector<int> members_;
};

}  // namespace

// ---- NcclDouble ------------------------------------------------------------------------------------

NcclDouble::NcclDouble(std::chrono::milliseconds patience) : world_(std::make_unique<World>()) {
  check(current == nullptr, "NcclDouble: one at a time");
  world_->patience = patience;
  Api& a = world_->api;
  a.path = "the in-process NCCL double (test/nccl_double.cpp)";
  get_version(&a.version);
  a.GetErrorString = get_error_string;
  a.GetVersion = get_version;
  a.GetUniqueId = get_unique_id;
  a.CommInitRank = comm_init_rank;
  a.CommSplit = comm_split;
  a.CommDestroy = comm_destroy;
  a.CommAbort = comm_destroy;
  a.CommGetAsyncError = comm_get_async_error;
  a.AllReduce = all_reduce;
  a.ReduceScatter = reduce_scatter;
  a.AllGather = all_gather;
  a.Broadcast = broadcast;
  a.Send = send;
  a.Recv = recv;
  a.GroupStart = group_start;
  a.GroupEnd = group_end;
  current = world_.get();
  install_for_testing(&world_->api);
}

NcclDouble::~NcclDouble() {
  install_for_testing(nullptr);
  current = nullptr;
}

void NcclDouble::run(int ranks, const std::function<void(int rank, Comm& host_world)>& body) {
  World& w = *world_;
  const auto host_group = std::make_shared<Group>(ranks);
  std::vector<std::exception_ptr> failed(ranks);
  std::vector<int> failure_order;  // the first rank to fail is the cause; the others gave up on it
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; r++)
    threads.emplace_back([&, r] {
      std::unique_lock<std::mutex> turn(w.mutex);
      self.turn = &turn;
      self.rank = r;
      try {
        HostWorld host_world(host_group, r);
        body(r, host_world);
      } catch (...) {
        failed[r] = std::current_exception();
        failure_order.push_back(r);
        w.broken = true;
        w.changed.notify_all();
      }
      self = RankThread{};
    });
  for (std::thread& t : threads) t.join();
  w.broken = false;
  w.initializing.clear();
  if (!failure_order.empty()) {
    const int r = failure_order.front();
    std::string message;
    try {
      std::rethrow_exception(failed[r]);
    } catch (const std::exception& e) {
      message = e.what();
    } catch (...) {
      message = "an exception that is not a std::exception";
    }
    std::string why;
    for (const std::string& e : w.errors) why += "\n  " + e;
    throw RuntimeError("rank " + std::to_string(r) + " of " + std::to_string(ranks) + " failed: " + message +
                       (why.empty() ? "" : "\nthe NCCL double refused:" + why));
  }
}

std::vector<std::string> NcclDouble::errors() const {
  std::lock_guard<std::mutex> lock(world_->mutex);
  return world_->errors;
}

int NcclDouble::live_comms() const {
  std::lock_guard<std::mutex> lock(world_->mutex);
  return int(world_->live.size());
}

void NcclDouble::set_async_error(ncclResult_t state) {
  // Called from a rank thread (which holds the turn) or between runs (nobody does).
  if (self.turn) world_->async_state = state;
  else {
    std::lock_guard<std::mutex> lock(world_->mutex);
    world_->async_state = state;
  }
}

const Api& NcclDouble::api() const { return world_->api; }

}  // namespace pt::test

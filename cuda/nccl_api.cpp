// Loading NCCL at run time (see nccl_api.h): dlopen the library, dlsym every entry point, and
// turn each way this can fail into one line a user can act on.
#include "cuda/nccl_api.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "core/common/error.h"

namespace pt::nccl {

namespace {

constexpr const char* kDefaultLibrary = "libnccl.so.2";
constexpr const char* kInstallHint =
    "install NCCL 2.18 or newer (pip install nvidia-nccl-cu12, or your distribution's libnccl2) or set "
    "PICOTRAIN_NCCL_LIB to its libnccl.so.2 (PyTorch ships one under site-packages/nvidia/nccl/lib/)";

struct Loaded {
  Api api;
  bool ok = false;
  std::string error;
};

template <class F>
bool resolve(void* lib, const char* name, F& fn, std::string& missing) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (!fn && missing.empty()) missing = name;
  return fn != nullptr;
}

Loaded load() {
  Loaded l;
  const char* env = std::getenv(kLibraryEnv);
  l.api.path = env && *env ? env : kDefaultLibrary;
  // RTLD_LOCAL: NCCL's symbols stay out of the global namespace (a second copy, e.g. PyTorch's,
  // in the same process must not be interposed).
  void* lib = dlopen(l.api.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = dlerror();
    l.error = "NCCL could not be loaded from " + l.api.path + " (" + (why ? why : "unknown error") + "): " +
              kInstallHint;
    return l;
  }
  Api& a = l.api;
  std::string missing;
  resolve(lib, "ncclGetErrorString", a.GetErrorString, missing);
  resolve(lib, "ncclGetVersion", a.GetVersion, missing);
  resolve(lib, "ncclGetUniqueId", a.GetUniqueId, missing);
  resolve(lib, "ncclCommInitRank", a.CommInitRank, missing);
  resolve(lib, "ncclCommSplit", a.CommSplit, missing);
  resolve(lib, "ncclCommDestroy", a.CommDestroy, missing);
  resolve(lib, "ncclCommAbort", a.CommAbort, missing);
  resolve(lib, "ncclCommGetAsyncError", a.CommGetAsyncError, missing);
  resolve(lib, "ncclAllReduce", a.AllReduce, missing);
  resolve(lib, "ncclReduceScatter", a.ReduceScatter, missing);
  resolve(lib, "ncclAllGather", a.AllGather, missing);
  resolve(lib, "ncclBroadcast", a.Broadcast, missing);
  resolve(lib, "ncclSend", a.Send, missing);
  resolve(lib, "ncclRecv", a.Recv, missing);
  resolve(lib, "ncclGroupStart", a.GroupStart, missing);
  resolve(lib, "ncclGroupEnd", a.GroupEnd, missing);
  if (a.GetVersion) a.GetVersion(&a.version);
  if (!missing.empty()) {
    // ncclCommSplit arrived in 2.18: an older library is the usual reason for a missing symbol.
    l.error = "the NCCL library " + a.path + " (version " + version_string(a.version) + ") has no " + missing +
              ": " + kInstallHint;
    dlclose(lib);
    return l;
  }
  // The library stays loaded for the life of the process: communicators may be destroyed late.
  l.ok = true;
  return l;
}

const Loaded& loaded() {
  static std::once_flag once;
  static Loaded l;
  std::call_once(once, [] { l = load(); });
  return l;
}

std::atomic<const Api*> installed{nullptr};  // install_for_testing's table, used instead of loading

}  // namespace

void install_for_testing(const Api* table) { installed = table; }

const Api* try_load() {
  if (const Api* table = installed) return table;
  return loaded().ok ? &loaded().api : nullptr;
}

const std::string& load_error() { return loaded().error; }

const Api& api() {
  if (const Api* a = try_load()) return *a;
  throw RuntimeError(load_error());
}

std::string version_string(int code) {
  if (code <= 0) return "unknown";
  // NCCL_VERSION(X,Y,Z): X*1000 + Y*100 + Z up to 2.8, X*10000 + Y*100 + Z from 2.9 on.
  const bool wide = code >= 10000;
  const int major = wide ? code / 10000 : code / 1000;
  const int minor = wide ? code / 100 % 100 : code / 100 % 10;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(code % 100);
}

}  // namespace pt::nccl

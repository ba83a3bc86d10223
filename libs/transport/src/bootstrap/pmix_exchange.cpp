#include "bootstrap/pmix_exchange.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "plexus/config.hpp"

#if PLEXUS_HAVE_PMIX
#include <dlfcn.h>
#include <pmix.h>
#endif

namespace plexus::transport::bootstrap {
namespace {

constexpr char kNoPmixBuild[] =
    "this build of plexus has no PMIx (rebuild with libpmix-dev installed, PLEXUS_WITH_PMIX=AUTO "
    "or ON)";

std::string WhatToSet(const std::string& launcher) {
  return absl::StrCat("set PLEXUS_STORE_ADDR=<host of rank 0>:<free port> (", launcher,
                      ": e.g. mpirun -x PLEXUS_STORE_ADDR=node1:29500 ..., or export it before "
                      "srun) or PLEXUS_STORE_PATH=<directory shared by all ranks> instead");
}

#if PLEXUS_HAVE_PMIX

// libpmix is loaded when a rendezvous first needs it instead of linked: programs built with PMIx
// start, and an installed Plexus is found, on machines without it. pmix.h gives the types and
// constants only; its macros that call into libpmix (PMIX_INFO_LOAD, PMIX_VALUE_RELEASE, ...) are
// not used, so that no reference to a libpmix symbol remains in the archive.
struct PmixApi {
  decltype(&::PMIx_Init) init = nullptr;
  decltype(&::PMIx_Finalize) finalize = nullptr;
  decltype(&::PMIx_Put) put = nullptr;
  decltype(&::PMIx_Commit) commit = nullptr;
  decltype(&::PMIx_Fence) fence = nullptr;
  decltype(&::PMIx_Get) get = nullptr;
  decltype(&::PMIx_Error_string) error_string = nullptr;
  decltype(&::PMIx_Info_load) info_load = nullptr;
  decltype(&::PMIx_Value_destruct) value_destruct = nullptr;
};

// Opens `soname` and resolves every function of PmixApi into *api: "" when all resolve, else the
// reason. The library stays loaded once it passes (never unloaded: PMIx's threads and the atexit
// finaliser run its code).
std::string OpenPmix(const char* soname, PmixApi* api) {
  // RTLD_GLOBAL, as linking would: libpmix's own plugins, which it opens, resolve against it.
  void* handle = dlopen(soname, RTLD_NOW | RTLD_GLOBAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return absl::StrCat("plexus cannot load ", soname, ": ", why ? why : "unknown error",
                        " (install it: apt-get install libpmix2)");
  }
  std::string missing;
  auto resolve = [&](auto& fn, const char* name) {
    if (!missing.empty()) return;
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
    if (fn == nullptr) {
      const char* why = dlerror();
      missing = absl::StrCat("plexus cannot use ", soname, ": it has no ", name, " (",
                             why ? why : "unknown error",
                             "), which PMIx 4 and later have (apt-get install libpmix2)");
    }
  };
  resolve(api->init, "PMIx_Init");
  resolve(api->finalize, "PMIx_Finalize");
  resolve(api->put, "PMIx_Put");
  resolve(api->commit, "PMIx_Commit");
  resolve(api->fence, "PMIx_Fence");
  resolve(api->get, "PMIx_Get");
  resolve(api->error_string, "PMIx_Error_string");
  resolve(api->info_load, "PMIx_Info_load");
  resolve(api->value_destruct, "PMIx_Value_destruct");
  if (!missing.empty()) {
    *api = PmixApi{};
    dlclose(handle);
  }
  return missing;
}

struct LoadedPmix {
  PmixApi api;
  std::string error;  // empty when loaded
};

const LoadedPmix& Loaded() {
  static const LoadedPmix* loaded = [] {
    auto* l = new LoadedPmix;  // never destroyed: the atexit finaliser uses it
    l->error = OpenPmix(kPmixLibrary, &l->api);
    return l;
  }();
  return *loaded;
}

const PmixApi& Pmix() { return Loaded().api; }

// PMIx may be initialised once per process: Open MPI's server does not serve a client that
// finalised and initialised again, and it reports a process that initialised but exits without
// finalising as an abnormal termination. So the session lives until exit.
struct PmixSession {
  std::mutex mu;
  bool initialized = false;
  pmix_proc_t me{};
  uint64_t exchanges = 0;  // a fresh key per exchange, so no rank reads an earlier value
};

PmixSession& Session() {
  static auto* session = new PmixSession;  // never destroyed: the atexit handler uses it
  return *session;
}

void FinalizeAtExit() {
  PmixSession& s = Session();
  // A helper thread still stuck in a PMIx call (its caller timed out) holds the lock: exit
  // without finalising rather than hang.
  std::unique_lock<std::mutex> lock(s.mu, std::try_to_lock);
  if (!lock.owns_lock()) return;
  if (s.initialized) Pmix().finalize(nullptr, 0);
  s.initialized = false;
}

std::string PmixError(pmix_status_t rc) { return Pmix().error_string(rc); }

// PMIX_INFO_LOAD and PMIX_INFO_DESTRUCT, through the loaded library.
void LoadInfo(pmix_info_t* info, const char* key, const void* data, pmix_data_type_t type) {
  std::memset(info, 0, sizeof *info);
  Pmix().info_load(info, key, data, type);
}
void DestructInfo(pmix_info_t* info) { Pmix().value_destruct(&info->value); }

int TimeoutSeconds(absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) return 0;  // PMIx: 0 means no timeout
  return static_cast<int>(
      std::clamp<int64_t>(absl::ToInt64Seconds(absl::Ceil(timeout, absl::Seconds(1))), 1, 1 << 30));
}

absl::StatusOr<std::string> Exchange(const std::string& launcher, int expected_rank,
                                     const std::string& key_base, const std::string& value,
                                     absl::Duration timeout) {
  const PmixApi& pmix = Pmix();
  PmixSession& s = Session();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.initialized) {
    const pmix_status_t rc = pmix.init(&s.me, nullptr, 0);
    if (rc != PMIX_SUCCESS) {
      return absl::UnavailableError(absl::StrCat(
          "rank ", expected_rank, ": PMIx_Init failed (", PmixError(rc), "): the PMIx server of ",
          launcher, " named by PMIX_SERVER_URI* cannot be reached; ", WhatToSet(launcher)));
    }
    s.initialized = true;
    std::atexit(FinalizeAtExit);
  }
  if (static_cast<int64_t>(s.me.rank) != expected_rank) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the launcher's variables say rank ", expected_rank, " but its PMIx server says rank ",
        s.me.rank, " of namespace '", s.me.nspace, "': the environment of ", launcher,
        " was changed or copied from another process; ", WhatToSet(launcher)));
  }
  const std::string key = absl::StrCat(key_base, ".", s.exchanges++);
  if (expected_rank == 0) {
    pmix_value_t v;
    std::memset(&v, 0, sizeof v);
    v.type = PMIX_STRING;
    v.data.string = const_cast<char*>(value.c_str());  // PMIx_Put copies it
    pmix_status_t rc = pmix.put(PMIX_GLOBAL, key.c_str(), &v);
    if (rc == PMIX_SUCCESS) rc = pmix.commit();
    if (rc != PMIX_SUCCESS) {
      return absl::UnavailableError(absl::StrCat("rank 0: publishing the store address through ",
                                                 launcher, "'s PMIx server failed (", PmixError(rc),
                                                 "); ", WhatToSet(launcher)));
    }
  }
  int seconds = TimeoutSeconds(timeout);
  bool collect = true;
  pmix_info_t fence_info[2];
  LoadInfo(&fence_info[0], PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
  LoadInfo(&fence_info[1], PMIX_TIMEOUT, &seconds, PMIX_INT);
  pmix_proc_t all = s.me;  // this namespace, every rank
  all.rank = PMIX_RANK_WILDCARD;
  pmix_status_t rc = pmix.fence(&all, 1, fence_info, 2);
  DestructInfo(&fence_info[0]);
  DestructInfo(&fence_info[1]);
  if (rc != PMIX_SUCCESS) {
    return absl::Status(rc == PMIX_ERR_TIMEOUT ? absl::StatusCode::kDeadlineExceeded
                                               : absl::StatusCode::kUnavailable,
                        absl::StrCat("rank ", expected_rank, ": the PMIx fence of ", launcher,
                                     " (namespace '", s.me.nspace, "') failed after at most ",
                                     absl::FormatDuration(timeout), " (", PmixError(rc),
                                     "): a rank did not reach the rendezvous (did it crash or not "
                                     "call Rendezvous::FromEnv?); ",
                                     WhatToSet(launcher)));
  }
  if (expected_rank == 0) return value;
  pmix_proc_t rank0 = s.me;
  rank0.rank = 0;
  pmix_info_t get_info;
  LoadInfo(&get_info, PMIX_TIMEOUT, &seconds, PMIX_INT);
  pmix_value_t* got = nullptr;
  rc = pmix.get(&rank0, key.c_str(), &get_info, 1, &got);
  DestructInfo(&get_info);
  // PMIX_VALUE_RELEASE: the value's contents, then the value itself (malloc'd by libpmix).
  auto release = [&pmix](pmix_value_t* v) {
    pmix.value_destruct(v);
    std::free(v);
  };
  if (rc != PMIX_SUCCESS || got == nullptr || got->type != PMIX_STRING ||
      got->data.string == nullptr) {
    if (got != nullptr) release(got);
    return absl::Status(
        rc == PMIX_ERR_TIMEOUT ? absl::StatusCode::kDeadlineExceeded
                               : absl::StatusCode::kUnavailable,
        absl::StrCat("rank ", expected_rank, ": reading rank 0's store address ('", key,
                     "') from the PMIx server of ", launcher, " failed (",
                     rc == PMIX_SUCCESS ? std::string("not a string") : PmixError(rc), "); ",
                     WhatToSet(launcher)));
  }
  std::string result = got->data.string;
  release(got);
  return result;
}

#endif  // PLEXUS_HAVE_PMIX

}  // namespace

bool PmixLibraryLoads(const char* soname, std::string* why_not) {
#if PLEXUS_HAVE_PMIX
  PmixApi api;
  std::string error = OpenPmix(soname, &api);
#else
  (void)soname;
  std::string error = kNoPmixBuild;
#endif
  if (error.empty()) return true;
  if (why_not != nullptr) *why_not = std::move(error);
  return false;
}

bool PmixAvailable(std::string* why_not) {
#if PLEXUS_HAVE_PMIX
  const std::string& error = Loaded().error;
#else
  const std::string error = kNoPmixBuild;
#endif
  if (!error.empty() && why_not != nullptr) *why_not = error;
  return error.empty();
}

}  // namespace plexus::transport::bootstrap

#if PLEXUS_HAVE_PMIX && defined(__SANITIZE_ADDRESS__)
// libpmix keeps a few strings it copied (in PMIx_Init, in values it loads) past PMIx_Finalize:
// LeakSanitizer would fail every program that met its ranks through PMIx on those bytes, which
// are the library's, not Plexus's.
extern "C" const char* __lsan_default_suppressions() { return "leak:libpmix.so\n"; }
#endif

namespace plexus::transport::bootstrap {

absl::StatusOr<std::string> PmixShareFromRank0(std::string_view launcher, int expected_rank,
                                               std::string_view key, std::string_view value,
                                               absl::Duration timeout) {
  const std::string launcher_name(launcher);
#if PLEXUS_HAVE_PMIX
  if (std::string why; !PmixAvailable(&why)) {
    return absl::UnavailableError(
        absl::StrCat("rank ", expected_rank, ": the store address cannot be exchanged through ",
                     launcher_name, "'s PMIx server: ", why, "; ", WhatToSet(launcher_name)));
  }
  // The PMIx calls run on a helper thread so that a server that accepts and then never answers
  // (PMIx_Init and PMIx_Commit take no timeout) costs this rank `timeout`, not a hang.
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    absl::StatusOr<std::string> result = absl::UnknownError("not run");
  };
  auto shared = std::make_shared<Shared>();
  std::thread([shared, launcher = launcher_name, expected_rank, key = std::string(key),
               value = std::string(value), timeout] {
    auto result = Exchange(launcher, expected_rank, key, value, timeout);
    std::lock_guard<std::mutex> lock(shared->mu);
    shared->result = std::move(result);
    shared->done = true;
    shared->cv.notify_all();
  }).detach();
  // PMIx's own timeouts fire first; the slack covers its rounding to whole seconds.
  const absl::Duration limit = timeout + absl::Seconds(2);
  std::unique_lock<std::mutex> lock(shared->mu);
  const bool done = timeout == absl::InfiniteDuration()
                        ? (shared->cv.wait(lock, [&] { return shared->done; }), true)
                        : shared->cv.wait_for(lock, absl::ToChronoMilliseconds(limit),
                                              [&] { return shared->done; });
  if (!done) {
    return absl::DeadlineExceededError(absl::StrCat(
        "rank ", expected_rank, ": the PMIx server of ", launcher_name, " did not answer within ",
        absl::FormatDuration(limit), "; ", WhatToSet(launcher_name)));
  }
  return shared->result;
#else
  (void)key;
  (void)value;
  (void)timeout;
  return absl::UnimplementedError(absl::StrCat(
      "rank ", expected_rank, ": the store address cannot be exchanged through ", launcher_name,
      "'s PMIx server: ", kNoPmixBuild, "; ", WhatToSet(launcher_name)));
#endif
}

}  // namespace plexus::transport::bootstrap

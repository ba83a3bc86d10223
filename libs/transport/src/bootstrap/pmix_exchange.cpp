#include "bootstrap/pmix_exchange.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "plexus/config.hpp"

#if PLEXUS_HAVE_PMIX
#include <pmix.h>
#endif

namespace plexus::transport::bootstrap {
namespace {

std::string WhatToSet(const std::string& launcher) {
  return absl::StrCat("set PLEXUS_STORE_ADDR=<host of rank 0>:<free port> (", launcher,
                      ": e.g. mpirun -x PLEXUS_STORE_ADDR=node1:29500 ..., or export it before "
                      "srun) or PLEXUS_STORE_PATH=<directory shared by all ranks> instead");
}

#if PLEXUS_HAVE_PMIX

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
  if (s.initialized) PMIx_Finalize(nullptr, 0);
  s.initialized = false;
}

std::string PmixError(pmix_status_t rc) { return PMIx_Error_string(rc); }

int TimeoutSeconds(absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) return 0;  // PMIx: 0 means no timeout
  return static_cast<int>(
      std::clamp<int64_t>(absl::ToInt64Seconds(absl::Ceil(timeout, absl::Seconds(1))), 1, 1 << 30));
}

absl::StatusOr<std::string> Exchange(const std::string& launcher, int expected_rank,
                                     const std::string& key_base, const std::string& value,
                                     absl::Duration timeout) {
  PmixSession& s = Session();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.initialized) {
    const pmix_status_t rc = PMIx_Init(&s.me, nullptr, 0);
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
    PMIX_VALUE_CONSTRUCT(&v);
    v.type = PMIX_STRING;
    v.data.string = const_cast<char*>(value.c_str());  // PMIx_Put copies it
    pmix_status_t rc = PMIx_Put(PMIX_GLOBAL, key.c_str(), &v);
    if (rc == PMIX_SUCCESS) rc = PMIx_Commit();
    if (rc != PMIX_SUCCESS) {
      return absl::UnavailableError(absl::StrCat("rank 0: publishing the store address through ",
                                                 launcher, "'s PMIx server failed (", PmixError(rc),
                                                 "); ", WhatToSet(launcher)));
    }
  }
  int seconds = TimeoutSeconds(timeout);
  bool collect = true;
  pmix_info_t fence_info[2];
  PMIX_INFO_LOAD(&fence_info[0], PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
  PMIX_INFO_LOAD(&fence_info[1], PMIX_TIMEOUT, &seconds, PMIX_INT);
  pmix_proc_t all;
  PMIX_LOAD_PROCID(&all, s.me.nspace, PMIX_RANK_WILDCARD);
  pmix_status_t rc = PMIx_Fence(&all, 1, fence_info, 2);
  PMIX_INFO_DESTRUCT(&fence_info[0]);
  PMIX_INFO_DESTRUCT(&fence_info[1]);
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
  pmix_proc_t rank0;
  PMIX_LOAD_PROCID(&rank0, s.me.nspace, 0);
  pmix_info_t get_info;
  PMIX_INFO_LOAD(&get_info, PMIX_TIMEOUT, &seconds, PMIX_INT);
  pmix_value_t* got = nullptr;
  rc = PMIx_Get(&rank0, key.c_str(), &get_info, 1, &got);
  PMIX_INFO_DESTRUCT(&get_info);
  if (rc != PMIX_SUCCESS || got == nullptr || got->type != PMIX_STRING ||
      got->data.string == nullptr) {
    if (got != nullptr) PMIX_VALUE_RELEASE(got);
    return absl::Status(
        rc == PMIX_ERR_TIMEOUT ? absl::StatusCode::kDeadlineExceeded
                               : absl::StatusCode::kUnavailable,
        absl::StrCat("rank ", expected_rank, ": reading rank 0's store address ('", key,
                     "') from the PMIx server of ", launcher, " failed (",
                     rc == PMIX_SUCCESS ? std::string("not a string") : PmixError(rc), "); ",
                     WhatToSet(launcher)));
  }
  std::string result = got->data.string;
  PMIX_VALUE_RELEASE(got);
  return result;
}

#endif  // PLEXUS_HAVE_PMIX

}  // namespace

bool PmixCompiledIn() { return PLEXUS_HAVE_PMIX != 0; }

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
      "rank ", expected_rank,
      ": this build of plexus has no PMIx support (configure with "
      "libpmix-dev installed, PLEXUS_WITH_PMIX=AUTO or ON), so the store address cannot be "
      "exchanged through ",
      launcher_name, "; ", WhatToSet(launcher_name)));
#endif
}

}  // namespace plexus::transport::bootstrap

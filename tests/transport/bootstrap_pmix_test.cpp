// The PMIx exchange when the launcher's PMIx server is unreachable or silent: an error naming the
// launcher and what to set, within the rendezvous timeout. (The working exchange runs under real
// mpirun: launchers.cmake.) PMIx reads its server's address from the process environment, so the
// test sets it there; a silent server leaves a helper thread behind, so that case runs last.
// And the loading of libpmix itself, which is not linked.
#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "bootstrap/pmix_exchange.hpp"
#include "plexus/config.hpp"
#include "plexus/transport/rendezvous.hpp"

namespace pt = plexus::transport;

namespace {

// A listening socket on 127.0.0.1 that never accepts (the kernel completes connections, nothing
// answers them), or a closed port when `listening` is false.
struct Listener {
  int fd = -1;
  int port = 0;
  explicit Listener(bool listening) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    port = ntohs(addr.sin_port);
    if (listening) {
      listen(fd, 16);
    } else {
      close(fd);
      fd = -1;
    }
  }
  ~Listener() {
    if (fd >= 0) close(fd);
  }
};

// What mpirun exports, pointing at `port`; returns the environment FromEnv sees for rank 1 of 2.
pt::Environment PointPmixAt(int port) {
  const std::string uri = absl::StrCat("4242.0;tcp4://127.0.0.1:", port);
  for (const char* name : {"PMIX_SERVER_URI41", "PMIX_SERVER_URI4", "PMIX_SERVER_URI3",
                           "PMIX_SERVER_URI21", "PMIX_SERVER_URI2"}) {
    setenv(name, uri.c_str(), 1);
  }
  setenv("PMIX_NAMESPACE", "4242", 1);
  setenv("PMIX_RANK", "1", 1);
  return {{"OMPI_COMM_WORLD_RANK", "1"},
          {"OMPI_COMM_WORLD_SIZE", "2"},
          {"PMIX_NAMESPACE", "4242"},
          {"PMIX_SERVER_URI4", uri}};
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Whether `soname` is in this process (without loading it).
bool InProcess(const char* soname) {
  void* handle = dlopen(soname, RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) return false;
  dlclose(handle);  // drops the reference RTLD_NOLOAD took
  return true;
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

// Its own CTest entry (bootstrap_pmix_loader): the first thing its process does with PMIx.
TEST_CASE("libpmix is loaded on first use, or the reason names the library and package",
          "[loader]") {
  namespace pb = pt::bootstrap;
  CHECK(std::string(pb::kPmixLibrary) == "libpmix.so.2");
  // Not linked, so not loaded before the first use.
  CHECK_FALSE(InProcess(pb::kPmixLibrary));
  std::string why = "untouched";
  const bool loaded = pb::PmixAvailable(&why);
  INFO("PmixAvailable: " << loaded << ", " << why);
  CHECK(InProcess(pb::kPmixLibrary) == loaded);
  if (loaded) {
    CHECK(why == "untouched");
  } else {
#if PLEXUS_HAVE_PMIX
    CHECK(Contains(why, "cannot load libpmix.so.2: "));
    CHECK(Contains(why, "apt-get install libpmix2"));
#else
    CHECK(Contains(why, "no PMIx"));
#endif
  }
  // Loaded once: the same answer again.
  std::string again = "untouched";
  CHECK(pb::PmixAvailable(&again) == loaded);
  CHECK(again == (loaded ? "untouched" : why));
  CHECK(pb::PmixAvailable(nullptr) == loaded);

  // The two ways to fail: no such library (dlerror's account follows the name), and a library
  // without PMIx's functions.
  std::string absent;
  CHECK_FALSE(pb::PmixLibraryLoads("libpmix-absent.so.2", &absent));
  std::string not_pmix;
  CHECK_FALSE(pb::PmixLibraryLoads("libc.so.6", &not_pmix));
#if PLEXUS_HAVE_PMIX
  CHECK(Contains(absent, "cannot load libpmix-absent.so.2: "));
  CHECK(Contains(absent, "libpmix-absent.so.2: cannot open shared object file"));
  CHECK(Contains(absent, "apt-get install libpmix2"));
  CHECK(Contains(not_pmix, "libc.so.6: it has no PMIx_Init"));
  CHECK(Contains(not_pmix, "apt-get install libpmix2"));
#else
  CHECK(Contains(absent, "no PMIx"));
  CHECK(Contains(not_pmix, "no PMIx"));
#endif
}

TEST_CASE("an unreachable PMIx server: an error naming the launcher and what to set") {
  std::string no_pmix;
  const bool have_pmix = pt::bootstrap::PmixAvailable(&no_pmix);
  if (!have_pmix) WARN("the environment is refused before any PMIx call: " << no_pmix);
  Listener closed(false);
  const pt::Environment env = PointPmixAt(closed.port);
  const auto start = std::chrono::steady_clock::now();
  auto rdzv = pt::Rendezvous::FromEnv(env, absl::Seconds(3));
  const double took = SecondsSince(start);
  REQUIRE_FALSE(rdzv.ok());
  INFO(rdzv.status().ToString());
  CHECK(took < 3 * 1.25 + 2 + 0.5);
  const std::string message(rdzv.status().message());
  CHECK(message.find("Open MPI") != std::string::npos);
  CHECK(message.find("PLEXUS_STORE_ADDR") != std::string::npos);
  if (have_pmix) {
    CHECK(absl::IsUnavailable(rdzv.status()));
    CHECK(message.find("PMIx_Init failed") != std::string::npos);
  } else {
    CHECK(absl::IsInvalidArgument(rdzv.status()));
    CHECK(message.find(no_pmix) != std::string::npos);
  }
}

// Its own CTest entry (bootstrap_pmix_silent), reported skipped without PMIx (in the build, or
// libpmix here).
TEST_CASE("a PMIx server that never answers costs the timeout, not a hang", "[pmix]") {
  if (std::string no_pmix; !pt::bootstrap::PmixAvailable(&no_pmix)) {
    std::printf("SKIP: nothing waits on a PMIx server: %s\n", no_pmix.c_str());
    return;
  }
  Listener silent(true);
  const pt::Environment env = PointPmixAt(silent.port);
  const auto start = std::chrono::steady_clock::now();
  auto rdzv = pt::Rendezvous::FromEnv(env, absl::Seconds(2));
  const double took = SecondsSince(start);
  REQUIRE_FALSE(rdzv.ok());
  INFO(rdzv.status().ToString());
  // The bound is the timeout plus the 2 s PMIx rounding slack, with room for a loaded machine.
  CHECK(took < (2 + 2) * 1.25 + 0.5);
  const std::string message(rdzv.status().message());
  CHECK(message.find("Open MPI") != std::string::npos);
  CHECK(message.find("PLEXUS_STORE_ADDR") != std::string::npos);
}

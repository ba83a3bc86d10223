// A program the bootstrap tests start as separate processes (directly or under plexus-run).
//   bootstrap_helper store-worker tcp|file <address|dir> <rank> <ranks>
//   bootstrap_helper serve <address file>       serves a TcpStore until killed
//   bootstrap_helper store-get <address> <key>  blocks in Get until the store answers
//   bootstrap_helper echo                       prints lines on stdout and stderr
//   bootstrap_helper exit <rank> <code>         that rank exits with code, the others with 0
//   bootstrap_helper crash <rank>               that rank aborts, the others sleep for 60 s
//   bootstrap_helper stubborn <rank>            that rank exits 3, the others ignore SIGTERM
//   bootstrap_helper sleep                      every rank sleeps for 60 s
//   bootstrap_helper rendezvous                 FromEnv, AllGather and Barrier
//   bootstrap_helper fail <silent rank>         FromEnv; the silent rank then sleeps for 60 s
//                                               holding its store connection, the others fail a
//                                               1 s barrier, report it (ReportJobFailure), exit 1
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "plexus/transport/rendezvous.hpp"
#include "plexus/transport/store.hpp"

namespace pt = plexus::transport;

namespace {

int Fail(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "bootstrap_helper: %s: %s\n", what.c_str(), status.ToString().c_str());
  return 1;
}

int EnvRank() {
  const char* r = std::getenv("PLEXUS_RANK");
  return r == nullptr ? -1 : std::atoi(r);
}

int StoreWorker(const std::string& kind, const std::string& where, int rank, int ranks) {
  std::unique_ptr<pt::Store> store;
  if (kind == "tcp") {
    auto s = pt::TcpStore::Connect(where, absl::Seconds(20));
    if (!s.ok()) return Fail("connect", s.status());
    store = *std::move(s);
  } else {
    auto s = pt::FileStore::Open(where);
    if (!s.ok()) return Fail("open", s.status());
    store = *std::move(s);
  }
  for (int i = 0; i < 50; ++i) {
    auto v = store->Add("counter", 1);
    if (!v.ok()) return Fail("add", v.status());
  }
  if (auto s = store->Set(absl::StrCat("worker/", rank), absl::StrCat("value-", rank)); !s.ok()) {
    return Fail("set", s);
  }
  std::vector<std::string> keys;
  for (int r = 0; r < ranks; ++r) keys.push_back(absl::StrCat("worker/", r));
  if (auto s = store->Wait(keys, absl::Seconds(20)); !s.ok()) return Fail("wait", s);
  for (int r = 0; r < ranks; ++r) {
    auto v = store->Get(keys[r], absl::Seconds(5));
    if (!v.ok()) return Fail("get", v.status());
    if (*v != absl::StrCat("value-", r)) {
      std::fprintf(stderr, "bootstrap_helper: worker/%d holds '%s'\n", r, v->c_str());
      return 1;
    }
  }
  return 0;
}

int Serve(const std::string& address_file) {
  auto server = pt::TcpStoreServer::Start("127.0.0.1:0");
  if (!server.ok()) return Fail("start", server.status());
  {
    std::ofstream out(address_file + ".tmp");
    out << (*server)->address();
  }
  std::rename((address_file + ".tmp").c_str(), address_file.c_str());
  for (;;) pause();
}

int Rendezvous() {
  auto rdzv = pt::Rendezvous::FromEnv(absl::Seconds(20));
  if (!rdzv.ok()) return Fail("FromEnv", rdzv.status());
  const std::string mine = absl::StrCat("rank-", rdzv->rank());
  auto all = rdzv->AllGather("names", mine, absl::Seconds(20));
  if (!all.ok()) return Fail("AllGather", all.status());
  for (int r = 0; r < rdzv->world_size(); ++r) {
    if ((*all)[r] != absl::StrCat("rank-", r)) {
      std::fprintf(stderr, "AllGather gave '%s' for rank %d\n", (*all)[r].c_str(), r);
      return 1;
    }
  }
  if (auto s = rdzv->Barrier("end", absl::Seconds(20)); !s.ok()) return Fail("Barrier", s);
  std::printf("rank %d of %d local %d/%d serving=%d gathered %s\n", rdzv->rank(),
              rdzv->world_size(), rdzv->local_rank(), rdzv->local_world_size(),
              rdzv->store_server() != nullptr ? 1 : 0, absl::StrJoin(*all, ",").c_str());
  return 0;
}

int FailWithSilentRank(int silent) {
  auto rdzv = pt::Rendezvous::FromEnv(absl::Seconds(20));
  if (!rdzv.ok()) return Fail("FromEnv", rdzv.status());
  std::printf("rank %d joined\n", rdzv->rank());
  std::fflush(stdout);
  if (rdzv->rank() == silent) {
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }
  const absl::Status s = rdzv->Barrier("all", absl::Seconds(1));
  if (s.ok()) {
    std::fprintf(stderr, "bootstrap_helper: the barrier passed without rank %d\n", silent);
    return 2;
  }
  (void)pt::ReportJobFailure(*rdzv->store(), rdzv->rank(), std::string(s.message()));
  return Fail(absl::StrCat("rank ", rdzv->rank()), s);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: see the comment at the top of bootstrap_helper.cpp\n");
    return 2;
  }
  const std::string mode = argv[1];
  const int rank = EnvRank();
  if (mode == "store-worker" && argc == 6) {
    return StoreWorker(argv[2], argv[3], std::atoi(argv[4]), std::atoi(argv[5]));
  }
  if (mode == "serve" && argc == 3) return Serve(argv[2]);
  if (mode == "store-get" && argc == 4) {
    auto store = pt::TcpStore::Connect(argv[2], absl::Seconds(10));
    if (!store.ok()) return Fail("connect", store.status());
    auto v = (*store)->Get(argv[3], absl::Seconds(60));
    return v.ok() ? 0 : Fail("get", v.status());
  }
  if (mode == "echo") {
    std::printf("hello from rank %d\nsecond line of rank %d\n", rank, rank);
    std::fflush(stdout);
    std::fprintf(stderr, "error line of rank %d\n", rank);
    std::printf("unterminated %d", rank);
    return 0;
  }
  if (mode == "exit" && argc == 4) return rank == std::atoi(argv[2]) ? std::atoi(argv[3]) : 0;
  if (mode == "crash" && argc == 3) {
    if (rank == std::atoi(argv[2])) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      std::abort();
    }
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }
  if (mode == "stubborn" && argc == 3) {
    if (rank == std::atoi(argv[2])) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      return 3;
    }
    signal(SIGTERM, SIG_IGN);
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }
  if (mode == "sleep") {
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }
  if (mode == "rendezvous") return Rendezvous();
  if (mode == "fail" && argc == 3) return FailWithSilentRank(std::atoi(argv[2]));
  std::fprintf(stderr, "bootstrap_helper: unknown mode or arguments\n");
  return 2;
}

// The rendezvous stores' operations side by side: Plexus's TcpStore (a server in this process, a
// client over loopback) and EtcdStore (a private etcd member on loopback, one voting member,
// its WAL on this machine's disk), the same client calls on both: per-op latency of set, get
// (of a present key), check, wait (present keys), add, and a set followed by a delete, medians of
// --runs runs of
// --ops calls each. Exits 77 (skipped) without etcd.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/etcd.hpp"
#include "plexus/tooling/figures.hpp"
#include "plexus/transport/store.hpp"
#include "stats.hpp"

namespace pt = plexus::transport;

namespace {

using plexus::bench::Median;

struct Op {
  const char* name;
  std::function<absl::Status(pt::Store&, int i)> call;
};

// Per-call microseconds of `op` over `ops` calls, median of `runs` runs.
absl::StatusOr<double> Measure(pt::Store& store, const Op& op, int runs, int ops) {
  std::vector<double> per_op;
  for (int r = 0; r < runs; ++r) {
    const absl::Time start = absl::Now();
    for (int i = 0; i < ops; ++i) {
      if (absl::Status s = op.call(store, i); !s.ok()) return s;
    }
    per_op.push_back(absl::ToDoubleMicroseconds(absl::Now() - start) / ops);
  }
  return Median(per_op);
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  int runs = 5, ops = 500;
  plexus::tooling::Tool tool(
      "plexus-bench-store",
      "Per-operation latency of the rendezvous stores: TcpStore (served by this process) and "
      "EtcdStore (a private etcd on loopback), the same calls on both.");
  CLI::App& app = tool.app();
  plexus::tooling::AddJsonFlag(&app, &json);
  plexus::tooling::AddNumber(&app, "--runs", &runs, "runs per figure (median)", 1, 1000);
  plexus::tooling::AddNumber(&app, "--ops", &ops, "calls per run", 1, 1000000);
  if (auto code = tool.Parse(argc, argv)) return *code;
  if (!plexus::tooling::EtcdServer::Installed()) {
    std::fprintf(stderr, "plexus-bench-store: skipped: etcd is not installed (etcd-server)\n");
    return 77;
  }
  auto etcd = plexus::tooling::EtcdServer::Start(absl::Seconds(60));
  if (!etcd.ok()) return tool.Fail(etcd.status());
  auto server = pt::TcpStoreServer::Start("127.0.0.1:0");
  if (!server.ok()) return tool.Fail(server.status());
  auto tcp = pt::TcpStore::Connect((*server)->address(), absl::Seconds(10));
  if (!tcp.ok()) return tool.Fail(tcp.status());
  auto etcd_store = pt::EtcdStore::Connect({.address = (*etcd)->address(), .prefix = "bench/"},
                                           absl::Seconds(30));
  if (!etcd_store.ok()) return tool.Fail(etcd_store.status());

  const std::string value(64, 'v');
  const std::vector<std::string> present = {"k0", "k1", "k2", "k3"};
  const std::vector<Op> operations = {
      {"set", [&](pt::Store& s, int i) { return s.Set(absl::StrCat("k", i % 4), value); }},
      {"get",
       [&](pt::Store& s, int i) { return s.Get(present[i % 4], absl::Seconds(5)).status(); }},
      {"check", [&](pt::Store& s, int) { return s.Check(present).status(); }},
      {"wait", [&](pt::Store& s, int) { return s.Wait(present, absl::Seconds(5)); }},
      {"add", [&](pt::Store& s, int) { return s.Add("counter", 1).status(); }},
      {"set_delete",
       [&](pt::Store& s, int i) {
         const std::string key = absl::StrCat("d", i);
         if (absl::Status st = s.Set(key, value); !st.ok()) return st;
         return s.Delete(key).status();
       }},
  };
  plexus::tooling::FigureWriter out("store", json);
  out.SetCommon({{"runs", runs}, {"ops", ops}, {"value_bytes", value.size()}});
  for (const Op& op : operations) {
    std::fprintf(stderr, "plexus-bench-store: %s\n", op.name);
    auto t = Measure(**tcp, op, runs, ops);
    if (!t.ok()) return tool.Fail(t.status());
    auto e = Measure(**etcd_store, op, runs, ops);
    if (!e.ok()) return tool.Fail(e.status());
    out.Add({.figure = absl::StrCat(op.name, "_us"),
             .value = *t,
             .unit = "us",
             .extra = {{"store", "tcp"}}});
    out.Add({.figure = absl::StrCat(op.name, "_us"),
             .value = *e,
             .unit = "us",
             .extra = {{"store", "etcd"}}});
    out.Add({.figure = absl::StrCat(op.name, "_etcd_over_tcp"), .value = *e / *t, .unit = "ratio"});
  }
  if (!json) out.PrintTable();
  return 0;
}

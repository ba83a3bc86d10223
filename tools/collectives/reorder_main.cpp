// plexus-reorder: measure the network between the ranks of a job, price rank orders with the
// collectives' cost models, find a cheap order and write it for a launcher (Cloud Collectives;
// docs/netmodel.md, "Rank reordering").
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "plexus/base/file.hpp"
#include "plexus/base/json_reader.hpp"
#include "plexus/base/status.hpp"
#include "plexus/collectives/probe.hpp"
#include "plexus/netmodel/reorder.hpp"
#include "plexus/netmodel/topology.hpp"
#include "plexus/tooling/cli.hpp"
#include "plexus/transport/rendezvous.hpp"

namespace {

namespace pc = plexus::collectives;
namespace pn = plexus::netmodel;
namespace pt = plexus::transport;
namespace tooling = plexus::tooling;
using Json = nlohmann::json;

constexpr char kFooter[] =
    "Typical use: plexus-run -n 8 plexus-reorder probe --out m.json; plexus-reorder reorder "
    "m.json --out order.json; plexus-reorder rankfile m.json order.json > rankfile; mpirun "
    "--rankfile rankfile ...";

struct Args {
  std::vector<std::string> files;
  std::string out;
  bool json = false;
  std::string model = "ring";
  std::string order;
  double bytes = 100e6;
  int bcube_base = 4;
  // probe
  std::string backend = "tcp";
  std::string local_address;
  int probes = 200;
  int warmup = 20;
  double timeout_s = 10;
  bool no_self = false;
  // reorder
  uint64_t seed = 1;
  int runs = 4;
  int64_t moves = 0;
  int exact_max_n = 12;
  double time_limit_s = 60;
  // rankfile
  std::string format = "rankfile";
  // fabric
  pn::FabricSpec fabric;
  pn::LatencyNoise noise;
  std::string topology_out;
};

const tooling::Tool* g_tool = nullptr;

int Fail(const absl::Status& s) { return g_tool->Fail(s); }

absl::StatusOr<pn::CostMatrix> LoadMatrix(const std::string& path) {
  auto text = plexus::base::ReadFile(path);
  if (!text.ok()) return text.status();
  return pn::ParseCostMatrix(*text, path);
}

absl::Status Emit(const Args& a, const std::string& text) {
  if (a.out.empty() || a.out == "-") {
    std::fputs(text.c_str(), stdout);
    return absl::OkStatus();
  }
  return plexus::base::WriteFileAtomic(a.out, text);
}

// "3,1,0,2", or a JSON file written by `reorder` ({"order": [...]}).
absl::StatusOr<std::vector<int>> LoadOrder(const std::string& spec) {
  std::vector<int> order;
  int single = 0;
  if (spec.find(',') != std::string::npos || absl::SimpleAtoi(spec, &single)) {
    for (absl::string_view part : absl::StrSplit(spec, ',')) {
      int v = 0;
      if (!absl::SimpleAtoi(part, &v)) {
        return absl::InvalidArgumentError(
            absl::StrCat("order: '", std::string(part), "' is not an integer"));
      }
      order.push_back(v);
    }
    return order;
  }
  auto doc = plexus::base::json::ReadJsonFile(spec);
  if (!doc.ok()) return doc.status();
  auto field = plexus::base::json::ArrayField(*doc, "", "order", true);
  if (!field.ok()) return plexus::base::Annotate(field.status(), spec);
  for (size_t i = 0; i < (*field)->size(); ++i) {
    const Json& v = (**field)[i];
    if (!v.is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat(spec, ": order[", i, "]: expected an integer"));
    }
    order.push_back(v.get<int>());
  }
  return order;
}

pn::CostOptions CostOptionsOf(const Args& a, pn::CostModel model) {
  return pn::CostOptions{.model = model, .bytes = a.bytes, .bcube_base = a.bcube_base};
}

std::vector<pn::CostModel> Models(const std::string& name, absl::Status* error) {
  if (name == "all") {
    return {pn::CostModel::kRing, pn::CostModel::kHalvingDoubling, pn::CostModel::kDoubleBinaryTree,
            pn::CostModel::kBCube};
  }
  auto m = pn::ParseCostModel(name);
  if (!m.ok()) {
    *error = m.status();
    return {};
  }
  return {*m};
}

int Probe(const Args& a) {
  auto backend = pt::ParseBackend(a.backend);
  if (!backend.ok()) return g_tool->Usage(absl::StrCat("--backend: ", backend.status().message()));
  auto rdv = pt::Rendezvous::FromEnv();
  if (!rdv.ok()) return Fail(rdv.status());
  pc::ProbeOptions o;
  o.backend = *backend;
  o.local_address = a.local_address;
  o.probes = a.probes;
  o.warmup = a.warmup;
  o.subtract_self = !a.no_self;
  o.timeout = absl::Seconds(a.timeout_s);
  const bool leader = rdv->rank() == 0;
  if (leader) {
    std::fprintf(stderr, "probing %d ranks over %s: %d rounds of %d round trips per direction\n",
                 rdv->world_size(), a.backend.c_str(),
                 static_cast<int>(pc::TournamentRounds(rdv->world_size()).size()), a.probes);
    o.progress = [](int round, int rounds) {
      std::fprintf(stderr, "  round %d/%d done\n", round, rounds);
    };
  }
  auto m = pc::ProbeLatency(*rdv, o);
  if (!m.ok()) return Fail(m.status());
  if (!leader) return tooling::kExitOk;
  if (a.json || !a.out.empty()) {
    if (auto s = Emit(a, pn::CostMatrixToJson(*m) + "\n"); !s.ok()) return Fail(s);
  }
  if (!a.json) {
    std::string table = "latency (us, RTT less loopback)\n        ";
    for (int j = 0; j < m->n; ++j) absl::StrAppendFormat(&table, "%8d", j);
    table += "\n";
    for (int i = 0; i < m->n; ++i) {
      absl::StrAppendFormat(&table, "%6d  ", i);
      for (int j = 0; j < m->n; ++j) absl::StrAppendFormat(&table, "%8.1f", m->latency(i, j));
      absl::StrAppend(&table, "  ", m->labels[i], "\n");
    }
    std::fputs(table.c_str(), a.out.empty() ? stderr : stdout);
  }
  return tooling::kExitOk;
}

int Cost(const Args& a) {
  auto m = LoadMatrix(a.files[0]);
  if (!m.ok()) return Fail(m.status());
  absl::Status error;
  const auto models = Models(a.model, &error);
  if (!error.ok()) return g_tool->Usage(absl::StrCat("--model: ", error.message()));
  std::vector<int> order(m->n);
  for (int i = 0; i < m->n; ++i) order[i] = i;
  if (!a.order.empty()) {
    auto o = LoadOrder(a.order);
    if (!o.ok()) return Fail(o.status());
    order = *o;
  }
  Json rows = Json::array();
  std::string table = absl::StrFormat("%-20s %16s\n", "model", "cost (us)");
  for (pn::CostModel model : models) {
    auto c = pn::OrderCost(*m, order, CostOptionsOf(a, model));
    if (!c.ok()) {
      if (a.model == "all" && model == pn::CostModel::kBCube) {  // n not a power of the base
        absl::StrAppendFormat(&table, "%-20s %16s  (%s)\n", pn::CostModelName(model), "-",
                              c.status().message());
        continue;
      }
      return Fail(c.status());
    }
    rows.push_back({{"model", pn::CostModelName(model)}, {"cost_us", *c}});
    absl::StrAppendFormat(&table, "%-20s %16.1f\n", pn::CostModelName(model), *c);
  }
  if (a.json) {
    std::printf("%s\n", Json({{"order", order}, {"costs", rows}}).dump().c_str());
  } else {
    std::fputs(table.c_str(), stdout);
  }
  return tooling::kExitOk;
}

int Reorder(const Args& a) {
  auto m = LoadMatrix(a.files[0]);
  if (!m.ok()) return Fail(m.status());
  auto model = pn::ParseCostModel(a.model);
  if (!model.ok()) return g_tool->Usage(absl::StrCat("--model: ", model.status().message()));
  pn::ReorderOptions o;
  o.cost = CostOptionsOf(a, *model);
  o.seed = a.seed;
  o.anneal_runs = a.runs;
  o.anneal_moves = a.moves;
  o.exact_max_n = a.exact_max_n;
  o.time_limit = absl::Seconds(a.time_limit_s);
  o.progress = [](double fraction, double best) {
    std::fprintf(stderr, "  annealing %3.0f%%: best cost %.1f us\n", 100 * fraction, best);
  };
  std::fprintf(stderr, "reordering %d nodes for %s\n", m->n,
               std::string(pn::CostModelName(*model)).c_str());
  auto r = pn::Reorder(*m, o);
  if (!r.ok()) return Fail(r.status());
  const Json doc = {{"model", pn::CostModelName(*model)},
                    {"order", r->order},
                    {"cost_us", r->cost},
                    {"identity_cost_us", r->identity_cost},
                    {"proven_optimal", r->proven_optimal},
                    {"anneal_moves", r->anneal_moves},
                    {"exact_nodes", r->exact_nodes}};
  if (!a.out.empty()) {
    if (auto s = plexus::base::WriteFileAtomic(a.out, doc.dump() + "\n"); !s.ok()) return Fail(s);
  }
  if (a.json) {
    std::printf("%s\n", doc.dump().c_str());
    return tooling::kExitOk;
  }
  std::printf("%-16s %s\n", "model", std::string(pn::CostModelName(*model)).c_str());
  std::printf("%-16s %.1f us\n", "identity cost", r->identity_cost);
  // The ratio only where it means something: an order within rounding of the identity's cost is
  // not "1.00x lower", and a zero cost (every pair the order crosses has latency 0 in the
  // matrix) has no finite ratio.
  std::string versus = "no lower than the identity order";
  if (r->cost == 0 && r->identity_cost > 0) {
    versus = "every pair it crosses has latency 0 in the matrix";
  } else if (r->cost > 0 && r->identity_cost / r->cost >= 1.005) {
    versus = absl::StrFormat("%.2fx lower", r->identity_cost / r->cost);
  }
  std::printf("%-16s %.1f us (%s)\n", "chosen cost", r->cost, versus.c_str());
  std::printf("%-16s %s\n", "optimal",
              r->proven_optimal ? "proven (branch and bound finished)"
                                : (m->n <= a.exact_max_n ? "not proven (node limit reached)"
                                                         : "not proven (n above --exact-max-n)"));
  std::string order;
  for (size_t i = 0; i < r->order.size(); ++i) absl::StrAppend(&order, i ? "," : "", r->order[i]);
  std::printf("%-16s %s\n", "order", order.c_str());
  return tooling::kExitOk;
}

int Rankfile(const Args& a) {
  auto m = LoadMatrix(a.files[0]);
  if (!m.ok()) return Fail(m.status());
  auto order = LoadOrder(a.files[1]);
  if (!order.ok()) return Fail(order.status());
  if (auto c = pn::OrderCost(*m, *order, {}); !c.ok()) return Fail(c.status());  // a permutation
  std::string text;
  if (a.format == "rankfile") {
    text = pn::FormatRankfile(*m, *order);
  } else if (a.format == "hostfile") {
    text = pn::FormatHostfile(*m, *order);
  } else if (a.format == "rank") {
    text = pn::FormatRankAssignment(*m, *order);
  } else {
    return g_tool->Usage("--format expects rankfile, hostfile or rank, got '" + a.format + "'");
  }
  if (auto s = Emit(a, text); !s.ok()) return Fail(s);
  return tooling::kExitOk;
}

int Fabric(const Args& a) {
  // Each flag is in range on its own; their product may not be (a usage error, like them).
  if (auto s = pn::CheckFabricSize(a.fabric); !s.ok())
    return g_tool->Usage(std::string(s.message()));
  auto t = pn::GenerateFabric(a.fabric);
  if (!t.ok()) return Fail(t.status());
  if (!a.topology_out.empty()) {
    if (auto s = plexus::base::WriteFileAtomic(a.topology_out, pn::TopologyToJson(*t) + "\n");
        !s.ok()) {
      return Fail(s);
    }
  }
  const pn::CostMatrix m = pn::LatencyFromTopology(*t, a.noise);
  if (auto s = Emit(a, pn::CostMatrixToJson(m) + "\n"); !s.ok()) return Fail(s);
  if (!a.out.empty()) {
    std::fprintf(stderr, "%d hosts (%d pods x %d racks x %d hosts) -> %s\n", m.n, a.fabric.pods,
                 a.fabric.racks_per_pod, a.fabric.hosts_per_rack, a.out.c_str());
  }
  return tooling::kExitOk;
}

void AddCostFlags(CLI::App* app, Args* a) {
  app->add_option("--model", a->model,
                  "ring, halving_doubling (hd), double_binary_tree (dbt), bcube")
      ->capture_default_str();
  tooling::AddNumber(app, "--bytes", &a->bytes, "collective buffer (used with bandwidths)", 0.0,
                     1e15);
  tooling::AddNumber(app, "--bcube-base", &a->bcube_base, "BCube group size", 2, 1 << 20);
}

}  // namespace

int main(int argc, char** argv) {
  tooling::Tool tool(
      "plexus-reorder",
      std::string("Probe latencies, price and choose rank orders for collectives.\n") + kFooter);
  g_tool = &tool;
  tool.app().require_subcommand(1);
  Args a;

  CLI::App* probe = tool.Subcommand(
      "probe",
      "measure pairwise latencies between the ranks of a job (run under plexus-run, "
      "torchrun, mpirun or srun); rank 0 writes the matrix");
  probe->add_option("--out", a.out, "write the matrix (JSON) here instead of stdout");
  probe->add_option("--backend", a.backend, "tcp, shm, inproc or verbs")->capture_default_str();
  probe->add_option("--local-address", a.local_address, "local IP to probe from");
  tooling::AddNumber(probe, "--probes", &a.probes, "timed round trips per direction and pair", 1,
                     1'000'000);
  tooling::AddNumber(probe, "--warmup", &a.warmup, "untimed round trips first", 0, 1'000'000);
  tooling::AddNumber(probe, "--timeout", &a.timeout_s, "seconds any wait for a peer may take",
                     0.001, 86400.0);
  probe->add_flag("--no-self", a.no_self, "keep the loopback cost in the latencies");
  tooling::AddJsonFlag(probe, &a.json);

  CLI::App* cost = tool.Subcommand("cost", "the cost of an order under each model");
  cost->add_option("matrix", a.files, "MATRIX.json")->required()->expected(1);
  cost->add_option("--order", a.order, "3,1,0,2 or ORDER.json (default: identity)");
  AddCostFlags(cost, &a);
  cost->get_option("--model")->description("a model, or all");
  tooling::AddJsonFlag(cost, &a.json);

  CLI::App* reorder = tool.Subcommand("reorder", "choose the order that minimises a model");
  reorder->add_option("matrix", a.files, "MATRIX.json")->required()->expected(1);
  reorder->add_option("--out", a.out, "also write the result (JSON) here");
  AddCostFlags(reorder, &a);
  tooling::AddNumber(reorder, "--seed", &a.seed, "random seed", uint64_t{0},
                     std::numeric_limits<uint64_t>::max());
  tooling::AddNumber(reorder, "--runs", &a.runs, "independent annealing runs", 1, 1000);
  tooling::AddNumber(reorder, "--moves", &a.moves, "moves per run (0: scaled with n)", int64_t{0},
                     int64_t{1} << 40);
  tooling::AddNumber(reorder, "--exact-max-n", &a.exact_max_n,
                     "run branch and bound (a proof of optimality) up to this n", 0, 16);
  tooling::AddNumber(reorder, "--time-limit", &a.time_limit_s, "seconds of annealing at most",
                     0.001, 86400.0);
  tooling::AddJsonFlag(reorder, &a.json);

  CLI::App* rankfile = tool.Subcommand("rankfile", "write an order for a launcher");
  rankfile->add_option("files", a.files, "MATRIX.json ORDER(.json or 3,1,0,2)")
      ->required()
      ->expected(2);
  rankfile
      ->add_option("--format", a.format,
                   "rankfile (Open MPI --rankfile), hostfile (Open MPI --hostfile, one rank "
                   "per host) or rank (RANK per node, for torchrun --node_rank)")
      ->capture_default_str();
  rankfile->add_option("--out", a.out, "write here instead of stdout");

  CLI::App* fabric = tool.Subcommand(
      "fabric", "generate a pod/rack/host fabric and its noisy latency matrix (for trials)");
  tooling::AddNumber(fabric, "--pods", &a.fabric.pods, "pods", 1, 4096);
  tooling::AddNumber(fabric, "--racks", &a.fabric.racks_per_pod, "racks per pod", 1, 4096);
  tooling::AddNumber(fabric, "--hosts", &a.fabric.hosts_per_rack, "hosts per rack", 1, 4096);
  tooling::AddNumber(fabric, "--noise", &a.noise.noise, "lognormal sigma of each pair", 0.0, 10.0);
  tooling::AddNumber(fabric, "--seed", &a.noise.seed, "random seed", uint64_t{0},
                     std::numeric_limits<uint64_t>::max());
  fabric->add_option("--out", a.out, "write the latency matrix here instead of stdout");
  fabric->add_option("--topology-out", a.topology_out, "also write the topology (JSON)");

  if (auto code = tool.Parse(argc, argv)) return *code;
  if (probe->parsed()) return Probe(a);
  if (cost->parsed()) return Cost(a);
  if (reorder->parsed()) return Reorder(a);
  if (rankfile->parsed()) return Rankfile(a);
  return Fabric(a);
}

// Arbitrary 2LHA plans (plexus/aggregation/plan.hpp) through the verifier: no crash, and a plan
// the verifier accepts must compute the allreduce (with small integer inputs every summation
// order is exact, so every node must end with exactly the total).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <vector>

#include "plexus/aggregation/plan.hpp"

namespace agg = plexus::aggregation;

namespace {

struct Reader {
  const uint8_t* data;
  size_t size;
  size_t at = 0;
  int Next(int mod) {  // a value in [-1, mod), mostly valid ones
    if (at >= size || mod <= 0) return 0;
    const int v = data[at++];
    return v == 255 ? -1 : v % mod;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader r{data, size};
  agg::Plan plan;
  plan.nodes = 1 + std::abs(r.Next(6));
  const int chunks = 1 + std::abs(r.Next(3));
  int64_t offset = 0;
  for (int c = 0; c < chunks; ++c) {
    const int64_t elements = 1 + std::abs(r.Next(3));
    plan.chunks.push_back({offset, elements, r.Next(plan.nodes), {}});
    offset += elements;
  }
  const int steps = r.Next(48);
  for (int i = 0; i < steps; ++i) {
    agg::Step s;
    s.kind = static_cast<agg::StepKind>(std::abs(r.Next(5)));
    s.node = r.Next(plan.nodes + 1);
    s.chunk = r.Next(chunks + 1);
    const int peers = r.Next(3);
    for (int p = 0; p < peers; ++p) s.peers.push_back(r.Next(plan.nodes + 1));
    const int after = r.Next(3);
    for (int a = 0; a < after; ++a) s.after.push_back(r.Next(i + 2) - 1);
    s.install = r.Next(2) == 1;
    plan.steps.push_back(s);
  }
  if (!agg::VerifyPlan(plan).ok()) return 0;
  (void)agg::CommunicationRounds(plan);
  std::vector<int> hosts(plan.nodes);
  std::iota(hosts.begin(), hosts.end(), 0);
  if (!agg::PlanToSchedule(plan, hosts, 4).ok()) std::abort();
  std::vector<std::vector<float>> in(plan.nodes, std::vector<float>(offset));
  std::vector<float> total(offset, 0);
  for (int u = 0; u < plan.nodes; ++u) {
    for (int64_t k = 0; k < offset; ++k) {
      in[u][k] = static_cast<float>((u + 1) * (k + 3));
      total[k] += in[u][k];
    }
  }
  auto out = agg::EvaluatePlan(plan, in, 1.0f);
  if (!out.ok()) std::abort();
  for (int u = 0; u < plan.nodes; ++u) {
    if ((*out)[u] != total) std::abort();  // a verified plan that does not allreduce
  }
  return 0;
}

// plexus-bench-serving: what the serving runtime itself costs per request, measured with
// operators that take no time, against a plain rpc round trip over the same transport.
//
//   chain: source -> A -> B (sink)   3 one-way messages per request: source->A, A->B, B->collector
//   join:  source -> A, source -> B, (A, B) -> J (sink, a join)   3 on each path
//
// The runtime's end-to-end latency (median, compression 1, a rate at which nothing queues)
// divided by its 3 messages is one relay hop: the rpc message, the worker's queue, a service
// thread's turn, the operator call, the forward. The peer is the median synchronous Echo call
// (one round trip, 64 bytes) on the same transport and progress mode. Target: a hop < 2x the
// round trip.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "echo.plexus.hpp"
#include "nlohmann/json.hpp"
#include "plexus/base/quantile.hpp"
#include "plexus/placement/plan.hpp"
#include "plexus/placement/problem.hpp"
#include "plexus/rpc/channel.hpp"
#include "plexus/rpc/server.hpp"
#include "plexus/serving/serve.hpp"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/figures.hpp"
#include "plexus/transport/device.hpp"

namespace {

namespace pb = plexus::benchrpc;
namespace pl = plexus::placement;
namespace pr = plexus::rpc;
namespace ps = plexus::serving;
namespace pt = plexus::transport;
using nlohmann::json;

constexpr size_t kPayload = 64;
constexpr int kHops = 3;

struct Args {
  std::vector<std::string> transports = {"inproc", "tcp"};
  int runs = 5;
  double rate = 200;     // requests per second: 5 ms apart, far below the operators' capacity
  double seconds = 3;    // of injection per run
  int rtt_calls = 5000;  // round trips per run of the peer
  bool json = false;
};

// A workflow on one tier and location (no link delay) whose operators are real functions that
// return kPayload bytes at once. `join`: two branches and a joining sink.
json ProblemJson(bool join, double rate) {
  const std::vector<std::string> names =
      join ? std::vector<std::string>{"A", "B", "J"} : std::vector<std::string>{"A", "B"};
  json ops = json::array({{{"name", "source"}, {"kind", "source"}}});
  json profiles = json::array();
  json workers = json::array();
  for (const std::string& name : names) {
    const bool ml = name == names.back();
    json op = {{"name", name}, {"kind", ml ? "ml" : "relational"}};
    if (ml) op["variants"] = {"v"};
    if (name == "J") op["combine"] = "join";
    ops.push_back(op);
    json profile = {{"operator", name}, {"worker_type", "box"}, {"p50", 1}, {"p75", 1}, {"p90", 1}};
    if (ml) profile["variant"] = "v";
    profiles.push_back(profile);
    workers.push_back({{"name", "w" + name}, {"type", "box"}, {"tier", "edge"}});
  }
  const auto edge = [](const std::string& from, const std::string& to) {
    return json{{"from", from}, {"to", to}, {"message_kb", {{{"kb", kPayload / 1000.0}}}}};
  };
  const json edges =
      join ? json{edge("source", "A"), edge("source", "B"), edge("A", "J"), edge("B", "J")}
           : json{edge("source", "A"), edge("A", "B")};
  return {{"name", join ? "overhead-join" : "overhead-chain"},
          {"workflow", {{"operators", ops}, {"edges", edges}}},
          {"accuracy_profiles",
           {{{"operator", names.back()},
             {"variants", {{"v", {{{"in", json::array()}, {"out", 0.9}}}}}}}}},
          {"execution_profiles", profiles},
          {"infrastructure",
           {{"tiers", {{{"name", "edge"}}}},
            {"worker_types", {{{"name", "box"}, {"price_per_hour", 1.0}, {"gpu", true}}}},
            {"workers", workers},
            {"network", json::array()},
            {"sources", {{{"operator", "source"}, {"tier", "edge"}}}}}},
          {"objective", {{"accuracy_target", 0.5}, {"input_rate", rate}}}};
}

// Every operator on its own worker.
json PlanJson(bool join) {
  const std::vector<std::string> names =
      join ? std::vector<std::string>{"A", "B", "J"} : std::vector<std::string>{"A", "B"};
  json ops = json::array();
  for (const std::string& name : names) {
    json op = {{"name", name}, {"workers", {{{"name", "w" + name}, {"share", 1}}}}};
    if (name == names.back()) op["variant"] = "v";
    ops.push_back(op);
  }
  return {{"strategy", "bench"}, {"operators", ops}};
}

// The median end-to-end latency of one run, in microseconds.
absl::StatusOr<double> ServeOnce(bool join, const std::string& transport, const Args& args) {
  auto problem = pl::ParseProblem(ProblemJson(join, args.rate).dump());
  if (!problem.ok()) return problem.status();
  auto plan = pl::ParsePlan(*problem, PlanJson(join).dump());
  if (!plan.ok()) return plan.status();
  ps::ServeOptions options;
  options.duration_s = args.seconds;
  options.warmup_s = std::min(0.5, args.seconds / 4);
  options.compression = 1;
  options.wire = transport == "tcp" ? ps::Wire::kTcp : ps::Wire::kInproc;
  const std::string output(kPayload, 'o');
  for (const char* name : {"A", "B", "J"}) {
    if (!join && std::string(name) == "J") continue;
    options.operators[name] = [&output](const ps::Request&) -> absl::StatusOr<std::string> {
      return output;
    };
  }
  auto report = ps::Serve(*problem, *plan, options);
  if (!report.ok()) return report.status();
  if (report->dropped != 0 || report->duplicates != 0 || report->unfinished != 0) {
    return absl::InternalError(absl::StrFormat(
        "%s over %s: %d dropped, %d duplicated, %d unfinished", join ? "join" : "chain", transport,
        report->dropped, report->duplicates, report->unfinished));
  }
  return report->latency_p50_ms * 1000;  // compression 1: plan ms are wall ms
}

class EchoImpl : public pb::EchoService::Service {
 public:
  absl::Status Echo(pr::ServerContext&, const pb::EchoRequest& request,
                    pb::EchoReply* reply) override {
    reply->payload = request.payload;
    return absl::OkStatus();
  }
};

// The device the serving runtime makes for `transport` (the same progress mode).
absl::StatusOr<std::shared_ptr<pt::Device>> Device(const std::string& transport) {
  return pt::Device::Create(
      ps::DeviceOptionsFor(transport == "tcp" ? ps::Wire::kTcp : ps::Wire::kInproc));
}

// The median synchronous Echo round trip, in microseconds.
absl::StatusOr<double> RoundTrip(const std::string& transport, const Args& args) {
  auto server_device = Device(transport);
  if (!server_device.ok()) return server_device.status();
  auto server = pr::Server::Create(*server_device);
  if (!server.ok()) return server.status();
  EchoImpl impl;
  if (absl::Status s = (*server)->Register(&impl, {"Echo"}); !s.ok()) return s;
  if (absl::Status s = (*server)->Start(); !s.ok()) return s;
  auto client_device = Device(transport);
  if (!client_device.ok()) return client_device.status();
  auto channel =
      pr::Channel::Connect(*client_device, (*server)->address(), {&pb::EchoService::Descriptor()});
  if (!channel.ok()) return channel.status();
  pb::EchoService::Stub stub(*channel);
  const std::string payload(kPayload, 'p');
  pb::EchoRequest request;
  request.payload = pr::Bytes(reinterpret_cast<const uint8_t*>(payload.data()), payload.size());
  request.reply_bytes = kPayload;
  std::vector<double> us;
  for (int i = 0; i < args.rtt_calls + args.rtt_calls / 10; ++i) {
    const auto start = std::chrono::steady_clock::now();
    auto reply = stub.EchoSync(request);
    const auto end = std::chrono::steady_clock::now();
    if (!reply.ok()) return reply.status();
    if ((*reply)->payload.size() != kPayload) {
      return absl::InternalError("the echo did not return the request's payload");
    }
    if (i >= args.rtt_calls / 10) {
      us.push_back(std::chrono::duration<double, std::micro>(end - start).count());
    }
  }
  (*channel)->Close();
  (*server)->Shutdown();
  return plexus::base::Quantile(std::move(us), 0.5);
}

int Run(const Args& args, const plexus::tooling::Tool& tool) {
  plexus::tooling::FigureWriter out("serving_overhead", args.json);
  out.SetCommon({{"payload_bytes", kPayload}, {"rate", args.rate}, {"runs", args.runs}});
  for (const std::string& transport : args.transports) {
    if (transport != "inproc" && transport != "tcp") {
      return tool.Usage("--transport: expected inproc and/or tcp, got '" + transport + "'");
    }
    std::vector<double> chain, join, rtt;
    for (int run = 0; run < args.runs; ++run) {
      // Alternated run after run, so that a slow phase of the machine hits every side.
      auto c = ServeOnce(false, transport, args);
      if (!c.ok()) return tool.Fail(c.status());
      auto r = RoundTrip(transport, args);
      if (!r.ok()) return tool.Fail(r.status());
      auto j = ServeOnce(true, transport, args);
      if (!j.ok()) return tool.Fail(j.status());
      chain.push_back(*c);
      rtt.push_back(*r);
      join.push_back(*j);
      if (!args.json) {
        std::fprintf(stderr,
                     "plexus-bench-serving: %s run %d/%d: chain %.1f us, join %.1f us, "
                     "rpc round trip %.1f us\n",
                     transport.c_str(), run + 1, args.runs, *c, *j, *r);
      }
    }
    const double chain_us = plexus::base::Quantile(chain, 0.5);
    const double join_us = plexus::base::Quantile(join, 0.5);
    const double rtt_us = plexus::base::Quantile(rtt, 0.5);
    const double hop_us = chain_us / kHops;
    const bool met = hop_us < 2 * rtt_us;
    const json tags = {{"transport", transport}};
    out.Add({"relay_hop", hop_us, "us", 2 * rtt_us, met, tags});
    out.Add({"relay_hop_over_rpc_round_trip", hop_us / rtt_us, "ratio", 2.0, met, tags});
    out.Add({"rpc_round_trip", rtt_us, "us", nullptr, std::nullopt, tags});
    out.Add({"chain_latency", chain_us, "us", nullptr, std::nullopt, tags});
    out.Add({"join_latency", join_us, "us", nullptr, std::nullopt, tags});
    out.Add({"join_hop", join_us / kHops, "us", nullptr, std::nullopt, tags});
  }
  if (!args.json) out.PrintTable();
  return 0;  // a missed target is in the figures; exit 1 is for runs that failed
}

}  // namespace

int main(int argc, char** argv) {
  plexus::tooling::Tool tool(
      "plexus-bench-serving",
      "The serving runtime's own cost per request (relay hop, join) with operators that take no "
      "time, against a plain rpc round trip on the same transport (docs/placement.md).");
  Args args;
  CLI::App& app = tool.app();
  app.add_option("--transport", args.transports, "inproc,tcp")->delimiter(',');
  plexus::tooling::AddNumber(&app, "--runs", &args.runs, "runs (medians over them)", 1, 1000);
  plexus::tooling::AddNumber(&app, "--rate", &args.rate, "requests per second", 1.0, 1e5);
  plexus::tooling::AddNumber(&app, "--seconds", &args.seconds, "seconds of injection per run", 0.5,
                             600.0);
  plexus::tooling::AddNumber(&app, "--rtt-calls", &args.rtt_calls,
                             "rpc round trips per run of the peer", 10, 10'000'000);
  plexus::tooling::AddJsonFlag(&app, &args.json);
  if (auto code = tool.Parse(argc, argv)) return *code;
  return Run(args, tool);
}

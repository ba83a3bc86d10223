// The serving runtime (JellyBean's query processor): runs a placement::Plan for real. One worker
// per plan worker that serves an operator, each a thread pool behind its own rpc server (inproc or
// tcp), in this process or in host processes (Host, ServeOptions::hosts); the driver injects the
// sources' requests and collects the sinks' completions over rpc too. Reference:
// docs/placement.md, "Serving".
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plexus/base/admin.hpp"
#include "plexus/placement/plan.hpp"
#include "plexus/placement/problem.hpp"
#include "plexus/transport/device.hpp"
#include "plexus/transport/rendezvous.hpp"

namespace plexus::serving {

// What a user operator gets: one request's inputs, one per in-edge of the operator (in
// Problem::in_edges order) for a join, the one message that arrived otherwise.
struct Request {
  uint64_t id = 0;       // the source's injection number
  uint64_t sources = 0;  // bit s: descends from the s-th source operator (Problem order)
  int op = -1;
  // Which of the request's messages this is: 0 unless an edge above has a rate_ratio other than
  // 1 ("Serving" in docs/placement.md: message k of part p after such an edge is part
  // p * ceil(ratio) + k).
  uint64_t part = 0;
  std::vector<std::string_view> inputs;
};
// A real operator: its output, sent on every out-edge (a sink's output is dropped). An error
// drops the request with the error as the reason.
using OperatorFn = std::function<absl::StatusOr<std::string>(const Request&)>;

// Progress about once a second of wall time, while the sources inject and while draining.
struct ServeProgress {
  double plan_s = 0;           // plan time since the start (wall time * compression)
  bool draining = false;       // injection stopped
  double completion_rate = 0;  // completions per plan second over the last interval, all sinks
  int64_t queued = 0;          // requests queued or in service on every worker
  double latency_p50_ms = 0;   // plan milliseconds, completions so far
  double latency_p99_ms = 0;
};

enum class Wire : uint8_t { kInproc, kTcp };  // the transport of every rpc server and channel

// The transport devices the runtime serves on for `wire` (what a client or a benchmark that
// talks like a worker should use): tcp on 127.0.0.1 with a progress thread (a relay's calls are
// fire-and-forget, and with caller progress an image-sized request left only when its sender
// next polled, so relays fell behind their rate); inproc with caller progress (it moves the
// bytes in PostSend itself).
transport::DeviceOptions DeviceOptionsFor(Wire wire);
// The same, listening on `address` (an interface's address; tcp only).
transport::DeviceOptions DeviceOptionsFor(Wire wire, const std::string& address);

// A failure drill: at `at_s` plan seconds the worker stops at once, as if its process died (its
// rpc server closes, its queue is lost). The runtime must notice, re-plan and resume.
struct WorkerFailure {
  std::string worker;  // a Problem::workers name that serves in the plan
  double at_s = 0;     // within [0, duration_s)
};

// How a sender picks among an operator's workers. kShares: the plan's shares (smooth weighted
// round robin). kDaronpon: the share's pick, redirected to the worker where the request would
// finish first, by more than one request's time there: (load + 1) * the mean service time of
// the operator on that worker, the load being the queue its last acknowledgement reported plus
// this sender's unacknowledged sends (the rpc library's Daronpon balancer with per-replica
// costs). A join's inputs always follow the shares (by request id), so that every input of a
// request meets at one worker.
enum class Balance : uint8_t { kShares, kDaronpon };

// A load spike: from `at_s` plan seconds for `duration_s`, every source injects `factor` times
// its rate (constant or Poisson gaps alike).
struct LoadSpike {
  double at_s = 0;
  double duration_s = 0;
  double factor = 1;
};

// The plan to deploy after failures, for the problem without the failed workers (its worker
// indices are that problem's). Default: JellyBean (placement::Optimize, Strategy::kJellyBean).
using Replanner = std::function<absl::StatusOr<placement::Plan>(const placement::Problem&)>;

struct ServeOptions {
  // Plan seconds during which the sources inject, and the first of them left out of the figures.
  double duration_s = 60;
  double warmup_s = 5;
  // Plan time runs this many times faster than the wall clock: rates are multiplied by it,
  // service times and link delays divided. A 60 s run takes 6 wall seconds at 10.
  double compression = 10;
  bool poisson_arrivals = false;  // false: constant inter-arrival times
  Balance balance = Balance::kShares;
  LoadSpike spike;
  uint64_t seed = 1;
  Wire wire = Wire::kInproc;
  // Emulated operators on a CPU worker type burn the CPU for their service time (spin); on a GPU
  // type they sleep. false: every emulated operator sleeps.
  bool cpu_spins = true;
  // Wall seconds a join waits for the rest of a request's inputs before it drops the request.
  double join_timeout_s = 5;
  size_t max_join_pending = 100'000;  // per worker; beyond it the oldest request is dropped
  // Wall seconds to wait, after injection stops, for the requests in flight.
  double drain_timeout_s = 5;
  // Real operators by name; the others are emulated from their execution profiles.
  std::map<std::string, OperatorFn> operators;
  std::function<void(const ServeProgress&)> progress;
  std::vector<WorkerFailure> failures;
  // The driver checks every serving worker (its Stats call) every `health_interval_s` wall
  // seconds (0: never); one whose connection fails, or that does not answer within
  // `failure_timeout_s` twice in a row, is declared failed.
  double health_interval_s = 0.1;
  double failure_timeout_s = 1;
  Replanner replan;
  // When set, the run adds the command "serving" to this operator endpoint while it serves
  // (plexus/base/admin.hpp; the rpc admin endpoint's, PLEXUS_RPC_ADMIN): the deployed plan, per
  // worker its queue, requests processed and rate over the last health check, the requests
  // injected and completed so far, latency, failures. It must outlive the run.
  base::admin::AdminServer* admin = nullptr;
  // Multi-process: the rpc addresses of host processes (Host::address) that run the workers;
  // worker w (Problem::workers index) runs on hosts[w % hosts.size()]. Needs wire kTcp; real
  // operators are the hosts' (HostOptions::operators), so `operators` must be empty. A host that
  // dies takes every worker on it along: the re-plan leaves them all out. Empty: every worker is
  // a thread of this process.
  std::vector<std::string> hosts;
  // The interface the driver's (and in-process workers') tcp servers listen on.
  std::string address = "127.0.0.1";
  // The network between the workers is shaped to the problem's links (tiers in network
  // namespaces joined by shaped links: tools/serving/serve-bed): a message is held for the
  // link's latency only (the kernel here has no netem), its bandwidth is the link's own.
  // false: held for latency + bytes / bandwidth as well.
  bool shaped_links = false;
};

// One host process of a multi-process run: every rank but the driver's (plexus-serve under
// plexus-run, mpirun, srun or torchrun), which passes the hosts' addresses in
// ServeOptions::hosts. A host runs the workers the driver deploys on it, one deployment at a
// time, each on a tcp device and rpc server of its own. Its service takes failure drills (Kill
// ends the process): listen only where the job's own ranks can reach it.
struct HostOptions {
  std::string address = "127.0.0.1";            // the interface its tcp servers listen on
  std::map<std::string, OperatorFn> operators;  // real operators by name, as ServeOptions'
  // Wait gives up when neither a call from the driver nor a health check of one of its workers
  // came for this long (the driver died or never came).
  double driver_timeout_s = 30;
};
class Host {
 public:
  // Starts the host's own rpc server (service plexus.serving.wire.Host).
  static absl::StatusOr<std::unique_ptr<Host>> Start(HostOptions options);
  ~Host();
  std::string address() const;  // for ServeOptions::hosts
  // Blocks until the driver ends the run (OK) or falls silent (Unavailable, naming how long). A
  // failure drill aimed at one of its workers ends the process (SIGKILL), as a crash would.
  absl::Status Wait();

 private:
  struct State;
  explicit Host(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};
// A job under a launcher (transport::Rendezvous): every rank but 0 calls ServeAsHost, which
// starts a Host, publishes its address in the job's store and waits (Host::Wait); rank 0 calls
// HostsOf for ServeOptions::hosts (waiting up to `timeout` for each rank's address, the error
// naming the rank that published none), serves, then ShutdownHosts.
absl::Status ServeAsHost(transport::Rendezvous& rendezvous, HostOptions options);
absl::StatusOr<std::vector<std::string>> HostsOf(transport::Rendezvous& rendezvous,
                                                 absl::Duration timeout);
// Ends the hosts' runs (their Host::Wait returns OK), after the driver's last Serve. A host that
// cannot be reached (a drill killed it) is skipped; the error names any other that failed.
// `address`: the interface to call from (the driver's ServeOptions::address).
absl::Status ShutdownHosts(const std::vector<std::string>& hosts,
                           const std::string& address = "127.0.0.1");

// One failure and the recovery from it. On detection the runtime stops the deployment (every
// worker's queue is abandoned), re-plans without the failed worker, starts the new deployment and
// re-sends from their sources (with their first injection time) the requests that no sink has
// completed and no operator gave up for good; what the sources were due to inject meanwhile
// follows. Reports of the old deployment that arrive later are ignored, so each request counts
// once per sink.
struct FailureReport {
  std::string worker;
  double killed_at_s = 0;        // plan seconds since the start
  double detected_after_ms = 0;  // wall milliseconds from the kill to its detection
  double replan_ms = 0;          // wall milliseconds the re-plan took
  double redeploy_ms = 0;        // wall: old deployment stopped, new one started, requests re-sent
  std::vector<std::string> moved;  // operators whose set of workers changed
  int64_t retried = 0;             // requests re-sent from their sources
  double cost_per_hour_after = 0;  // the new plan's total cost (EvaluatePlan)
  // Plan seconds from the kill until completions run at >= 98% of the target rate again (the
  // end of the first timeline bucket that does); -1: not within the run.
  double recovered_after_s = -1;
  std::string error;  // the re-plan failed: serving stopped, what was owed is dropped with it
};

// Completions per bucket of plan time (one plan second, or more at low rates: >= 20 expected).
struct TimelinePoint {
  double t_s = 0;              // the bucket's start, plan seconds since the run's start
  double completion_rate = 0;  // completions per plan second, every sink
  double target_rate = 0;      // what every sink together should complete per plan second
  double latency_p50_ms = 0;   // of the bucket's completions
  double latency_p99_ms = 0;
};

struct SinkServeReport {
  int op = -1;
  double target_rate = 0;    // requests per plan second the sink should complete
  double achieved_rate = 0;  // completed per plan second during the measured window
  // Counted in messages: a request that edges with rate_ratio != 1 turned into several messages
  // counts once per message that reaches the sink.
  int64_t expected = 0;    // messages the sources' injections owe this sink
  int64_t completed = 0;   // distinct messages completed (whole run)
  int64_t duplicates = 0;  // completions of a message already completed: an error
  int64_t dropped = 0;     // given up at this sink or an operator above it
  int64_t unfinished = 0;  // expected - completed - dropped: still in flight at the end
};

struct WorkerServeReport {
  int worker = -1;
  std::vector<int> operators;
  std::string address;       // its rpc server
  int servers = 1;           // requests served at once (a replicated tier's locations)
  int64_t queue_at_end = 0;  // queued or in service when injection stopped
  int64_t processed = 0;     // requests it ran, drain included
};

struct ServeReport {
  double measured_s = 0;  // plan seconds of the measured window
  double wall_s = 0;      // wall seconds of the whole run, drain included
  double compression = 1;
  double accuracy = 0;  // the plan's (EvaluatePlan) at the objective's sink
  std::vector<SinkServeReport> sinks;
  double throughput_ratio = 0;  // min over sinks of achieved / target
  bool sustained = false;       // throughput_ratio >= 0.98
  double latency_p50_ms = 0;    // end to end in plan milliseconds (wall * compression)
  double latency_p90_ms = 0;
  double latency_p99_ms = 0;
  // Payload bytes sent per "from-tier->to-tier" during the measured window (between the workers'
  // counters polled at its start and end), and the network cost per hour they imply in plan time
  // (comparable with the plan's network cost).
  std::map<std::string, double> bytes_per_tier_pair;
  double network_cost_per_hour = 0;
  double compute_cost_per_hour = 0;  // the price of the workers that serve
  std::vector<WorkerServeReport> workers;
  int64_t injected = 0;  // requests, every source together
  // The sinks' figures summed, in messages (a request counts once per message it owes a sink).
  int64_t completed = 0;
  int64_t duplicates = 0;
  int64_t dropped = 0;
  int64_t unfinished = 0;
  // Drop reports by reason; a request lost at a branch is reported there and at its join too.
  std::map<std::string, int64_t> drops_by_reason;
  std::vector<FailureReport> failures;
  int64_t retried = 0;          // requests re-sent after failures, every failure together
  int64_t retried_repeats = 0;  // completions of a retried request a sink had already: ignored
  std::vector<TimelinePoint> timeline;
};

// Checks that the runtime can serve the plan: EvaluatePlan's checks, then its own (rate_ratios
// in (0, 1024], none above a join, one per source along every path to an operator; at most 64
// sources, a join's inputs descend from one set of sources each,
// every name in options.operators is an operator, every failure names a serving worker within
// the run). Errors name the element.
absl::Status CheckServable(const placement::Problem& problem, const placement::Plan& plan,
                           const ServeOptions& options = {});

// Serves the plan for options.duration_s plan seconds, drains, and reports. Never hangs: a plan
// that cannot keep up is reported as not sustained, with what did not finish counted.
absl::StatusOr<ServeReport> Serve(const placement::Problem& problem, const placement::Plan& plan,
                                  const ServeOptions& options = {});

std::string ServeSummary(const placement::Problem& problem, const ServeReport& report);
std::string ServeToJson(const placement::Problem& problem, const ServeReport& report);

}  // namespace plexus::serving

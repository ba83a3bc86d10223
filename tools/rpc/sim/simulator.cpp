#include "simulator.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <queue>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "plexus/base/status.hpp"
#include "plexus/rpc/balance.hpp"

namespace plexus::rpc::sim {

absl::StatusOr<Service> ParseService(const std::string& name) {
  if (name == "constant") return Service::kConstant;
  if (name == "exp" || name == "exponential") return Service::kExponential;
  if (name == "bimodal") return Service::kBimodal;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown service distribution '", name, "'; expected constant, exp or bimodal"));
}

std::string ServiceName(Service service) {
  switch (service) {
    case Service::kConstant:
      return "constant";
    case Service::kExponential:
      return "exp";
    case Service::kBimodal:
      return "bimodal";
  }
  return "?";
}

namespace {

// splitmix64: reproducible across platforms, unlike std's distributions.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double Uniform() { return (Next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double Exponential(double mean) { return -mean * std::log1p(-Uniform()); }
  uint32_t Below(uint32_t n) { return static_cast<uint32_t>(((Next() >> 32) * n) >> 32); }

 private:
  uint64_t state_;
};

enum class Kind : uint8_t {
  kClientSend,
  kAtToR,
  kAtServer,
  kServerDone,
  kRespAtToR,
  kRespAtClientToR,
  kRespAtClient,
  kGossip,
  kPeriodic,
};

struct Event {
  double t;
  uint64_t seq;
  Kind kind;
  uint32_t where;  // client, rack or server
  uint64_t id;     // request id, or (replica << 32 | count) for gossip
  bool operator>(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
};

struct Request {
  double start = 0;
  double service = 0;
  uint32_t client = 0;
  uint32_t replica = 0;
  uint32_t hops = 0;
  uint32_t count_at_server = 0;  // the server ToR's count after the response, piggybacked
  std::vector<LoadReport> piggyback;
};

struct Server {
  uint32_t cores = 1;
  uint32_t busy = 0;
  std::deque<uint64_t> queue;
  uint32_t assigned = 0;  // picked and not completed (the oracle's view)
};

class Sim {
 public:
  explicit Sim(const SimConfig& c) : c_(c), rng_(c.seed) {}

  absl::Status Init() {
    if (c_.racks == 0 || c_.servers_per_rack == 0 || c_.clients == 0) {
      return absl::InvalidArgumentError("racks, servers-per-rack and clients must be >= 1");
    }
    if (!(c_.load >= kMinLoad && c_.load <= kMaxLoad)) {
      return absl::InvalidArgumentError(
          absl::StrCat("load must be in ", kMinLoad, "..", kMaxLoad, ", got ", c_.load));
    }
    if (!(c_.mean_us > 0) || !(c_.hop_us >= 0) || !(c_.gossip_period_us > 0)) {
      return absl::InvalidArgumentError("mean-us and gossip-period-us must be > 0, hop-us >= 0");
    }
    if (c_.requests == 0 || !(c_.warmup >= 0 && c_.warmup < 1)) {
      return absl::InvalidArgumentError("requests must be >= 1 and warmup in [0, 1)");
    }
    const uint32_t n = c_.racks * c_.servers_per_rack;
    if (!c_.cores.empty() && c_.cores.size() != n) {
      return absl::InvalidArgumentError(
          absl::StrCat("cores lists ", c_.cores.size(), " servers, the topology has ", n));
    }
    servers_.resize(n);
    uint64_t total_cores = 0;
    for (uint32_t s = 0; s < n; ++s) {
      servers_[s].cores = c_.cores.empty() ? 1 : c_.cores[s];
      if (servers_[s].cores == 0) {
        return absl::InvalidArgumentError(absl::StrCat("server ", s, " has 0 cores"));
      }
      total_cores += servers_[s].cores;
    }
    result_.served.assign(n, 0);
    result_.redirected_to.assign(n, 0);
    const std::string& p = c_.policy;
    tor_policy_ = p == "daronpon" || p == "periodic";
    if (tor_policy_) {
      for (uint32_t r = 0; r < c_.racks; ++r) {
        BalancerOptions b;
        b.policy = BalancePolicy::kDaronpon;
        b.replicas = n;
        for (uint32_t s = 0; s < c_.servers_per_rack; ++s)
          b.local.push_back(r * c_.servers_per_rack + s);
        b.seed = c_.seed * 7919 + r + 1;
        b.delta = c_.delta;
        b.gossip_floor = c_.gossip_floor;
        b.log_gossip = p == "daronpon";
        PLEXUS_ASSIGN_OR_RETURN(auto balancer, Balancer::Create(b));
        tors_.push_back(std::move(balancer));
      }
      if (p == "periodic") {
        c_.piggyback_redirects = c_.piggyback_responses = false;
        Push(c_.gossip_period_us, Kind::kPeriodic, 0, 0);
      }
    } else if (p == "random" || p == "round_robin" || p == "po2") {
      PLEXUS_ASSIGN_OR_RETURN(BalancePolicy policy, ParseBalancePolicy(p));
      for (uint32_t i = 0; i < c_.clients; ++i) {
        BalancerOptions b;
        b.policy = policy;
        b.replicas = n;
        b.seed = c_.seed * 104729 + i + 1;
        PLEXUS_ASSIGN_OR_RETURN(auto balancer, Balancer::Create(b));
        clients_.push_back(std::move(balancer));
      }
    } else if (p != "jsq") {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown policy '", p,
                       "'; expected random, round_robin, po2, jsq, periodic or daronpon"));
    }
    const double capacity_per_us = double(total_cores) / c_.mean_us;
    client_gap_us_ = c_.clients / (c_.load * capacity_per_us);
    if (p == "periodic") {
      // Periodic gossip runs for as long as the requests take to arrive, however few they are.
      const double span_us = double(c_.requests) / (c_.load * capacity_per_us);
      const double events = span_us / c_.gossip_period_us * (1.0 + double(n) * (c_.racks - 1));
      if (events > kMaxPeriodicEvents) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "periodic gossip every %g us over the %.3g us that %d requests take to arrive at "
            "load %g makes about %.3g events; at most %.3g are simulated (raise "
            "--gossip-period-us or --load, or lower --requests)",
            c_.gossip_period_us, span_us, c_.requests, c_.load, events, kMaxPeriodicEvents));
      }
    }
    for (uint32_t i = 0; i < c_.clients; ++i) {
      Push(rng_.Exponential(client_gap_us_), Kind::kClientSend, i, 0);
    }
    requests_.reserve(c_.requests);
    return absl::OkStatus();
  }

  absl::StatusOr<SimResult> Run() {
    while (!events_.empty()) {
      const Event e = events_.top();
      events_.pop();
      now_ = e.t;
      PLEXUS_RETURN_IF_ERROR(Handle(e));
      if (result_.completed == c_.requests) break;
    }
    const uint64_t skip = static_cast<uint64_t>(c_.warmup * c_.requests);
    std::vector<double> sample;
    sample.reserve(c_.requests);
    for (uint64_t id = skip; id < requests_.size(); ++id) sample.push_back(latency_[id]);
    std::sort(sample.begin(), sample.end());
    auto pct = [&](double q) {
      if (sample.empty()) return 0.0;
      const size_t i = std::min(sample.size() - 1, static_cast<size_t>(q * sample.size()));
      return sample[i];
    };
    result_.measured = sample.size();
    result_.p50_us = pct(0.5);
    result_.p99_us = pct(0.99);
    result_.p999_us = pct(0.999);
    result_.mean_us =
        sample.empty() ? 0 : std::accumulate(sample.begin(), sample.end(), 0.0) / sample.size();
    result_.throughput_krps = now_ > 0 ? result_.completed / now_ * 1000.0 : 0;
    return result_;
  }

 private:
  uint32_t RackOfServer(uint32_t s) const { return s / c_.servers_per_rack; }
  uint32_t RackOfClient(uint32_t i) const { return i % c_.racks; }
  double Hops(uint32_t k) const { return k * c_.hop_us; }

  void Push(double t, Kind kind, uint32_t where, uint64_t id) {
    events_.push(Event{t, seq_++, kind, where, id});
  }

  double DrawService() {
    switch (c_.service) {
      case Service::kConstant:
        return c_.mean_us;
      case Service::kExponential:
        return rng_.Exponential(c_.mean_us);
      case Service::kBimodal:
        return rng_.Uniform() < 0.9 ? 0.52 * c_.mean_us : 5.2 * c_.mean_us;
    }
    return c_.mean_us;
  }

  void Broadcast(uint32_t from_rack, const LoadReport& report) {
    ++result_.gossip_announcements;
    for (uint32_t r = 0; r < c_.racks; ++r) {
      if (r == from_rack) continue;
      ++result_.gossip_messages;
      Push(now_ + Hops(2), Kind::kGossip, r, (uint64_t{report.replica} << 32) | report.outstanding);
    }
  }

  absl::Status Gossiped(uint32_t rack, const absl::StatusOr<std::optional<LoadReport>>& g) {
    if (!g.ok()) return g.status();
    if (*g) Broadcast(rack, **g);
    return absl::OkStatus();
  }

  uint32_t OracleJsq() {
    // The server whose assigned calls per core is lowest, ties at random.
    uint32_t best = 0, ties = 0;
    double best_load = std::numeric_limits<double>::infinity();
    for (uint32_t s = 0; s < servers_.size(); ++s) {
      const double load = double(servers_[s].assigned) / servers_[s].cores;
      if (load < best_load) {
        best = s, best_load = load, ties = 1;
      } else if (load == best_load && rng_.Below(++ties) == 0) {
        best = s;
      }
    }
    return best;
  }

  absl::Status Handle(const Event& e) {
    switch (e.kind) {
      case Kind::kClientSend: {
        if (requests_.size() >= c_.requests) return absl::OkStatus();
        const uint64_t id = requests_.size();
        Request& q = requests_.emplace_back();
        latency_.push_back(0);
        q.start = now_;
        q.client = e.where;
        q.service = DrawService();
        const uint32_t crack = RackOfClient(q.client);
        if (tor_policy_) {
          q.replica = rng_.Below(servers_.size());  // the client's pick, as in the seed
          const uint32_t rack = RackOfServer(q.replica);
          Push(now_ + Hops(rack == crack ? 1 : 3), Kind::kAtToR, rack, id);
        } else {
          if (c_.policy == "jsq") {
            q.replica = OracleJsq();
          } else {
            Balancer& b = *clients_[q.client];
            q.replica = b.Pick({}).replica;
            PLEXUS_RETURN_IF_ERROR(b.OnSend(q.replica).status());
          }
          ++servers_[q.replica].assigned;
          const uint32_t rack = RackOfServer(q.replica);
          Push(now_ + Hops(rack == crack ? 2 : 4), Kind::kAtServer, q.replica, id);
        }
        Push(now_ + rng_.Exponential(client_gap_us_), Kind::kClientSend, e.where, 0);
        return absl::OkStatus();
      }
      case Kind::kAtToR: {
        Request& q = requests_[e.id];
        Balancer& tor = *tors_[e.where];
        for (const LoadReport& report : q.piggyback) PLEXUS_RETURN_IF_ERROR(tor.OnGossip(report));
        q.piggyback.clear();
        const BalanceChoice choice = tor.Pick({q.replica, q.hops});
        q.replica = choice.replica;
        if (choice.redirected) {
          ++q.hops;
          ++result_.redirects;
          ++result_.redirected_to[q.replica];
          if (c_.piggyback_redirects) q.piggyback = tor.LocalLoads();
          Push(now_ + Hops(2), Kind::kAtToR, RackOfServer(q.replica), e.id);
          return absl::OkStatus();
        }
        PLEXUS_RETURN_IF_ERROR(Gossiped(e.where, tor.OnSend(q.replica)));
        ++servers_[q.replica].assigned;
        Push(now_ + Hops(1), Kind::kAtServer, q.replica, e.id);
        return absl::OkStatus();
      }
      case Kind::kAtServer: {
        Server& s = servers_[e.where];
        if (s.busy < s.cores) {
          ++s.busy;
          Push(now_ + requests_[e.id].service, Kind::kServerDone, e.where, e.id);
        } else {
          s.queue.push_back(e.id);
        }
        return absl::OkStatus();
      }
      case Kind::kServerDone: {
        Server& s = servers_[e.where];
        --s.assigned;
        ++result_.served[e.where];
        // The server's count after this completion: what a response piggybacks.
        requests_[e.id].count_at_server = s.assigned;
        if (!s.queue.empty()) {
          const uint64_t next = s.queue.front();
          s.queue.pop_front();
          Push(now_ + requests_[next].service, Kind::kServerDone, e.where, next);
        } else {
          --s.busy;
        }
        Push(now_ + Hops(1), Kind::kRespAtToR, RackOfServer(e.where), e.id);
        return absl::OkStatus();
      }
      case Kind::kRespAtToR: {
        Request& q = requests_[e.id];
        if (tor_policy_) {
          Balancer& tor = *tors_[e.where];
          PLEXUS_RETURN_IF_ERROR(Gossiped(e.where, tor.OnResponse(q.replica, std::nullopt)));
          q.count_at_server = tor.Load(q.replica);
        }
        const uint32_t crack = RackOfClient(q.client);
        if (crack == e.where) {
          Push(now_ + Hops(1), Kind::kRespAtClient, q.client, e.id);
        } else {
          Push(now_ + Hops(2), Kind::kRespAtClientToR, crack, e.id);
        }
        return absl::OkStatus();
      }
      case Kind::kRespAtClientToR: {
        const Request& q = requests_[e.id];
        if (tor_policy_ && c_.piggyback_responses) {
          PLEXUS_RETURN_IF_ERROR(tors_[e.where]->OnGossip({q.replica, q.count_at_server}));
        }
        Push(now_ + Hops(1), Kind::kRespAtClient, q.client, e.id);
        return absl::OkStatus();
      }
      case Kind::kRespAtClient: {
        const Request& q = requests_[e.id];
        latency_[e.id] = now_ - q.start;
        ++result_.completed;
        if (!clients_.empty()) {
          PLEXUS_RETURN_IF_ERROR(
              clients_[q.client]->OnResponse(q.replica, q.count_at_server).status());
        }
        return absl::OkStatus();
      }
      case Kind::kGossip:
        return tors_[e.where]->OnGossip(
            {static_cast<uint32_t>(e.id >> 32), static_cast<uint32_t>(e.id)});
      case Kind::kPeriodic: {
        if (requests_.size() >= c_.requests && result_.completed >= c_.requests) {
          return absl::OkStatus();
        }
        for (uint32_t r = 0; r < c_.racks; ++r) {
          ++result_.gossip_announcements;
          for (const LoadReport& report : tors_[r]->LocalLoads()) {
            for (uint32_t to = 0; to < c_.racks; ++to) {
              if (to == r) continue;
              Push(now_ + Hops(2), Kind::kGossip, to,
                   (uint64_t{report.replica} << 32) | report.outstanding);
            }
          }
          result_.gossip_messages += c_.racks - 1;
        }
        Push(now_ + c_.gossip_period_us, Kind::kPeriodic, 0, 0);
        return absl::OkStatus();
      }
    }
    return absl::OkStatus();
  }

  SimConfig c_;
  Rng rng_;
  double now_ = 0;
  uint64_t seq_ = 0;
  double client_gap_us_ = 0;
  bool tor_policy_ = false;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  std::vector<Server> servers_;
  std::vector<Request> requests_;
  std::vector<double> latency_;
  std::vector<std::unique_ptr<Balancer>> tors_;
  std::vector<std::unique_ptr<Balancer>> clients_;
  SimResult result_;
};

}  // namespace

absl::StatusOr<SimResult> Simulate(const SimConfig& config) {
  Sim sim(config);
  PLEXUS_RETURN_IF_ERROR(sim.Init());
  return sim.Run();
}

}  // namespace plexus::rpc::sim

// A discrete-event simulator of a CXL fabric at flit granularity, after Aurelia's evaluation
// (seed 003, ch. 4.4): 256-byte flits over PCIe 6.0 x16 links, point-to-point credit flow
// control per link and virtual channel (one VC per message class), switches with per-egress
// queues and egress-port backpressure (EP-BP), devices with a processing rate, and Aurelia's
// end-to-end congestion control: switches mark packets EPN when their egress saw more EP-BP
// events in a window than a threshold, receivers echo EPN and set OVERLOAD in their responses,
// senders cut their rate through the two-signal controller (plexus/netmodel/rate_controller.hpp).
// With congestion control off it is "vanilla CXL": credits only. Deterministic for a seed.
//
//   auto fabric = cxl::Fabric::FatTree(4);
//   std::vector<cxl::Transfer> t = {{.src = a, .dst = b, .op = cxl::Op::kWrite, .bytes = 1 << 20}};
//   cxl::SimOptions o;  o.cc.enabled = true;
//   auto r = cxl::Simulate(*fabric, t, o);   // r->pauses, r->finish_ns, r->latency_p99_ns
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "plexus/netmodel/cxl_fabric.hpp"
#include "plexus/netmodel/rate_controller.hpp"

namespace plexus::netmodel::cxl {

inline constexpr int kFlitBytes = 256;

// One direction of a cable.
struct LinkOptions {
  double bytes_per_s = 256e9;  // PCIe 6.0 x16 per direction (ch. 4.4.1, Figure 4.1)
  double wire_ns = 11.5;       // PHY and cable
  int retimers = 1;            // one per 500 mm of reach (ch. 4.5); rack links: 1
  double retimer_ns = 20;      // per retimer (ch. 4.5)
  int credits_per_vc = 256;    // receive buffer per link and VC, in flits
  // 0: a freed receive slot's credit returns on its own, one link latency later. > 0: the
  // receiver returns the credits freed so far together every credit_update_ns (PCIe's UpdateFC
  // timer), so a credit freed just after an update waits up to that long.
  double credit_update_ns = 0;
};

struct CongestionControlOptions {
  bool enabled = false;  // false: vanilla CXL, point-to-point credits only
  bool epn = true;       // switches mark EPN, receivers echo it
  bool overload = true;  // receivers set OVERLOAD when senders outpace them
  // A switch egress marks the packets it sends while it counted more than `bp_threshold` EP-BP
  // events (pauses: data queued, no credits) in the last `bp_window_ns`.
  double bp_window_ns = 1000;
  int bp_threshold = 8;
  // A receiver sets OVERLOAD on the responses it sends while more than this many flits wait for
  // its processing (arrivals outpace its processing rate).
  int overload_backlog_flits = 32;
  // Per flow (source, destination, class) at the sender: the controller's defaults but a floor of
  // 1/64 of line rate, below a flow's fair share in a 16-to-1 incast (1/16).
  RateControllerOptions rate{.min_factor = 1.0 / 64};
  // A recovery step every tick_ns without a cut; a flow is cut at most once per tick_ns.
  double tick_ns = 2000;
};

// The fabric manager at run time: at `t_ns`, install `ports` at switch `sw` toward `dst`
// (Fabric::InsertRoute), or remove that route when `ports` is empty.
struct RouteChange {
  double t_ns = 0;
  FanId sw;
  FanId dst;
  std::vector<int> ports;
};

// What one virtual channel of a link carries: its own credits, egress queue and input FIFO.
enum class CreditPools : uint8_t {
  kPerClass,     // one per message class (the specification's VCs): classes never block each other
  kPerProtocol,  // one per protocol: CXL.mem's classes (requests, write data, read data,
                 // completions) share one, CXL.io another; the seed's vanilla CXL "performs
                 // point-to-point flow control for packets of each CXL protocol" (ch. 4.4)
};

struct SimOptions {
  LinkOptions link;
  CreditPools credit_pools = CreditPools::kPerClass;
  double switch_ns = 70;         // one switch traversal (ch. 4.5)
  double port_ns = 67.5;         // a device's CXL port, at each end of a path
  int flit_payload_bytes = 240;  // 15 slots of 16 B in a 256 B flit
  int header_bytes = 16;         // one slot per message header
  int message_data_bytes = 64;   // a cache line per data message
  int packet_flits = 4;          // the unit of routing and of responses
  // A device's processing rate (line rate): a received flit costs its 256 B, a flit of read
  // requests the data they read when that is more (a cache line each).
  double device_bytes_per_s = 256e9;
  std::vector<std::pair<FanId, double>> device_rates;  // per-device overrides
  // A device's request packets in flight (a CXL device's bounded tags): past this many sent and
  // not yet answered it sends no new request. 0: no limit.
  int max_outstanding_packets = 0;
  // A switch's receive buffer per input link and VC is one FIFO: a flit reaches its egress queue
  // only when every flit that arrived before it on that link and VC has left (head-of-line
  // blocking). false: each flit joins its egress queue on arrival (virtual output queues).
  bool input_fifo = false;
  RoutingPolicy routing = RoutingPolicy::kPortId;  // the spec's baseline
  double adaptive_sample_ns = 500;  // age of the backpressure levels adaptive routing reads
  CongestionControlOptions cc;
  uint64_t seed = 1;
  double max_time_ns = 1e10;               // give up (DeadlineExceeded) past this simulated time
  std::vector<RouteChange> route_changes;  // applied to a copy of the fabric, in time order
  bool trace_rates = false;                // record every rate change (SimResult::rate_trace)
};

// kWrite: M2S RwD messages, answered by S2M NDR; kRead: M2S Req, answered by S2M DRS carrying
// the data (data flows dst -> src); kUio: CXL.io unordered I/O writes, answered by a no-data
// completion (carried as NDR).
enum class Op : uint8_t { kWrite, kRead, kUio };

struct Transfer {
  FanId src;
  FanId dst;
  Op op = Op::kWrite;
  int64_t bytes = 0;
  double start_ns = 0;     // earliest start
  std::vector<int> after;  // earlier transfers that must finish first
  double gap_ns = 0;       // then this long (compute between phases)
};

struct LinkStats {
  int64_t flits = 0;
  int64_t pauses = 0;     // times the link stopped with data queued and no credits
  double paused_ns = 0;   // time spent so
  int64_t epn_marks = 0;  // packets it marked (switch egress)
};

struct RateChange {
  double t_ns = 0;
  FanId src;
  FanId dst;
  double factor = 1;
  TwoSignalRateController::Cause cause = TwoSignalRateController::Cause::kNone;
  bool cut = false;  // a cut (else a recovery step)
};

struct SimResult {
  double makespan_ns = 0;
  std::vector<double> finish_ns;  // per transfer: its last response received
  std::vector<LinkStats> links;   // per Fabric link
  int64_t pauses = 0;             // over all links
  int64_t switch_pauses = 0;      // at switch egress ports (EP-BP events)
  int64_t epn_marked = 0;         // packets marked by switches
  int64_t congestion_cuts = 0;    // rate cuts by EPN
  int64_t overload_cuts = 0;      // rate cuts by OVERLOAD
  double one_way_p50_ns = 0;      // request packets: first flit sent -> last flit received
  double one_way_max_ns = 0;
  double latency_p50_ns = 0;  // request packet sent -> its response received
  double latency_p99_ns = 0;
  int64_t flits = 0;  // flit transmissions over all links
  int64_t events = 0;
  double wall_s = 0;
  double events_per_s = 0;
  std::vector<RateChange> rate_trace;  // with SimOptions::trace_rates
};

// Runs the transfers on the fabric. InvalidArgument naming the transfer for an end that is not
// a device, bytes <= 0, a dependency that is not an earlier transfer; naming the field for bad
// options; DeadlineExceeded when traffic is left at max_time_ns.
absl::StatusOr<SimResult> Simulate(const Fabric& fabric, const std::vector<Transfer>& transfers,
                                   const SimOptions& options);

}  // namespace plexus::netmodel::cxl

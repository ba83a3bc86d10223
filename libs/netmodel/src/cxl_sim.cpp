#include "plexus/netmodel/cxl_sim.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <deque>
#include <limits>
#include <queue>
#include <random>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace plexus::netmodel::cxl {
namespace {

using Cause = TwoSignalRateController::Cause;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int kMaxHops = 8;

enum EventType : uint8_t { kTry, kReach, kProcessed, kStart, kRoute };

struct Event {
  double t;
  uint64_t seq;
  int32_t a;
  uint8_t type;
  uint64_t b;
};
struct Later {
  bool operator()(const Event& x, const Event& y) const {
    return x.t != y.t ? x.t > y.t : x.seq > y.seq;
  }
};

struct Packet {
  int transfer = 0;
  int src = 0;  // nodes
  int dst = 0;
  MessageClass cls = MessageClass::kM2SRwD;
  int flits = 0;
  int messages = 0;
  bool response = false;
  bool epn = false;
  bool overload = false;
  double sent_ns = 0;  // the request's first flit
  int processed = 0;
  std::array<int8_t, kMaxHops> port{};
};

// A flit waiting at an egress: its packet, index, the switch hop it is at, and the link whose
// receive buffer (credit) it holds (-1 at its source device).
struct Entry {
  uint32_t packet;
  uint16_t flit;
  uint8_t hop;
  int32_t in_link;
};

uint64_t PackFlit(uint32_t packet, uint16_t flit, uint8_t hop) {
  return uint64_t{packet} << 24 | uint64_t{flit} << 8 | hop;
}

struct LinkState {
  int from = 0, to = 0;
  bool from_switch = false, to_switch = false;
  double reach_ns = 0;  // after serialization: to the far node's next stage
  double credit_delay_ns = 0;
  // Credits on their way back, by arrival time (one delay per link: in order). They count from
  // their time on; a link that waits for them is woken then, others take them when they next try.
  std::array<std::deque<double>, kMessageClasses> credit_due;
  double credit_wake_at = -1;
  double busy_until = 0;
  double wake_at = kInf;  // a pending pacing wake-up
  double tail_at = -1;    // the time of the pending try at a flit's end, or -1
  std::array<std::deque<Entry>, kMessageClasses> q;
  std::array<int, kMessageClasses> credits{};
  int rr = 0;
  bool paused = false;
  double paused_since = 0;
  std::deque<double> bp;  // EP-BP event times within the window
  LinkStats stats;
};

struct DeviceState {
  int link = 0;
  double ns_per_byte = 0;  // processing rate
  std::deque<Entry> proc;
  bool processing = false;
  std::vector<int> active;  // transfers with messages left to send
  size_t rr = 0;
  int outstanding = 0;  // request packets sent and not yet answered (tags in use)
};

struct TransferState {
  int src = 0, dst = 0;
  int64_t messages_left = 0;
  int packets_sent = 0, packets_done = 0;
  int cur_packet = -1;
  int cur_flit = 0;
  int flow = 0;
  int deps_left = 0;
  std::vector<int> dependents;
  bool done = false;
};

struct FlowState {
  TwoSignalRateController rate;
  double next_ns = 0;  // the rate limiter's next send
  double next_tick = kInf;
  double last_cut = -kInf;
  FanId src, dst;
};

class Engine {
 public:
  // The fabric is copied: the fabric manager's route changes apply to this run's copy.
  Engine(const Fabric& f, const std::vector<Transfer>& t, const SimOptions& o)
      : fabric_(f), transfers_(t), o_(o), rng_(o.seed) {}

  absl::StatusOr<SimResult> Run();

 private:
  void Push(double t, EventType type, int32_t a, uint64_t b = 0) {
    heap_.push({t, seq_++, a, static_cast<uint8_t>(type), b});
  }
  // The packet's virtual channel (SimOptions::credit_pools). Per protocol, a CXL.io transfer's
  // completions stay in CXL.io's pool (they travel as NDR-sized messages).
  int VcOf(const Packet& p) const {
    if (o_.credit_pools == CreditPools::kPerClass) return static_cast<int>(p.cls);
    const bool io = p.cls == MessageClass::kUio || transfers_[p.transfer].op == Op::kUio;
    return static_cast<int>(io ? Protocol::kIo : Protocol::kMem);
  }
  void Try(int l);
  void ReturnCredit(int l, int vc, double at);
  void WakeForCredit(int l, double at);
  bool TryDevice(int l, LinkState& L, bool& has_data);
  void Transmit(int l, const Entry& e);
  void Reach(int l, uint64_t packed);
  void Processed(int node);
  double ProcessNs(const DeviceState& d, const Entry& e) const;
  void Delivered(int node, Packet& p);
  void Start(int t);
  void FormPacket(int t);
  void ApplyTicks(FlowState& f);
  void Signal(FlowState& f, Cause cause);
  void Trace(const FlowState& f, double t, bool cut);
  const std::vector<int>& Levels(int sw);

  Fabric fabric_;
  const std::vector<Transfer>& transfers_;
  const SimOptions& o_;
  std::mt19937_64 rng_;
  std::priority_queue<Event, std::vector<Event>, Later> heap_;
  uint64_t seq_ = 0;
  double now_ = 0;
  double ser_ns_ = 0;
  int data_per_flit_ = 0, header_per_flit_ = 0;
  std::vector<LinkState> links_;
  // SimOptions::input_fifo: per link into a switch and VC, the flits in its receive buffer in
  // arrival order; only the head is in an egress queue.
  std::vector<std::array<std::deque<Entry>, kMessageClasses>> in_fifo_;
  std::vector<int> device_of_;  // node -> DeviceState index, -1
  std::vector<DeviceState> devices_;
  DeviceState line_;  // a device at line rate: the pacer's cost of a flit
  std::vector<TransferState> ts_;
  std::vector<FlowState> flows_;
  std::vector<Packet> packets_;
  std::vector<std::vector<int>> levels_;
  std::vector<double> levels_at_;
  std::vector<double> one_way_, latency_;
  absl::Status error_;
  SimResult r_;
};

void Engine::Trace(const FlowState& f, double t, bool cut) {
  if (o_.trace_rates)
    r_.rate_trace.push_back({t, f.src, f.dst, f.rate.factor(), f.rate.cause(), cut});
}

void Engine::ApplyTicks(FlowState& f) {
  while (f.rate.cause() != Cause::kNone && f.next_tick <= now_) {
    f.rate.Tick();
    Trace(f, f.next_tick, false);
    f.next_tick += o_.cc.tick_ns;
  }
}

void Engine::Signal(FlowState& f, Cause cause) {
  ApplyTicks(f);
  if (now_ - f.last_cut < o_.cc.tick_ns) return;  // one cut per tick period
  if (cause == Cause::kOverload) {
    f.rate.OnOverload();
    ++r_.overload_cuts;
  } else {
    f.rate.OnCongestion();
    ++r_.congestion_cuts;
  }
  f.last_cut = now_;
  f.next_tick = now_ + o_.cc.tick_ns;
  Trace(f, now_, true);
}

const std::vector<int>& Engine::Levels(int sw) {
  if (now_ - levels_at_[sw] >= o_.adaptive_sample_ns || levels_[sw].empty()) {
    levels_at_[sw] = now_;
    const int ports = static_cast<int>(fabric_.node(sw).ports.size());
    levels_[sw].assign(ports, 0);
    for (int p = 0; p < ports; ++p) {
      LinkState& L = links_[fabric_.LinkOf(sw, p)];
      while (!L.bp.empty() && L.bp.front() <= now_ - o_.cc.bp_window_ns) L.bp.pop_front();
      const int n = static_cast<int>(L.bp.size());
      // The 2-bit EP-BP level: none, up to half the threshold, up to it, above it.
      levels_[sw][p] = n == 0                        ? 0
                       : n * 2 <= o_.cc.bp_threshold ? 1
                       : n <= o_.cc.bp_threshold     ? 2
                                                     : 3;
    }
  }
  return levels_[sw];
}

void Engine::FormPacket(int t) {
  TransferState& s = ts_[t];
  const Transfer& tr = transfers_[t];
  Packet p;
  p.transfer = t;
  p.src = s.src;
  p.dst = s.dst;
  const int64_t cap = int64_t{o_.packet_flits} * data_per_flit_;
  p.messages = static_cast<int>(std::min(s.messages_left, cap));
  s.messages_left -= p.messages;
  if (tr.op == Op::kRead) {
    p.cls = MessageClass::kM2SReq;
    p.flits = (p.messages + header_per_flit_ - 1) / header_per_flit_;
  } else {
    p.cls = tr.op == Op::kUio ? MessageClass::kUio : MessageClass::kM2SRwD;
    p.flits = (p.messages + data_per_flit_ - 1) / data_per_flit_;
  }
  s.cur_packet = static_cast<int>(packets_.size());
  s.cur_flit = 0;
  ++s.packets_sent;
  packets_.push_back(p);
}

// A device's egress: responses first (they free the other side), then data flows in turn, each
// paced by its rate.
bool Engine::TryDevice(int l, LinkState& L, bool& has_data) {
  for (int i = 0; i < kMessageClasses; ++i) {
    const int vc = (L.rr + i) % kMessageClasses;
    if (L.q[vc].empty()) continue;
    has_data = true;
    if (L.credits[vc] > 0) {
      L.rr = (vc + 1) % kMessageClasses;
      const Entry e = L.q[vc].front();
      L.q[vc].pop_front();
      Transmit(l, e);
      return true;
    }
  }
  DeviceState& d = devices_[device_of_[L.from]];
  double earliest = kInf;
  const size_t n = d.active.size();
  for (size_t i = 0; i < n; ++i) {
    const size_t at = (d.rr + i) % n;
    const int t = d.active[at];
    TransferState& s = ts_[t];
    if (s.cur_packet < 0) FormPacket(t);
    FlowState& f = flows_[s.flow];
    if (f.next_ns > now_) {
      earliest = std::min(earliest, f.next_ns);
      continue;
    }
    // A new request needs a free tag; a device out of tags waits for a response (not a pause).
    if (s.cur_flit == 0 && o_.max_outstanding_packets > 0 &&
        d.outstanding >= o_.max_outstanding_packets) {
      continue;
    }
    has_data = true;
    Packet& p = packets_[s.cur_packet];
    if (L.credits[VcOf(p)] == 0) continue;
    const Entry e{static_cast<uint32_t>(s.cur_packet), static_cast<uint16_t>(s.cur_flit), 0, -1};
    if (s.cur_flit == 0) {
      p.sent_ns = now_;
      ++d.outstanding;
    }
    double factor = 1;
    if (o_.cc.enabled) {
      ApplyTicks(f);
      factor = f.rate.factor();
    }
    // The flow's rate limiter: a flit's worth of line rate, or for read requests the data they
    // ask for (a requester takes data no faster than its link), scaled by the rate factor.
    f.next_ns = now_ + ProcessNs(line_, e) / factor;
    if (++s.cur_flit == p.flits) {
      s.cur_packet = -1;
      if (s.messages_left == 0) {
        d.active.erase(d.active.begin() + static_cast<std::ptrdiff_t>(at));
        d.rr = d.active.empty() ? 0 : at % d.active.size();
      } else {
        d.rr = (at + 1) % n;
      }
    }
    Transmit(l, e);
    return true;
  }
  if (earliest < kInf && !(L.wake_at > now_ && L.wake_at <= earliest)) {
    L.wake_at = earliest;
    Push(earliest, kTry, l);
  }
  return false;
}

void Engine::WakeForCredit(int l, double at) {
  LinkState& L = links_[l];
  if (L.credit_wake_at > now_ && L.credit_wake_at <= at) return;  // an earlier wake is pending
  L.credit_wake_at = at;
  Push(at, kTry, l);
}

void Engine::ReturnCredit(int l, int vc, double at) {
  LinkState& L = links_[l];
  if (o_.link.credit_update_ns > 0) {
    at = std::ceil(at / o_.link.credit_update_ns) * o_.link.credit_update_ns;
  }
  L.credit_due[vc].push_back(at);
  if (L.paused) WakeForCredit(l, at);
}

void Engine::Try(int l) {
  LinkState& L = links_[l];
  if (L.busy_until > now_) {  // the end of the current flit tries again
    if (L.tail_at != L.busy_until) {
      L.tail_at = L.busy_until;
      Push(L.busy_until, kTry, l, 1);
    }
    return;
  }
  for (int vc = 0; vc < kMessageClasses; ++vc) {
    auto& due = L.credit_due[vc];
    while (!due.empty() && due.front() <= now_) {
      due.pop_front();
      ++L.credits[vc];
    }
  }
  bool has_data = false;
  if (!L.from_switch) {
    if (TryDevice(l, L, has_data)) return;
  } else {
    for (int i = 0; i < kMessageClasses; ++i) {
      const int vc = (L.rr + i) % kMessageClasses;
      if (L.q[vc].empty()) continue;
      has_data = true;
      if (L.credits[vc] == 0) continue;
      L.rr = (vc + 1) % kMessageClasses;
      const Entry e = L.q[vc].front();
      L.q[vc].pop_front();
      Transmit(l, e);
      return;
    }
  }
  if (has_data) {
    // Wake at the first credit on its way back (any VC: the one that frees the link is among
    // them); later returns wake it themselves.
    double first = kInf;
    for (const auto& due : L.credit_due) {
      if (!due.empty()) first = std::min(first, due.front());
    }
    if (first < kInf) WakeForCredit(l, first);
  }
  if (has_data && !L.paused) {
    // Data queued and no credit for any of it: a pause (an EP-BP event at a switch).
    L.paused = true;
    L.paused_since = now_;
    ++L.stats.pauses;
    ++r_.pauses;
    if (L.from_switch) {
      ++r_.switch_pauses;
      while (!L.bp.empty() && L.bp.front() <= now_ - o_.cc.bp_window_ns) L.bp.pop_front();
      L.bp.push_back(now_);
    }
  }
}

void Engine::Transmit(int l, const Entry& e) {
  LinkState& L = links_[l];
  Packet& p = packets_[e.packet];
  const int vc = VcOf(p);
  --L.credits[vc];
  L.busy_until = now_ + ser_ns_;
  ++L.stats.flits;
  ++r_.flits;
  if (L.paused) {
    L.paused = false;
    L.stats.paused_ns += now_ - L.paused_since;
  }
  uint8_t hop = e.hop;
  if (L.from_switch) {
    if (o_.cc.enabled && o_.cc.epn) {
      while (!L.bp.empty() && L.bp.front() <= now_ - o_.cc.bp_window_ns) L.bp.pop_front();
      if (static_cast<int>(L.bp.size()) > o_.cc.bp_threshold && !p.epn) {
        p.epn = true;
        ++L.stats.epn_marks;
        ++r_.epn_marked;
      }
    }
    const LinkState& in = links_[e.in_link];
    ReturnCredit(e.in_link, vc, now_ + in.credit_delay_ns);
    ++hop;
  }
  int next_out = -1;  // input FIFO: the link of the flit that is now its buffer's head
  if (L.from_switch && o_.input_fifo) {
    auto& fifo = in_fifo_[e.in_link][vc];
    fifo.pop_front();
    if (!fifo.empty()) {
      const Entry& h = fifo.front();
      next_out = fabric_.LinkOf(L.from, packets_[h.packet].port[h.hop]);
      links_[next_out].q[vc].push_back(h);
    }
  }
  Push(now_ + ser_ns_ + L.reach_ns, kReach, l, PackFlit(e.packet, e.flit, hop));
  // Try again when this flit is out, unless nothing waits (an arrival then schedules it).
  bool more = false;
  for (const auto& q : L.q) more = more || !q.empty();
  if (!L.from_switch) more = more || !devices_[device_of_[L.from]].active.empty();
  if (more && L.tail_at != L.busy_until) {
    L.tail_at = L.busy_until;
    Push(L.busy_until, kTry, l, 1);
  }
  if (next_out >= 0) Try(next_out);
}

void Engine::Reach(int l, uint64_t packed) {
  const uint32_t pid = static_cast<uint32_t>(packed >> 24);
  const uint16_t flit = static_cast<uint16_t>(packed >> 8);
  const uint8_t hop = static_cast<uint8_t>(packed);
  Packet& p = packets_[pid];
  const int node = links_[l].to;
  if (links_[l].to_switch) {
    if (hop >= kMaxHops) {
      error_ = absl::InternalError(absl::StrCat("packet to ", FormatFanId(fabric_.node(p.dst).id),
                                                " crossed more than ", kMaxHops, " switches"));
      return;
    }
    int port = p.port[hop];
    if (flit == 0) {
      const FlowKey key{fabric_.node(p.src).id, fabric_.node(p.dst).id, ProtocolOf(p.cls), p.cls};
      static const std::vector<int> kNoLevels;
      const std::vector<int>& levels =
          o_.routing == RoutingPolicy::kAdaptive ? Levels(node) : kNoLevels;
      port = fabric_.SelectPort(node, key, o_.routing, o_.seed, rng_, levels);
      if (port < 0) {
        error_ = absl::InternalError(absl::StrCat("switch ", FormatFanId(fabric_.node(node).id),
                                                  " has no route to ", FormatFanId(key.dst)));
        return;
      }
      p.port[hop] = static_cast<int8_t>(port);
    }
    const Entry e{pid, flit, hop, l};
    if (o_.input_fifo) {
      auto& fifo = in_fifo_[l][VcOf(p)];
      fifo.push_back(e);
      if (fifo.size() > 1) return;  // behind the head, whatever its egress
    }
    const int out = fabric_.LinkOf(node, port);
    links_[out].q[VcOf(p)].push_back(e);
    Try(out);
    return;
  }
  DeviceState& d = devices_[device_of_[node]];
  d.proc.push_back({pid, flit, hop, l});
  if (!p.response && flit + 1 == p.flits) one_way_.push_back(now_ - p.sent_ns);
  if (!d.processing) {
    d.processing = true;
    Push(now_ + ProcessNs(d, d.proc.front()), kProcessed, node);
  }
}

// A flit costs its 256 bytes at the device's rate; a flit of read requests costs the data they
// read, when that is more.
double Engine::ProcessNs(const DeviceState& d, const Entry& e) const {
  const Packet& p = packets_[e.packet];
  double bytes = kFlitBytes;
  if (p.cls == MessageClass::kM2SReq) {
    const int in_flit =
        e.flit + 1 < p.flits ? header_per_flit_ : p.messages - header_per_flit_ * (p.flits - 1);
    bytes = std::max(bytes, static_cast<double>(in_flit) * o_.message_data_bytes);
  }
  return bytes * d.ns_per_byte;
}

void Engine::Processed(int node) {
  DeviceState& d = devices_[device_of_[node]];
  const Entry e = d.proc.front();
  d.proc.pop_front();
  Packet& p = packets_[e.packet];
  ReturnCredit(e.in_link, VcOf(p), now_ + links_[e.in_link].credit_delay_ns);
  if (++p.processed == p.flits) Delivered(node, p);
  if (d.proc.empty()) {
    d.processing = false;
  } else {
    Push(now_ + ProcessNs(d, d.proc.front()), kProcessed, node);
  }
}

void Engine::Delivered(int node, Packet& p) {
  DeviceState& d = devices_[device_of_[node]];
  if (!p.response) {
    Packet r;
    r.transfer = p.transfer;
    r.src = node;
    r.dst = p.src;
    r.messages = p.messages;
    r.response = true;
    r.sent_ns = p.sent_ns;
    if (p.cls == MessageClass::kM2SReq) {
      r.cls = MessageClass::kS2MDrs;
      r.flits = (r.messages + data_per_flit_ - 1) / data_per_flit_;
    } else {
      r.cls = MessageClass::kS2MNdr;
      r.flits = (r.messages + header_per_flit_ - 1) / header_per_flit_;
    }
    if (o_.cc.enabled) {
      r.epn = o_.cc.epn && p.epn;  // echoed
      r.overload = o_.cc.overload && static_cast<int>(d.proc.size()) > o_.cc.overload_backlog_flits;
    }
    const uint32_t rid = static_cast<uint32_t>(packets_.size());
    packets_.push_back(r);
    LinkState& L = links_[d.link];
    for (int f = 0; f < r.flits; ++f) {
      L.q[VcOf(r)].push_back({rid, static_cast<uint16_t>(f), 0, -1});
    }
    Try(d.link);
    return;
  }
  TransferState& s = ts_[p.transfer];
  ++s.packets_done;
  latency_.push_back(now_ - p.sent_ns);
  if (--d.outstanding == o_.max_outstanding_packets - 1 && !d.active.empty()) Try(d.link);
  if (o_.cc.enabled && (p.epn || p.overload)) {
    Signal(flows_[s.flow], p.overload ? Cause::kOverload : Cause::kCongestion);
  }
  if (s.messages_left == 0 && s.cur_packet < 0 && s.packets_done == s.packets_sent) {
    s.done = true;
    r_.finish_ns[p.transfer] = now_;
    r_.makespan_ns = std::max(r_.makespan_ns, now_);
    for (int dep : s.dependents) {
      if (--ts_[dep].deps_left == 0) {
        Push(std::max(transfers_[dep].start_ns, now_ + transfers_[dep].gap_ns), kStart, dep);
      }
    }
  }
}

void Engine::Start(int t) {
  DeviceState& d = devices_[device_of_[ts_[t].src]];
  d.active.push_back(t);
  Try(d.link);
}

absl::StatusOr<SimResult> Engine::Run() {
  const auto wall_start = std::chrono::steady_clock::now();
  ser_ns_ = kFlitBytes * 1e9 / o_.link.bytes_per_s;
  data_per_flit_ = o_.flit_payload_bytes / (o_.header_bytes + o_.message_data_bytes);
  header_per_flit_ = o_.flit_payload_bytes / o_.header_bytes;
  const double prop = o_.link.wire_ns + o_.link.retimers * o_.link.retimer_ns;
  links_.resize(fabric_.links());
  if (o_.input_fifo) in_fifo_.resize(fabric_.links());
  for (int l = 0; l < fabric_.links(); ++l) {
    LinkState& L = links_[l];
    L.from = fabric_.LinkSource(l);
    const Port& port = fabric_.node(L.from).ports[fabric_.LinkSourcePort(l)];
    L.to = port.peer;
    L.from_switch = fabric_.node(L.from).kind != NodeKind::kDevice;
    L.to_switch = fabric_.node(L.to).kind != NodeKind::kDevice;
    // A device's port pipeline at each end of a path; a switch's traversal at the far end.
    L.reach_ns =
        prop + (L.from_switch ? 0 : o_.port_ns) + (L.to_switch ? o_.switch_ns : o_.port_ns);
    L.credit_delay_ns = prop;
    L.credits.fill(o_.link.credits_per_vc);
  }
  line_.ns_per_byte = 1e9 / o_.link.bytes_per_s;
  device_of_.assign(fabric_.nodes(), -1);
  for (int n : fabric_.devices()) {
    device_of_[n] = static_cast<int>(devices_.size());
    DeviceState d;
    d.link = fabric_.LinkOf(n, 0);
    double rate = o_.device_bytes_per_s;
    for (const auto& [id, bps] : o_.device_rates) {
      if (id == fabric_.node(n).id) rate = bps;
    }
    d.ns_per_byte = 1e9 / rate;
    devices_.push_back(std::move(d));
  }
  levels_.resize(fabric_.nodes());
  levels_at_.assign(fabric_.nodes(), -kInf);
  ts_.resize(transfers_.size());
  r_.finish_ns.assign(transfers_.size(), 0);
  absl::flat_hash_map<uint64_t, int> flow_index;
  for (size_t t = 0; t < transfers_.size(); ++t) {
    const Transfer& tr = transfers_[t];
    TransferState& s = ts_[t];
    s.src = fabric_.NodeOf(tr.src).value();
    s.dst = fabric_.NodeOf(tr.dst).value();
    s.messages_left = (tr.bytes + o_.message_data_bytes - 1) / o_.message_data_bytes;
    const MessageClass cls = tr.op == Op::kRead  ? MessageClass::kM2SReq
                             : tr.op == Op::kUio ? MessageClass::kUio
                                                 : MessageClass::kM2SRwD;
    const FlowKey key{tr.src, tr.dst, ProtocolOf(cls), cls};
    auto [it, fresh] = flow_index.try_emplace(key.Pack(), static_cast<int>(flows_.size()));
    if (fresh) {
      FlowState f;
      f.rate = TwoSignalRateController::Create(o_.cc.rate).value();
      f.src = tr.src;
      f.dst = tr.dst;
      flows_.push_back(std::move(f));
    }
    s.flow = it->second;
    s.deps_left = static_cast<int>(tr.after.size());
    for (int dep : tr.after) ts_[dep].dependents.push_back(static_cast<int>(t));
    if (s.deps_left == 0) Push(tr.start_ns, kStart, static_cast<int32_t>(t));
  }
  for (size_t c = 0; c < o_.route_changes.size(); ++c) {
    Push(o_.route_changes[c].t_ns, kRoute, static_cast<int32_t>(c));
  }
  while (!heap_.empty() && error_.ok()) {
    if (heap_.top().t > o_.max_time_ns) break;
    const Event ev = heap_.top();
    heap_.pop();
    now_ = ev.t;
    ++r_.events;
    switch (ev.type) {
      case kTry:
        if (links_[ev.a].wake_at == now_) links_[ev.a].wake_at = kInf;
        if (ev.b == 1) {
          if (links_[ev.a].tail_at != now_) break;  // superseded by a later one
          links_[ev.a].tail_at = -1;
        }
        Try(ev.a);
        break;
      case kReach:
        Reach(ev.a, ev.b);
        break;
      case kProcessed:
        Processed(ev.a);
        break;
      case kStart:
        Start(ev.a);
        break;
      case kRoute: {
        const RouteChange& c = o_.route_changes[ev.a];
        error_ = c.ports.empty() ? fabric_.RemoveRoute(c.sw, c.dst)
                                 : fabric_.InsertRoute(c.sw, c.dst, c.ports);
        if (!error_.ok()) {
          error_ = absl::InvalidArgumentError(
              absl::StrCat("CXL simulation: route_changes[", ev.a, "]: ", error_.message()));
        }
        break;
      }
    }
  }
  if (!error_.ok()) return error_;
  for (size_t t = 0; t < ts_.size(); ++t) {
    if (!ts_[t].done) {
      if (!heap_.empty()) {
        return absl::DeadlineExceededError(absl::StrCat(
            "CXL simulation: transfer ", t, " (", FormatFanId(transfers_[t].src), " -> ",
            FormatFanId(transfers_[t].dst), ") not done at max_time_ns ", o_.max_time_ns));
      }
      return absl::InternalError(
          absl::StrCat("CXL simulation: transfer ", t, " (", FormatFanId(transfers_[t].src), " -> ",
                       FormatFanId(transfers_[t].dst), ") never finished: the fabric deadlocked"));
    }
  }
  for (LinkState& L : links_) {
    if (L.paused) L.stats.paused_ns += now_ - L.paused_since;
    r_.links.push_back(L.stats);
  }
  const auto pct = [](std::vector<double>& v, double q) {
    if (v.empty()) return 0.0;
    const size_t i = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size()))) - 1;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(i), v.end());
    return v[i];
  };
  r_.one_way_p50_ns = pct(one_way_, 0.5);
  r_.one_way_max_ns = pct(one_way_, 1.0);
  r_.latency_p50_ns = pct(latency_, 0.5);
  r_.latency_p99_ns = pct(latency_, 0.99);
  r_.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  r_.events_per_s = r_.wall_s > 0 ? static_cast<double>(r_.events) / r_.wall_s : 0;
  return std::move(r_);
}

bool Finite(double v) { return std::isfinite(v); }

absl::Status Validate(const Fabric& fabric, const std::vector<Transfer>& transfers,
                      const SimOptions& o) {
  const auto bad = [](const std::string& field, auto value, const std::string& want) {
    return absl::InvalidArgumentError(
        absl::StrCat("CXL simulation: ", field, " must be ", want, ", got ", value));
  };
  if (!(o.link.bytes_per_s > 0) || !Finite(o.link.bytes_per_s)) {
    return bad("link.bytes_per_s", o.link.bytes_per_s, "> 0");
  }
  if (!(o.link.wire_ns >= 0) || !(o.link.retimer_ns >= 0) || o.link.retimers < 0) {
    return bad("link.wire_ns, retimer_ns and retimers", o.link.wire_ns, ">= 0");
  }
  if (o.link.credits_per_vc < 1) return bad("link.credits_per_vc", o.link.credits_per_vc, ">= 1");
  if (!(o.link.credit_update_ns >= 0) || !Finite(o.link.credit_update_ns)) {
    return bad("link.credit_update_ns", o.link.credit_update_ns, ">= 0 and finite");
  }
  if (!(o.switch_ns >= 0) || !(o.port_ns >= 0))
    return bad("switch_ns and port_ns", o.switch_ns, ">= 0");
  if (o.header_bytes < 1 || o.message_data_bytes < 1 ||
      o.flit_payload_bytes < o.header_bytes + o.message_data_bytes ||
      o.flit_payload_bytes > kFlitBytes) {
    return bad("flit_payload_bytes", o.flit_payload_bytes,
               "<= 256 and hold one header plus one message's data");
  }
  if (o.packet_flits < 1 || o.packet_flits > 1024) {
    return bad("packet_flits", o.packet_flits, "in [1, 1024]");
  }
  if (!(o.device_bytes_per_s > 0)) return bad("device_bytes_per_s", o.device_bytes_per_s, "> 0");
  for (const auto& [id, bps] : o.device_rates) {
    if (!(bps > 0)) return bad(absl::StrCat("device_rates[", FormatFanId(id), "]"), bps, "> 0");
  }
  if (!(o.cc.bp_window_ns > 0) || !(o.cc.tick_ns > 0)) {
    return bad("cc.bp_window_ns and cc.tick_ns", o.cc.bp_window_ns, "> 0");
  }
  if (o.max_outstanding_packets < 0) {
    return bad("max_outstanding_packets", o.max_outstanding_packets, ">= 0 (0: no limit)");
  }
  if (o.cc.bp_threshold < 0) return bad("cc.bp_threshold", o.cc.bp_threshold, ">= 0");
  if (absl::Status s = ValidateRateControllerOptions(o.cc.rate); !s.ok()) return s;
  for (size_t c = 0; c < o.route_changes.size(); ++c) {
    if (!(o.route_changes[c].t_ns >= 0) || !Finite(o.route_changes[c].t_ns)) {
      return bad(absl::StrCat("route_changes[", c, "].t_ns"), o.route_changes[c].t_ns, ">= 0");
    }
  }
  for (size_t t = 0; t < transfers.size(); ++t) {
    const Transfer& tr = transfers[t];
    for (FanId end : {tr.src, tr.dst}) {
      auto n = fabric.NodeOf(end);
      if (!n.ok() || fabric.node(*n).kind != NodeKind::kDevice) {
        return absl::InvalidArgumentError(absl::StrCat("CXL simulation: transfer ", t, ": ",
                                                       FormatFanId(end), " is not a device"));
      }
    }
    if (tr.src == tr.dst) {
      return absl::InvalidArgumentError(
          absl::StrCat("CXL simulation: transfer ", t, ": source and destination are one device"));
    }
    if (tr.bytes <= 0 || !(tr.start_ns >= 0) || !(tr.gap_ns >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CXL simulation: transfer ", t, ": bytes must be > 0, start_ns and gap_ns >= 0"));
    }
    for (int dep : tr.after) {
      if (dep < 0 || dep >= static_cast<int>(t)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "CXL simulation: transfer ", t, " waits for ", dep, ", not an earlier transfer"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SimResult> Simulate(const Fabric& fabric, const std::vector<Transfer>& transfers,
                                   const SimOptions& options) {
  if (absl::Status s = Validate(fabric, transfers, options); !s.ok()) return s;
  Engine engine(fabric, transfers, options);
  return engine.Run();
}

}  // namespace plexus::netmodel::cxl

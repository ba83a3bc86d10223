// Tracing of a communicator's calls (trace.hpp, tracer.hpp): the ring of records and the Chrome
// trace-event output.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "plexus/base/env.hpp"
#include "plexus/base/file.hpp"
#include "plexus/base/log.hpp"
#include "plexus/base/status.hpp"
#include "tracer.hpp"

namespace plexus::collectives {

CollectiveTrace Communicator::Trace() const { return {}; }

std::string Communicator::TraceJson() const { return ToChromeTraceJson(Trace()); }

const char* TracePathName(TracePath path) {
  switch (path) {
    case TracePath::kLocal:
      return "local";
    case TracePath::kMailbox:
      return "mailbox";
    case TracePath::kPlan:
      return "plan";
  }
  return "?";
}

namespace {

std::string Hex(uint64_t v) {
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(v));
  return text;
}

std::string EventName(const TraceEvent& e) {
  if (!e.kind.has_value()) return "refused";
  if (*e.kind == CollectiveKind::kSendRecv) return e.is_send ? "send" : "recv";
  return std::string(CollectiveName(*e.kind));
}

}  // namespace

std::string ToChromeTraceJson(const CollectiveTrace& trace) {
  using nlohmann::json;
  // One thread lane per communicator within the rank's process lane (31 bits: Chrome's tid).
  const int64_t tid = static_cast<int64_t>(trace.communicator & 0x7FFFFFFF);
  json events = json::array();
  events.push_back(
      {{"name", "process_name"},
       {"ph", "M"},
       {"pid", trace.rank},
       {"args", {{"name", absl::StrCat("rank ", trace.rank, " (", trace.host, ")")}}}});
  events.push_back({{"name", "process_sort_index"},
                    {"ph", "M"},
                    {"pid", trace.rank},
                    {"args", {{"sort_index", trace.rank}}}});
  events.push_back(
      {{"name", "thread_name"},
       {"ph", "M"},
       {"pid", trace.rank},
       {"tid", tid},
       {"args",
        {{"name", absl::StrCat("communicator ", trace.tag, " ", Hex(trace.communicator))}}}});
  for (const TraceEvent& e : trace.events) {
    json args = {{"seq", e.sequence},
                 {"bytes", e.bytes},
                 {"count", e.count},
                 {"dtype", std::string(DataTypeName(e.dtype))},
                 {"algorithm", std::string(AlgorithmName(e.algorithm))},
                 {"path", TracePathName(e.path)},
                 {"channels", e.channels},
                 {"messages", e.messages},
                 {"issue_ns", e.issue_ns},
                 {"start_ns", e.start_ns},
                 {"end_ns", e.end_ns},
                 {"queued_us", static_cast<double>(e.start_ns - e.issue_ns) / 1e3},
                 {"status", std::string(absl::StatusCodeToString(e.status.code()))}};
    if (e.kind.has_value() &&
        (*e.kind == CollectiveKind::kAllReduce || *e.kind == CollectiveKind::kReduce ||
         *e.kind == CollectiveKind::kReduceScatter)) {
      args["op"] = std::string(ReduceOpName(e.op));
    }
    if (e.root >= 0) args["root"] = e.root;
    if (e.peer >= 0) args["peer"] = e.peer;
    if (e.wire.has_value()) args["wire"] = std::string(DataTypeName(*e.wire));
    if (!e.status.ok()) args["error"] = std::string(e.status.message());
    if (!e.peers.empty()) {
      json peers = json::array();
      for (const TracePeerStep& p : e.peers) {
        peers.push_back({{"peer", p.peer},
                         {"first_send_ns", p.first_send_ns},
                         {"last_recv_ns", p.last_recv_ns},
                         {"sends", p.sends},
                         {"recvs", p.recvs}});
      }
      args["peers"] = std::move(peers);
    }
    events.push_back({{"name", EventName(e)},
                      {"cat", e.status.ok() ? "collective" : "collective,failed"},
                      {"ph", "X"},
                      {"pid", trace.rank},
                      {"tid", tid},
                      {"ts", static_cast<double>(e.start_ns) / 1e3},
                      {"dur", static_cast<double>(e.end_ns - e.start_ns) / 1e3},
                      {"args", std::move(args)}});
  }
  json doc = {{"traceEvents", std::move(events)},
              {"displayTimeUnit", "ns"},
              {"otherData",
               {{"plexus_collectives_trace", 1},
                {"enabled", trace.enabled},
                {"rank", trace.rank},
                {"size", trace.size},
                {"communicator", Hex(trace.communicator)},
                {"tag", trace.tag},
                {"host", trace.host},
                {"pid", trace.pid},
                {"clock", "monotonic"},
                {"anchor_monotonic_ns", trace.anchor_monotonic_ns},
                {"anchor_wall_ns", trace.anchor_wall_ns},
                {"capacity", trace.capacity},
                {"recorded", trace.recorded},
                {"dropped", trace.dropped}}}};
  // Replace invalid UTF-8 (an error message quoting bytes) rather than throw.
  return doc.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace internal {
namespace {

const base::Param<std::string> kTraceParam(
    "PLEXUS_COLL_TRACE", "",
    "trace every communicator's calls and write <value>.<rank>.json at destruction");
const base::Param<bool> kTracePeersParam(
    "PLEXUS_COLL_TRACE_PEERS", false,
    "traced calls also record per peer their first send and last receive");
const base::Param<int64_t> kTraceCapacityParam(
    "PLEXUS_COLL_TRACE_CAPACITY", static_cast<int64_t>(kDefaultTraceCapacity),
    "calls a communicator's trace keeps (the oldest are dropped beyond it)");

constexpr size_t kMaxTraceCapacity = size_t{1} << 24;

}  // namespace

absl::StatusOr<TraceOptions> Tracer::Resolve(const TraceOptions& options, int rank) {
  PLEXUS_ASSIGN_OR_RETURN(const std::string env_prefix, kTraceParam.Get());
  PLEXUS_ASSIGN_OR_RETURN(const int64_t env_capacity, kTraceCapacityParam.Get());
  PLEXUS_ASSIGN_OR_RETURN(const bool env_peers, kTracePeersParam.Get());
  TraceOptions o = options;
  o.peer_steps = o.peer_steps || env_peers;
  if (o.path_prefix.empty()) o.path_prefix = env_prefix;
  o.enabled = o.enabled || !o.path_prefix.empty();
  if (o.capacity == 0) {
    if (env_capacity < 1 || static_cast<uint64_t>(env_capacity) > kMaxTraceCapacity) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", rank, ": ",
                                                     kTraceCapacityParam.name(), "=", env_capacity,
                                                     ": must be 1 to ", kMaxTraceCapacity));
    }
    o.capacity = static_cast<size_t>(env_capacity);
  } else if (o.capacity > kMaxTraceCapacity) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, ": trace.capacity ", o.capacity,
                                                   " is above ", kMaxTraceCapacity));
  }
  return o;
}

std::unique_ptr<Tracer> Tracer::Create(const TraceOptions& o, int rank, int size,
                                       uint64_t communicator, std::string tag, std::string host) {
  if (!o.enabled) return nullptr;
  std::unique_ptr<Tracer> tracer(new Tracer());
  tracer->options_ = o;
  if (!o.path_prefix.empty()) {
    tracer->file_ = tag == "coll"
                        ? absl::StrCat(o.path_prefix, ".", rank, ".json")
                        : absl::StrCat(o.path_prefix, ".", Hex(communicator), ".", rank, ".json");
  }
  CollectiveTrace& h = tracer->header_;
  h.enabled = true;
  h.rank = rank;
  h.size = size;
  h.communicator = communicator;
  h.tag = std::move(tag);
  h.host = std::move(host);
  h.pid = static_cast<int64_t>(::getpid());
  h.capacity = o.capacity;
  // Both clocks read back to back: the mapping between them is good to a few hundred ns.
  h.anchor_monotonic_ns = Now();
  h.anchor_wall_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
  tracer->ring_.reserve(std::min<size_t>(o.capacity, 1024));
  if (o.peer_steps) tracer->peer_steps_.resize(static_cast<size_t>(size));
  return tracer;
}

void Tracer::Begin(int64_t issued_ns) {
  current_ = TraceEvent();
  current_.start_ns = Now();
  current_.issue_ns = issued_ns != 0 ? issued_ns : current_.start_ns;
}

void Tracer::Describe(const CallHeader& header, int peer) {
  current_.kind = header.kind;
  current_.sequence = header.sequence;
  current_.dtype = header.dtype;
  current_.op = header.op;
  current_.algorithm = header.algorithm;
  current_.root = header.root;
  current_.count = header.count;
  current_.peer = peer;
  current_.is_send = header.kind == CollectiveKind::kSendRecv && header.sender == header_.rank;
  uint64_t bytes = header.count * DataTypeSize(header.dtype);
  if (header.kind == CollectiveKind::kAllGather || header.kind == CollectiveKind::kReduceScatter ||
      header.kind == CollectiveKind::kAllToAll) {
    bytes *= static_cast<uint64_t>(header_.size);
  }
  current_.bytes = bytes;
}

void Tracer::NotePlan(const Plan& plan) {
  current_.path = TracePath::kPlan;
  current_.wire = plan.wire;
  uint64_t used = 0;  // bit c: channel c carries a message (channels are at most 64)
  for (const auto& op : plan.sends) used |= uint64_t{1} << (op.channel & 63);
  for (const auto& op : plan.recvs) used |= uint64_t{1} << (op.channel & 63);
  current_.channels = __builtin_popcountll(used);
  for (TracePeerStep& p : peer_steps_) p = TracePeerStep();
  current_.messages = static_cast<uint32_t>(plan.sends.size() + plan.recvs.size());
}

void Tracer::End(const absl::Status& status) {
  current_.end_ns = Now();
  current_.status = status;
  if (current_.path == TracePath::kPlan) {
    for (size_t r = 0; r < peer_steps_.size(); ++r) {
      const TracePeerStep& p = peer_steps_[r];
      if (p.sends == 0 && p.recvs == 0) continue;
      current_.peers.push_back(p);
      current_.peers.back().peer = static_cast<int>(r);
    }
  }
  Push(std::move(current_));
}

void Tracer::Refused(int64_t issued_ns, const absl::Status& status) {
  TraceEvent e;
  e.start_ns = e.end_ns = Now();
  e.issue_ns = issued_ns != 0 ? issued_ns : e.start_ns;
  e.status = status;
  Push(std::move(e));
}

void Tracer::Push(TraceEvent event) {
  std::lock_guard<std::mutex> lock(mu_);
  ++recorded_;
  if (ring_.size() < options_.capacity) {
    ring_.push_back(std::move(event));
    return;
  }
  ring_[next_] = std::move(event);
  next_ = (next_ + 1) % ring_.size();
}

CollectiveTrace Tracer::Snapshot() const {
  CollectiveTrace t = header_;
  std::lock_guard<std::mutex> lock(mu_);
  t.recorded = recorded_;
  t.dropped = recorded_ - ring_.size();
  t.events.reserve(ring_.size());
  // Before the ring wrapped next_ is 0; after, it indexes the oldest record.
  for (size_t i = 0; i < ring_.size(); ++i) t.events.push_back(ring_[(next_ + i) % ring_.size()]);
  return t;
}

void Tracer::WriteIfAsked() const {
  if (file_.empty()) return;
  const CollectiveTrace trace = Snapshot();
  if (absl::Status s = base::WriteFileAtomic(file_, ToChromeTraceJson(trace)); !s.ok()) {
    base::Logf(base::LogLevel::kWarning,
               "[plexus-coll rank %d] cannot write the collectives trace: %s", header_.rank,
               std::string(s.message()).c_str());
    return;
  }
  if (trace.dropped > 0) {
    base::Logf(base::LogLevel::kWarning,
               "[plexus-coll rank %d] trace %s: %llu of %llu calls dropped (capacity %zu; "
               "raise PLEXUS_COLL_TRACE_CAPACITY)",
               header_.rank, file_.c_str(), static_cast<unsigned long long>(trace.dropped),
               static_cast<unsigned long long>(trace.recorded), trace.capacity);
  }
}

}  // namespace internal
}  // namespace plexus::collectives

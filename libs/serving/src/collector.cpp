// The driver's collector of completions and drops (collector.hpp).
#include "collector.hpp"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace plexus::serving::internal {

Collector::Collector(const Topology& topology)
    : topology_(topology),
      sinks_(topology.problem.operators.size()),
      retried_(topology.sources.size()) {}

absl::Status Collector::Complete(rpc::ServerContext&, const wire::Completion& request, wire::Ack*) {
  if (request.op < 0 || static_cast<size_t>(request.op) >= sinks_.size() ||
      !topology_.sink[request.op]) {
    return absl::InvalidArgumentError(
        absl::StrCat("completion for operator ", request.op, ", which is not a sink"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (frozen_) return absl::OkStatus();
  if (request.epoch != epoch_) return absl::OkStatus();  // a replaced deployment's
  Sink& sink = sinks_[request.op];
  if (!sink.done.insert({request.sources, request.request_id, request.part}).second) {
    bool retried = false;
    for (size_t s = 0; s < retried_.size(); ++s) {
      if ((request.sources >> s & 1) != 0 && retried_[s].contains(request.request_id)) {
        retried = true;
      }
    }
    ++(retried ? retried_repeats_ : sink.duplicates);
    return absl::OkStatus();
  }
  ++sink.parts_done[{request.sources, request.request_id}];
  sink.completions.push_back(
      {request.sources, request.request_id, request.injected_ns, request.done_ns, request.part});
  ++completions_;
  return absl::OkStatus();
}

absl::Status Collector::Dropped(rpc::ServerContext&, const wire::Drop& request, wire::Ack*) {
  std::lock_guard<std::mutex> lock(mu_);
  if (frozen_) return absl::OkStatus();
  if (request.epoch != epoch_) return absl::OkStatus();  // a replaced deployment's
  drops_.push_back({request.op, request.sources, request.request_id, std::string(request.reason),
                    request.retryable, request.part});
  return absl::OkStatus();
}

void Collector::BeginEpoch(uint32_t epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  epoch_ = epoch;
  drops_.erase(
      std::remove_if(drops_.begin(), drops_.end(), [](const DropRecord& d) { return d.retryable; }),
      drops_.end());
}

void Collector::MarkRetried(const std::vector<std::pair<int, uint64_t>>& retried) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [s, id] : retried) retried_[s].insert(id);
}

int64_t Collector::RetriedRepeats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return retried_repeats_;
}

void Collector::Freeze() {
  std::lock_guard<std::mutex> lock(mu_);
  frozen_ = true;
}

void Collector::AddDrop(DropRecord drop) {
  std::lock_guard<std::mutex> lock(mu_);
  if (frozen_) return;
  drops_.push_back(std::move(drop));
}

std::vector<Collector::Sink> Collector::Sinks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sinks_;
}

std::vector<DropRecord> Collector::Drops() const {
  std::lock_guard<std::mutex> lock(mu_);
  return drops_;
}

int64_t Collector::Completions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return completions_;
}

std::vector<int64_t> Collector::LatenciesNs() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(completions_));
  for (const Sink& sink : sinks_) {
    for (const CompletionRecord& c : sink.completions) out.push_back(c.done_ns - c.injected_ns);
  }
  return out;
}

}  // namespace plexus::serving::internal

// QoS time windows: the schedule (plexus/collectives/qos.hpp) and the executor's send gate
// (qos_gate.hpp).
#include <time.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "call_env.hpp"
#include "connection_set.hpp"
#include "plexus/base/env.hpp"
#include "plexus/base/status.hpp"
#include "plexus/collectives/qos.hpp"
#include "qos_gate.hpp"

namespace plexus::collectives {
namespace {

std::string Ms(absl::Duration d) { return absl::FormatDuration(d); }

std::string WindowText(const QosWindow& w) {
  return absl::StrCat(w.kind == QosWindow::kAllow ? "allow=" : "deny=", Ms(w.begin), "-",
                      Ms(w.end));
}

}  // namespace

absl::Status QosTimetable::Validate() const {
  if (epoch < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("qos.epoch must be >= 0, got ", Ms(epoch)));
  }
  if (epoch == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError("qos.epoch must be finite");
  }
  if (gate_every < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("qos.gate_every must be >= 1, got ", gate_every));
  }
  if (!enabled() && !windows.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("qos has ", windows.size(), " window(s) but no epoch (qos.epoch = 0)"));
  }
  for (size_t i = 0; i < windows.size(); ++i) {
    const QosWindow& w = windows[i];
    if (w.begin < absl::ZeroDuration() || w.end > epoch || w.begin >= w.end) {
      return absl::InvalidArgumentError(absl::StrCat("qos.windows[", i, "] (", WindowText(w),
                                                     ") must satisfy 0 <= begin < end <= epoch (",
                                                     Ms(epoch), ")"));
    }
  }
  return absl::OkStatus();
}

bool QosTimetable::AllowsAt(absl::Duration t) const {
  if (!enabled()) return true;
  bool any_allow = false, in_allow = false;
  for (const QosWindow& w : windows) {
    const bool inside = t >= w.begin && t < w.end;
    if (w.kind == QosWindow::kDeny) {
      if (inside) return false;
    } else {
      any_allow = true;
      in_allow = in_allow || inside;
    }
  }
  return in_allow || !any_allow;
}

absl::Duration QosTimetable::UntilAllowed(absl::Duration t) const {
  if (AllowsAt(t)) return absl::ZeroDuration();
  // The allowed set changes only at window boundaries: the next allowed instant is the first
  // boundary after t (within one epoch, wrapping) that is allowed.
  absl::Duration best = absl::InfiniteDuration();
  for (const QosWindow& w : windows) {
    for (absl::Duration edge : {w.begin, w.end}) {
      const absl::Duration at = edge == epoch ? absl::ZeroDuration() : edge;
      absl::Duration wait = at - t;
      if (wait <= absl::ZeroDuration()) wait += epoch;
      if (wait < best && AllowsAt(at)) best = wait;
    }
  }
  return best;
}

absl::Duration QosTimetable::EpochPosition(absl::Duration now) const {
  if (!enabled()) return absl::ZeroDuration();
  absl::Duration r =
      absl::Nanoseconds(absl::ToInt64Nanoseconds(now + phase) % absl::ToInt64Nanoseconds(epoch));
  if (r < absl::ZeroDuration()) r += epoch;
  return r;
}

std::string QosTimetable::ToString() const {
  if (!enabled()) return "off";
  std::vector<std::string> parts = {absl::StrCat("epoch=", Ms(epoch))};
  for (const QosWindow& w : windows) parts.push_back(WindowText(w));
  if (gate_every != 1) parts.push_back(absl::StrCat("every=", gate_every));
  if (phase != absl::ZeroDuration()) parts.push_back(absl::StrCat("phase=", Ms(phase)));
  return absl::StrJoin(parts, ";");
}

absl::StatusOr<QosTimetable> ParseQosTimetable(std::string_view text) {
  QosTimetable s;
  const absl::string_view trimmed =
      absl::StripAsciiWhitespace(absl::string_view(text.data(), text.size()));
  if (trimmed.empty() || trimmed == "off") return s;
  bool have_epoch = false;
  for (absl::string_view field : absl::StrSplit(trimmed, ';', absl::SkipWhitespace())) {
    field = absl::StripAsciiWhitespace(field);
    const std::pair<std::string, std::string> kv = absl::StrSplit(field, absl::MaxSplits('=', 1));
    const std::string& key = kv.first;
    const std::string what = absl::StrCat("qos field '", std::string(field), "'");
    if (key == "epoch" || key == "phase") {
      PLEXUS_ASSIGN_OR_RETURN(absl::Duration d, base::ParseDurationValue(kv.second, what));
      (key == "epoch" ? s.epoch : s.phase) = d;
      have_epoch = have_epoch || key == "epoch";
    } else if (key == "allow" || key == "deny") {
      const std::vector<std::string> range = absl::StrSplit(kv.second, absl::MaxSplits('-', 1));
      if (range.size() != 2) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": expected ", key, "=<begin>-<end> (e.g. ", key, "=0ms-5ms)"));
      }
      QosWindow w;
      w.kind = key == "allow" ? QosWindow::kAllow : QosWindow::kDeny;
      PLEXUS_ASSIGN_OR_RETURN(w.begin, base::ParseDurationValue(range[0], what));
      PLEXUS_ASSIGN_OR_RETURN(w.end, base::ParseDurationValue(range[1], what));
      s.windows.push_back(w);
    } else if (key == "every") {
      int64_t k = 0;
      if (!absl::SimpleAtoi(kv.second, &k) || k < 1 || k > (int64_t{1} << 30)) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": expected every=<k>, k >= 1"));
      }
      s.gate_every = static_cast<int>(k);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": unknown field (epoch, allow, deny, every, phase)"));
    }
  }
  if (!have_epoch) {
    return absl::InvalidArgumentError(
        absl::StrCat("qos schedule '", std::string(trimmed), "' has no epoch=<duration> field"));
  }
  if (s.epoch <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("qos schedule '", std::string(trimmed), "': epoch must be positive"));
  }
  PLEXUS_RETURN_IF_ERROR(s.Validate());
  return s;
}

absl::Duration MonotonicNow() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return absl::Seconds(ts.tv_sec) + absl::Nanoseconds(ts.tv_nsec);
}

namespace internal {
namespace {

const base::Param<std::string> kQosParam(
    "PLEXUS_COLL_QOS", "",
    "QoS time windows of every communicator, e.g. epoch=20ms;allow=0ms-15ms;every=1 (off: none); "
    "overrides CommunicatorOptions::qos");

}  // namespace

absl::StatusOr<QosTimetable> ResolveQosTimetable(const QosTimetable& option) {
  PLEXUS_ASSIGN_OR_RETURN(const std::string text, kQosParam.Get());
  if (!text.empty()) {
    absl::StatusOr<QosTimetable> parsed = ParseQosTimetable(text);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(kQosParam.name(), ": ", std::string(parsed.status().message())));
    }
    return parsed;
  }
  PLEXUS_RETURN_IF_ERROR(option.Validate());
  return option;
}

absl::Status CallEnv::AdmitSend(const CallHeader& header) const {
  auto progress = [this](absl::Duration max_block) { conns->Progress(max_block); };
  return qos->Admit(timeout, wait, progress, [&] { return header.Describe(); });
}

QosGate::QosGate(QosTimetable schedule, int rank) : schedule_(std::move(schedule)), rank_(rank) {}

absl::Status QosGate::Admit(absl::Duration timeout, const base::WaitPolicy& wait,
                            absl::FunctionRef<void(absl::Duration)> progress,
                            absl::FunctionRef<std::string()> call) {
  const uint64_t number = sends_++;
  if (number % static_cast<uint64_t>(schedule_.gate_every) != 0) return absl::OkStatus();
  ++checks_;
  absl::Duration now = MonotonicNow();
  absl::Duration until = schedule_.UntilAllowed(schedule_.EpochPosition(now));
  if (until == absl::ZeroDuration()) {
    RecordAdmission(now);
    return absl::OkStatus();
  }
  ++waits_;
  const absl::Duration start = now;
  // Never allowed, or not before the call's timeout: fail now rather than wait for nothing.
  PLEXUS_RETURN_IF_ERROR(Unreachable(now, until, timeout, call));
  // Wait: spin only for what the policy allows, then yield, then block in the transport's
  // progress (bytes keep moving; it returns early on I/O) until the window opens.
  for (;;) {
    now = MonotonicNow();
    until = schedule_.UntilAllowed(schedule_.EpochPosition(now));
    if (until == absl::ZeroDuration()) break;
    const base::WaitPolicy::Phase phase = wait.At(now - start);
    if (phase == base::WaitPolicy::Phase::kSpin && until < wait.spin()) continue;
    if (phase != base::WaitPolicy::Phase::kSleep && until < wait.sleep_after()) {
      base::WaitPolicy::Yield(/*can_sleep=*/false);  // a short wait: always yield
      continue;
    }
    progress(std::min(until, absl::Milliseconds(1)));
  }
  waited_ns_ += absl::ToInt64Nanoseconds(now - start);
  RecordAdmission(now);
  return absl::OkStatus();
}

void QosGate::RecordAdmission(absl::Duration now) {
  if (record_limit_ == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (admissions_.size() < record_limit_) admissions_.push_back(now);
}

absl::Status QosGate::Unreachable(absl::Duration now, absl::Duration until, absl::Duration timeout,
                                  absl::FunctionRef<std::string()> call) const {
  if (until != absl::InfiniteDuration() && until <= timeout) return absl::OkStatus();
  return absl::DeadlineExceededError(absl::StrCat(
      call(), " on rank ", rank_, ": the communicator's QoS schedule (", schedule_.ToString(),
      ") denies sends at ", absl::FormatDuration(schedule_.EpochPosition(now)),
      " into the epoch and ",
      until == absl::InfiniteDuration()
          ? std::string("allows no instant of it")
          : absl::StrCat("opens its next allowed window in ", absl::FormatDuration(until)),
      ", beyond the call's timeout of ", absl::FormatDuration(timeout)));
}

absl::Status QosGate::CheckReachable(absl::Duration timeout,
                                     absl::FunctionRef<std::string()> call) const {
  const absl::Duration now = MonotonicNow();
  return Unreachable(now, schedule_.UntilAllowed(schedule_.EpochPosition(now)), timeout, call);
}

void QosGate::Posted() {
  if (record_limit_ == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (posts_.size() < record_limit_) posts_.push_back(MonotonicNow());
}

void QosGate::Record(size_t limit) {
  std::lock_guard<std::mutex> lock(mu_);
  record_limit_ = limit;
  posts_.clear();
  posts_.reserve(limit);
  admissions_.clear();
  admissions_.reserve(limit);
}

std::vector<absl::Duration> QosGate::admissions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return admissions_;
}

std::vector<absl::Duration> QosGate::posts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return posts_;
}

QosGate::Stats QosGate::stats() const {
  return Stats{sends_.load(), checks_.load(), waits_.load(), absl::Nanoseconds(waited_ns_.load())};
}

}  // namespace internal
}  // namespace plexus::collectives

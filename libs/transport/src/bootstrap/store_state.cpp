#include "bootstrap/store_state.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace plexus::transport::store_protocol {

StoreState::StoreState(std::string job_id, bool job_id_is_nonce, std::string address)
    : job_id_(std::move(job_id)), job_id_is_nonce_(job_id_is_nonce), address_(std::move(address)) {}

bool StoreState::AllPresent(const std::vector<std::string>& keys) const {
  for (const std::string& k : keys) {
    if (!data_.contains(k)) return false;
  }
  return true;
}

Response StoreState::Satisfied(const Request& req) const {
  Response r;
  r.op = req.op;
  if (req.op == Op::kGet) r.value = data_.at(req.keys[0]);
  return r;
}

Response StoreState::TimedOut(const Request& req) const {
  Response r;
  r.op = req.op;
  r.code = Code::kTimeout;
  std::vector<std::string> missing;
  for (const std::string& k : req.keys) {
    if (!data_.contains(k)) missing.push_back(absl::StrCat("'", k, "'"));
  }
  r.value = absl::StrCat("missing ", missing.size() == 1 ? "key " : "keys ",
                         absl::StrJoin(missing, ", "));
  return r;
}

StoreState::Outcome StoreState::Handle(int client, Request req, absl::Time now) {
  Outcome out;
  Response r;
  r.op = req.op;
  switch (req.op) {
    case Op::kHello:
      r.number = kVersion;
      r.job = job_id_;
      r.flag = job_id_is_nonce_;
      if (req.version != kVersion) {
        r.code = Code::kInvalid;
        r.value = absl::StrCat("protocol version ", req.version, " is not supported (server ",
                               kVersion, "); use the same plexus build on every rank");
      } else if (std::string why = CheckJob(req.job); !why.empty()) {
        r.code = Code::kRefused;
        r.value = why;
        out.refusal = std::move(why);
      } else {
        out.hello_accepted = true;
      }
      break;
    case Op::kSet:
      data_[req.keys[0]] = std::move(req.value);
      CompleteParked();
      break;
    case Op::kAdd: {
      auto [it, inserted] = data_.try_emplace(req.keys[0], "0");
      int64_t current = 0;
      if (!absl::SimpleAtoi(it->second, &current)) {
        if (inserted) data_.erase(it);
        r.code = Code::kInvalid;
        r.value = absl::StrCat("key '", req.keys[0], "' holds a value that is not a counter");
        break;
      }
      if ((req.delta > 0 && current > std::numeric_limits<int64_t>::max() - req.delta) ||
          (req.delta < 0 && current < std::numeric_limits<int64_t>::min() - req.delta)) {
        r.code = Code::kInvalid;
        r.value = absl::StrCat("counter '", req.keys[0], "' would overflow");
        break;
      }
      r.number = current + req.delta;
      it->second = std::to_string(r.number);
      CompleteParked();
      break;
    }
    case Op::kCheck:
      r.flag = AllPresent(req.keys);
      break;
    case Op::kDelete:
      r.flag = data_.erase(req.keys[0]) > 0;
      break;
    case Op::kGet:
    case Op::kWait:
      if (AllPresent(req.keys)) {
        r = Satisfied(req);
      } else if (req.timeout_ms == 0) {
        r = TimedOut(req);
      } else {
        const absl::Time deadline =
            req.timeout_ms == kNoTimeout
                ? absl::InfiniteFuture()
                : now + absl::Milliseconds(
                            static_cast<int64_t>(std::min<uint64_t>(req.timeout_ms, 1ull << 50)));
        parked_[client] = Parked{std::move(req), deadline};
        return out;
      }
      break;
  }
  out.reply = std::move(r);
  return out;
}

void StoreState::CompleteParked() {
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (AllPresent(it->second.request.keys)) {
      completed_.emplace_back(it->first, Satisfied(it->second.request));
      parked_.erase(it++);
    } else {
      ++it;
    }
  }
}

std::vector<std::pair<int, Response>> StoreState::TakeCompleted() {
  return std::exchange(completed_, {});
}

std::vector<std::pair<int, Response>> StoreState::Expire(absl::Time now) {
  std::vector<std::pair<int, Response>> expired;
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (it->second.deadline <= now) {
      expired.emplace_back(it->first, TimedOut(it->second.request));
      parked_.erase(it++);
    } else {
      ++it;
    }
  }
  return expired;
}

absl::Time StoreState::next_deadline() const {
  absl::Time next = absl::InfiniteFuture();
  for (const auto& [client, p] : parked_) next = std::min(next, p.deadline);
  return next;
}

std::string StoreState::CheckJob(const std::string& client_job) const {
  if (job_id_.empty() || client_job == job_id_) return "";
  if (client_job.empty() && job_id_is_nonce_) return "";  // it learns the nonce from our reply
  const std::string served =
      job_id_is_nonce_
          ? absl::StrCat("a job without a launcher job id (its rank 0 chose nonce '", job_id_, "')")
          : absl::StrCat("job '", job_id_, "'");
  const std::string client = client_job.empty() ? std::string("names no job id")
                                                : absl::StrCat("is job '", client_job, "'");
  return absl::StrCat("the tcp store at ", address_, " serves ", served, ", but this client ",
                      client,
                      ": two jobs share one store address. Give each job its own "
                      "PLEXUS_STORE_ADDR port (or MASTER_PORT), and make every rank of a job "
                      "see the same job id (PLEXUS_JOB_ID, or the launcher's)");
}

}  // namespace plexus::transport::store_protocol

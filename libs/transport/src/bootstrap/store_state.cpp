#include "bootstrap/store_state.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "plexus/transport/store.hpp"

namespace plexus::transport::store_protocol {

StoreState::StoreState(std::string job_id, bool job_id_is_nonce, std::string address,
                       uint64_t max_bytes)
    : job_id_(std::move(job_id)),
      job_id_is_nonce_(job_id_is_nonce),
      address_(std::move(address)),
      max_bytes_(max_bytes) {}

std::string StoreState::CheckRoom(const std::string& key, size_t value_bytes) const {
  uint64_t after = bytes_ + value_bytes;
  if (auto it = data_.find(key); it != data_.end()) {
    after -= it->second.size();
  } else {
    after += key.size() + kEntryOverheadBytes;
  }
  if (after <= max_bytes_ || after <= bytes_) return "";  // a replacement that does not grow
  return absl::StrCat("the tcp store at ", address_, " is full: key '", key.substr(0, 200),
                      "' with a value of ", value_bytes, " bytes would take it to ", after,
                      " bytes, over its cap of ", max_bytes_,
                      " bytes (PLEXUS_STORE_MAX_BYTES on the rank serving it); it holds ", bytes_,
                      " bytes in ", data_.size(), " keys");
}

void StoreState::Store(const std::string& key, std::string value) {
  auto [it, inserted] = data_.try_emplace(key);
  if (inserted) {
    bytes_ += key.size() + kEntryOverheadBytes;
  } else {
    bytes_ -= it->second.size();
  }
  bytes_ += value.size();
  it->second = std::move(value);
  if (failed_key_.empty() && IsJobFailureKey(key)) failed_key_ = key;
}

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
      if (req.version != kVersion) {
        r.code = Code::kInvalid;
        r.value = absl::StrCat("protocol version ", req.version, " is not supported (server ",
                               kVersion, "); use the same plexus build on every rank");
      } else if (std::string why = CheckJob(req.job); !why.empty()) {
        r.code = Code::kRefused;
        r.value = why;
        out.refusal = std::move(why);
      } else {
        // Only a client allowed in learns whom the store serves.
        r.job = job_id_;
        r.flag = job_id_is_nonce_;
        out.hello_accepted = true;
      }
      break;
    case Op::kSet:
      if (std::string full = CheckRoom(req.keys[0], req.value.size()); !full.empty()) {
        r.code = Code::kFull;
        r.value = std::move(full);
        break;
      }
      Store(req.keys[0], std::move(req.value));
      CompleteParked();
      break;
    case Op::kAdd: {
      auto it = data_.find(req.keys[0]);
      int64_t current = 0;
      if (it != data_.end() && !absl::SimpleAtoi(it->second, &current)) {
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
      std::string text = std::to_string(r.number);
      if (std::string full = CheckRoom(req.keys[0], text.size()); !full.empty()) {
        r.code = Code::kFull;
        r.value = std::move(full);
        break;
      }
      Store(req.keys[0], std::move(text));
      CompleteParked();
      break;
    }
    case Op::kCheck:
      r.flag = AllPresent(req.keys);
      break;
    case Op::kDelete:
      if (auto it = data_.find(req.keys[0]); it != data_.end()) {
        bytes_ -= it->first.size() + kEntryOverheadBytes + it->second.size();
        data_.erase(it);
        r.flag = true;
      }
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
  // The served job is not named: a client that could read it here could simply reconnect with it.
  const std::string served = job_id_is_nonce_
                                 ? std::string("a job without a launcher job id")
                                 : std::string("a job whose id differs from this client's");
  const std::string client = client_job.empty() ? std::string("names no job id")
                                                : absl::StrCat("is job '", client_job, "'");
  return absl::StrCat("the tcp store at ", address_, " serves ", served, ", but this client ",
                      client,
                      ": two jobs share one store address, or the ranks of one job see different "
                      "job ids. Give each job its own PLEXUS_STORE_ADDR port (or MASTER_PORT), and "
                      "make every rank of a job see the same job id (PLEXUS_JOB_ID, or the "
                      "launcher's)");
}

}  // namespace plexus::transport::store_protocol

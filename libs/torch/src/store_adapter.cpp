#include "store_adapter.hpp"

#include <algorithm>
#include <chrono>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "plexus/base/wait_policy.hpp"

namespace plexus::torch {
namespace {

// Plexus uses a store from several threads at once (the communicator's blame board writes on a
// thread of its own while another reads its peers' records), but torch 1.13's TCPStore client
// is one socket without a lock: interleaved requests garble each other's replies. Every call
// holds the adapter's lock, and waits poll (each check under the lock) instead of blocking
// inside c10d with the lock held.
class C10dStore final : public transport::Store {
 public:
  explicit C10dStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  absl::Status Set(std::string_view key, std::string_view value) override {
    try {
      std::lock_guard<std::mutex> lock(mu_);
      store_->set(std::string(key), std::vector<uint8_t>(value.begin(), value.end()));
      return absl::OkStatus();
    } catch (const std::exception& e) {
      return Error("set", key, e);
    }
  }

  absl::StatusOr<std::string> Get(std::string_view key, absl::Duration timeout) override {
    try {
      const std::string k(key);
      if (!Await({k}, timeout)) {
        return absl::DeadlineExceededError(absl::StrCat("key '", k, "' is not set in ",
                                                        description(), " after ",
                                                        absl::FormatDuration(timeout)));
      }
      std::lock_guard<std::mutex> lock(mu_);
      const std::vector<uint8_t> value = store_->get(k);
      return std::string(value.begin(), value.end());
    } catch (const std::exception& e) {
      return Error("get", key, e);
    }
  }

  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta) override {
    try {
      std::lock_guard<std::mutex> lock(mu_);
      return store_->add(std::string(key), delta);
    } catch (const std::exception& e) {
      return Error("add", key, e);
    }
  }

  absl::Status Wait(absl::Span<const std::string> keys, absl::Duration timeout) override {
    const std::vector<std::string> k(keys.begin(), keys.end());
    try {
      if (k.empty() || Await(k, timeout)) return absl::OkStatus();
      return absl::DeadlineExceededError(absl::StrCat("keys [", absl::StrJoin(k, ", "),
                                                      "] are not all set in ", description(),
                                                      " after ", absl::FormatDuration(timeout)));
    } catch (const std::exception& e) {
      return Error("wait for", absl::StrJoin(k, ", "), e);
    }
  }

  absl::StatusOr<bool> Check(absl::Span<const std::string> keys) override {
    const std::vector<std::string> k(keys.begin(), keys.end());
    try {
      std::lock_guard<std::mutex> lock(mu_);
      return k.empty() || store_->check(k);
    } catch (const std::exception& e) {
      return Error("check", absl::StrJoin(k, ", "), e);
    }
  }

  absl::StatusOr<bool> Delete(std::string_view key) override {
    try {
      std::lock_guard<std::mutex> lock(mu_);
      return store_->deleteKey(std::string(key));
    } catch (const std::exception& e) {
      return Error("delete", key, e);
    }
  }

  std::string description() const override { return "the torch.distributed store"; }

 private:
  absl::Status Error(std::string_view op, std::string_view key, const std::exception& e) const {
    std::string what = e.what();
    // c10::Error appends a C++ backtrace; the first line is the message.
    if (const size_t nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
    const std::string message = absl::StrCat("cannot ", std::string(op), " key '", std::string(key),
                                             "' in ", description(), ": ", what);
    const std::string lower = absl::AsciiStrToLower(what);
    if (absl::StrContains(lower, "timeout") || absl::StrContains(lower, "timed out")) {
      return absl::DeadlineExceededError(message);
    }
    return absl::UnavailableError(message);
  }

  // Whether every key is set within `timeout` (zero: checked once; c10d itself would read a
  // zero timeout as "wait forever"). c10d errors propagate as exceptions.
  bool Await(const std::vector<std::string>& keys, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    base::Backoff backoff(absl::Milliseconds(1), absl::Milliseconds(50));
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (store_->check(keys)) return true;
      }
      if (!backoff.SleepBefore(deadline)) return false;
    }
  }

  std::mutex mu_;
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace

std::shared_ptr<transport::Store> AdaptStore(c10::intrusive_ptr<c10d::Store> store) {
  return std::make_shared<C10dStore>(std::move(store));
}

}  // namespace plexus::torch

#include "store_adapter.hpp"

#include <algorithm>
#include <chrono>
#include <exception>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace plexus::torch {
namespace {

class C10dStore final : public transport::Store {
 public:
  explicit C10dStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  absl::Status Set(std::string_view key, std::string_view value) override {
    try {
      store_->set(std::string(key), std::vector<uint8_t>(value.begin(), value.end()));
      return absl::OkStatus();
    } catch (const std::exception& e) {
      return Error("set", key, e);
    }
  }

  absl::StatusOr<std::string> Get(std::string_view key, absl::Duration timeout) override {
    try {
      const std::string k(key);
      if (timeout <= absl::ZeroDuration()) {
        // c10d reads a zero timeout as "wait forever": poll instead.
        if (!store_->check({k})) {
          return absl::DeadlineExceededError(
              absl::StrCat("key '", std::string(key), "' is not set in ", description()));
        }
      } else {
        store_->wait({k}, Millis(timeout));
      }
      const std::vector<uint8_t> value = store_->get(k);
      return std::string(value.begin(), value.end());
    } catch (const std::exception& e) {
      return Error("get", key, e);
    }
  }

  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta) override {
    try {
      return store_->add(std::string(key), delta);
    } catch (const std::exception& e) {
      return Error("add", key, e);
    }
  }

  absl::Status Wait(absl::Span<const std::string> keys, absl::Duration timeout) override {
    const std::vector<std::string> k(keys.begin(), keys.end());
    try {
      if (k.empty()) return absl::OkStatus();
      if (timeout <= absl::ZeroDuration()) {
        if (store_->check(k)) return absl::OkStatus();
        return absl::DeadlineExceededError(
            absl::StrCat("keys [", absl::StrJoin(k, ", "), "] are not all set in ", description()));
      }
      store_->wait(k, Millis(timeout));
      return absl::OkStatus();
    } catch (const std::exception& e) {
      return Error("wait for", absl::StrJoin(k, ", "), e);
    }
  }

  absl::StatusOr<bool> Check(absl::Span<const std::string> keys) override {
    const std::vector<std::string> k(keys.begin(), keys.end());
    try {
      return k.empty() || store_->check(k);
    } catch (const std::exception& e) {
      return Error("check", absl::StrJoin(k, ", "), e);
    }
  }

  absl::StatusOr<bool> Delete(std::string_view key) override {
    try {
      return store_->deleteKey(std::string(key));
    } catch (const std::exception& e) {
      return Error("delete", key, e);
    }
  }

  std::string description() const override { return "the torch.distributed store"; }

 private:
  // c10d: 0 ms means no timeout; a finite wait is at least 1 ms.
  static std::chrono::milliseconds Millis(absl::Duration timeout) {
    if (timeout == absl::InfiniteDuration()) return std::chrono::milliseconds(0);
    return std::chrono::milliseconds(std::max<int64_t>(
        1, absl::ToInt64Milliseconds(absl::Ceil(timeout, absl::Milliseconds(1)))));
  }

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

  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace

std::shared_ptr<transport::Store> AdaptStore(c10::intrusive_ptr<c10d::Store> store) {
  return std::make_shared<C10dStore>(std::move(store));
}

}  // namespace plexus::torch

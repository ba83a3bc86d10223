// A view of a store with every key under a prefix: one membership epoch of the runtime, so that
// the rendezvous and communicator of epoch k never meet the keys of epoch k-1.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "plexus/transport/store.hpp"

namespace plexus::moe::runtime {

class PrefixStore final : public transport::Store {
 public:
  PrefixStore(std::shared_ptr<transport::Store> inner, std::string prefix)
      : inner_(std::move(inner)), prefix_(std::move(prefix)) {}
  absl::Status Set(std::string_view key, std::string_view value) override {
    return inner_->Set(Key(key), value);
  }
  absl::StatusOr<std::string> Get(std::string_view key, absl::Duration timeout) override {
    return inner_->Get(Key(key), timeout);
  }
  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta) override {
    return inner_->Add(Key(key), delta);
  }
  absl::Status Wait(absl::Span<const std::string> keys, absl::Duration timeout) override {
    return inner_->Wait(Keys(keys), timeout);
  }
  absl::StatusOr<bool> Check(absl::Span<const std::string> keys) override {
    return inner_->Check(Keys(keys));
  }
  absl::StatusOr<bool> Delete(std::string_view key) override { return inner_->Delete(Key(key)); }
  std::string description() const override {
    return absl::StrCat(inner_->description(), " (keys under '", prefix_, "')");
  }

 private:
  std::string Key(std::string_view key) const {
    return key.empty() ? std::string() : absl::StrCat(prefix_, std::string(key));
  }
  std::vector<std::string> Keys(absl::Span<const std::string> keys) const {
    std::vector<std::string> out;
    for (const std::string& k : keys) out.push_back(Key(k));
    return out;
  }
  std::shared_ptr<transport::Store> inner_;
  std::string prefix_;
};

}  // namespace plexus::moe::runtime

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "plexus/transport/store.hpp"

namespace plexus::transport {
namespace {

class PrefixedStore final : public Store {
 public:
  PrefixedStore(std::shared_ptr<Store> inner, std::string prefix, const std::string& label)
      : inner_(std::move(inner)),
        prefix_(std::move(prefix)),
        description_(absl::StrCat(
            inner_->description(), " (",
            label.empty() ? absl::StrCat("keys under '", prefix_, "'") : label, ")")) {}

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
  std::string description() const override { return description_; }

 private:
  // An empty key stays empty, so that the inner store rejects it as it would unprefixed.
  std::string Key(std::string_view key) const {
    return key.empty() ? std::string() : absl::StrCat(prefix_, std::string(key));
  }
  std::vector<std::string> Keys(absl::Span<const std::string> keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const std::string& k : keys) out.push_back(Key(k));
    return out;
  }

  std::shared_ptr<Store> inner_;
  std::string prefix_;
  std::string description_;
};

}  // namespace

std::shared_ptr<Store> PrefixStore(std::shared_ptr<Store> inner, std::string prefix,
                                   std::string label) {
  return std::make_shared<PrefixedStore>(std::move(inner), std::move(prefix), label);
}

bool IsJobFailureKey(std::string_view key) {
  if (key.substr(0, kJobFailedSegment.size()) == kJobFailedSegment) return true;
  return key.find(absl::StrCat("/", std::string(kJobFailedSegment))) != std::string_view::npos;
}

absl::Status ReportJobFailure(Store& store, int rank, std::string_view why) {
  return store.Set(absl::StrCat(std::string(kJobFailedSegment), rank),
                   why.substr(0, std::min<size_t>(why.size(), 4096)));
}

}  // namespace plexus::transport

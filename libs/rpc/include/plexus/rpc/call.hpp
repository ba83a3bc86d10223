// Client-side call vocabulary: options, metadata, the reply holding a received message, the
// untyped call Channel::StartCall returns, and the typed pending call returned by the async stubs.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace plexus::rpc {

// Per-call key/value pairs sent with a request or response (gRPC's metadata).
using Metadata = std::vector<std::pair<std::string, std::string>>;
using MetadataView = std::vector<std::pair<std::string_view, std::string_view>>;

struct CallOptions {
  // The call fails with DeadlineExceeded after this long (also while waiting for a window slot).
  absl::Duration timeout = absl::InfiniteDuration();
  // While the channel is reconnecting (no replica connected), wait for a connection within the
  // timeout instead of failing at once with Unavailable (gRPC's wait_for_ready).
  bool wait_for_ready = false;
  Metadata metadata = {};
};

// A received message rebuilt in place, with the buffer and arena its views point into.
class InboundMessage {
 public:
  virtual ~InboundMessage() = default;
  const void* message() const { return message_; }
  const MetadataView& metadata() const { return metadata_; }

 protected:
  const void* message_ = nullptr;
  MetadataView metadata_;
};

// A response of type T. Its views stay valid as long as any copy of the Reply lives.
template <typename T>
class Reply {
 public:
  explicit Reply(std::shared_ptr<const InboundMessage> in) : in_(std::move(in)) {}
  const T& operator*() const { return *static_cast<const T*>(in_->message()); }
  const T* operator->() const { return static_cast<const T*>(in_->message()); }
  // Metadata the server attached to the response.
  const MetadataView& metadata() const { return in_->metadata(); }

 private:
  std::shared_ptr<const InboundMessage> in_;
};

namespace internal {
class CallState;
struct CallAccess;
}  // namespace internal

// What a call ends with: the response, or the error (gRPC status codes).
using RawResult = absl::StatusOr<std::shared_ptr<const InboundMessage>>;

// An outstanding untyped call (Channel::StartCall); PendingCall<T> is its typed form. A handle:
// copies refer to the same call. The request (and every buffer its views point to) must stay
// valid until the call completes: it is sent from that memory without a copy.
class RawCall {
 public:
  // Waits for the response or the error. Call once (a second Get fails with
  // FailedPrecondition). While no other thread does, the waiting thread polls the call's
  // connection itself (no hop to another thread).
  RawResult Get();
  // True when the call completed within `timeout`.
  bool WaitFor(absl::Duration timeout);
  // Completes the call with Cancelled (unless it already completed) and tells the server.
  void Cancel();

 private:
  friend struct internal::CallAccess;
  explicit RawCall(std::shared_ptr<internal::CallState> state) : state_(std::move(state)) {}
  std::shared_ptr<internal::CallState> state_;
};

// An outstanding call with a response of type T; see RawCall.
template <typename T>
class PendingCall {
 public:
  explicit PendingCall(RawCall call) : call_(std::move(call)) {}
  // Waits for the response or the error (gRPC status codes). Call once. While no other thread
  // does, the waiting thread polls the call's connection itself (no hop to another thread).
  absl::StatusOr<Reply<T>> Get() {
    RawResult r = call_.Get();
    if (!r.ok()) return r.status();
    return Reply<T>(std::move(*r));
  }
  // True when the call completed within `timeout`.
  bool WaitFor(absl::Duration timeout) { return call_.WaitFor(timeout); }
  // Completes the call with Cancelled (unless it already completed) and tells the server.
  void Cancel() { call_.Cancel(); }

 private:
  RawCall call_;
};

}  // namespace plexus::rpc

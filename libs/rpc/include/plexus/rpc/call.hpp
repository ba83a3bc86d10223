// Client-side call vocabulary: options, metadata, the reply holding a received message, and the
// pending call returned by the async stubs.
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
  Metadata metadata;
  // Set by a server forwarding a call to its peer replica (Server::ForwardTo): the peer serves
  // it and never forwards it again.
  bool forwarded = false;
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
using RawResult = absl::StatusOr<std::shared_ptr<const InboundMessage>>;
// Blocks until the call completed and returns its result (once: it is moved out).
RawResult WaitCall(CallState& call);
bool WaitCallFor(CallState& call, absl::Duration timeout);
void CancelCall(CallState& call);
}  // namespace internal

// An outstanding call. The request (and every buffer its views point to) must stay valid until
// the call completes: it is sent from that memory without a copy.
template <typename T>
class PendingCall {
 public:
  explicit PendingCall(std::shared_ptr<internal::CallState> state) : state_(std::move(state)) {}
  // Waits for the response or the error (gRPC status codes). Call once. While no other thread
  // does, the waiting thread polls the call's connection itself (no hop to another thread).
  absl::StatusOr<Reply<T>> Get() {
    internal::RawResult r = internal::WaitCall(*state_);
    if (!r.ok()) return r.status();
    return Reply<T>(std::move(*r));
  }
  // True when the call completed within `timeout`.
  bool WaitFor(absl::Duration timeout) { return internal::WaitCallFor(*state_, timeout); }
  // Completes the call with Cancelled (unless it already completed) and tells the server.
  void Cancel() { internal::CancelCall(*state_); }

 private:
  std::shared_ptr<internal::CallState> state_;
};

}  // namespace plexus::rpc

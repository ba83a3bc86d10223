// TorchStore: a client of torch 1.13's TCPStore server (bootstrap/torch_store_protocol.hpp). One
// request in flight per socket; concurrent callers take sockets from a pool. A socket whose call
// failed or timed out is closed, never reused: torch 1.13 cannot cancel a WAIT, so a late reply
// would otherwise be read as the answer to the next request.
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bootstrap/store_keys.hpp"
#include "bootstrap/torch_store_protocol.hpp"
#include "plexus/base/net.hpp"
#include "plexus/base/status.hpp"
#include "plexus/base/wait_policy.hpp"
#include "plexus/transport/store.hpp"

namespace plexus::transport {

namespace net = base::net;
namespace ts = torch_store;

struct TorchStore::Impl {
  std::string address;
  absl::Duration io_timeout;
  net::SocketPool sockets;

  std::string Where() const { return absl::StrCat("torch store at ", address); }

  absl::Time IoDeadline() const { return absl::Now() + io_timeout; }

  // What a failed call means for the user: the agent that serves the store went away or hung.
  absl::Status Lost(std::string_view what, const absl::Status& why) const {
    return absl::Status(
        absl::IsDeadlineExceeded(why) ? absl::StatusCode::kDeadlineExceeded
                                      : absl::StatusCode::kUnavailable,
        absl::StrCat(std::string(what), " on the ", Where(),
                     " failed: ", std::string(why.message()),
                     " (did torchrun's agent, which serves this store, exit or hang?)"));
  }

  absl::StatusOr<int> Take() { return sockets.Take(IoDeadline()); }
  void Give(int fd) { sockets.Give(fd); }

  // Sends `request` and reads one reply of `kind`, due by `deadline`. The caller closes `fd`
  // when this fails.
  absl::StatusOr<ts::Decoded> Call(int fd, const std::string& request, ts::Reply kind,
                                   absl::Time deadline) const {
    PLEXUS_RETURN_IF_ERROR(net::SendAll(fd, request.data(), request.size(), IoDeadline()));
    std::string buffer;
    while (true) {
      PLEXUS_ASSIGN_OR_RETURN(
          ts::Decoded d,
          ts::DecodeReply(
              kind,
              absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(buffer.data()), buffer.size()),
              kMaxStoreValueBytes));
      if (d.complete) return d;
      const size_t have = buffer.size();
      buffer.resize(d.needed);
      PLEXUS_RETURN_IF_ERROR(net::RecvAll(fd, buffer.data() + have, d.needed - have, deadline));
    }
  }

  // One request and its reply on a pooled socket, closed on failure.
  absl::StatusOr<ts::Decoded> RoundTrip(std::string_view what, const std::string& request,
                                        ts::Reply kind) {
    auto fd = Take();
    if (!fd.ok()) return Lost(what, fd.status());
    auto reply = Call(*fd, request, kind, IoDeadline());
    if (!reply.ok()) {
      close(*fd);
      return Lost(what, reply.status());
    }
    Give(*fd);
    return reply;
  }

  // WAIT for `keys` until `timeout`; DeadlineExceeded naming the missing keys.
  absl::Status WaitFor(absl::Span<const std::string> keys, absl::Duration timeout, int* kept_fd) {
    *kept_fd = -1;
    const std::string what = absl::StrCat("waiting for ", KeyList(keys));
    auto fd = Take();
    if (!fd.ok()) return Lost(what, fd.status());
    const absl::Time deadline =
        timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
    auto reply = Call(*fd, ts::EncodeWait(keys), ts::Reply::kByte, deadline);
    if (!reply.ok()) {
      close(*fd);
      if (!absl::IsDeadlineExceeded(reply.status()) || absl::Now() < deadline) {
        return Lost(what, reply.status());
      }
      return absl::DeadlineExceededError(
          absl::StrCat(Missing(keys), " not set within ", absl::FormatDuration(timeout), " in the ",
                       Where(), " (did the rank that sets it crash?)"));
    }
    if (reply->byte != ts::kStopWaiting) {
      close(*fd);
      return absl::DataLossError(absl::StrCat("the ", Where(), " answered a WAIT with byte ",
                                              reply->byte, " instead of STOP_WAITING (0)"));
    }
    *kept_fd = *fd;
    return absl::OkStatus();
  }

  static std::string KeyList(absl::Span<const std::string> keys) {
    std::vector<std::string> shown;
    for (size_t i = 0; i < keys.size() && i < 8; ++i)
      shown.push_back(absl::StrCat("'", keys[i], "'"));
    if (keys.size() > 8) shown.push_back(absl::StrCat("and ", keys.size() - 8, " more"));
    return absl::StrCat(keys.size() == 1 ? "key " : "keys ", absl::StrJoin(shown, ", "));
  }

  // "key 'a' was" / "keys 'a', 'b' were": the ones of `keys` still absent (all of them when the
  // store cannot be asked).
  std::string Missing(absl::Span<const std::string> keys) {
    std::vector<std::string> missing;
    for (size_t i = 0; i < keys.size() && i < 64; ++i) {
      auto present = RoundTrip("checking a key", ts::EncodeCheck({keys[i]}), ts::Reply::kByte);
      if (!present.ok() || present->byte != ts::kReady) missing.push_back(keys[i]);
    }
    if (missing.empty()) missing.assign(keys.begin(), keys.end());
    return absl::StrCat(KeyList(missing), missing.size() == 1 ? " was" : " were");
  }
};

absl::StatusOr<std::unique_ptr<TorchStore>> TorchStore::Connect(std::string_view address,
                                                                absl::Duration timeout,
                                                                absl::Duration io_timeout) {
  auto impl = std::make_unique<Impl>();
  impl->address = std::string(address);
  impl->io_timeout = io_timeout;
  PLEXUS_ASSIGN_OR_RETURN(net::SocketAddress resolved,
                          net::ResolveFirst(address, "the torch store address"));
  impl->sockets.set_address(resolved);
  const absl::Time deadline = absl::Now() + timeout;
  base::Backoff backoff(absl::Milliseconds(20), absl::Milliseconds(500));
  int fd = -1;
  while (true) {
    bool retryable = false;
    auto connected = net::ConnectTcp(impl->sockets.address(),
                                     std::min(deadline, impl->IoDeadline()), &retryable);
    if (connected.ok()) {
      fd = *connected;
      break;
    }
    if (!retryable || absl::Now() + backoff.delay() >= deadline) {
      return absl::Status(
          retryable ? absl::StatusCode::kDeadlineExceeded : connected.status().code(),
          absl::StrCat("cannot reach the ", impl->Where(), " within ",
                       absl::FormatDuration(timeout), ": ",
                       std::string(connected.status().message()),
                       " (torchrun's agent serves it at MASTER_ADDR:MASTER_PORT while the job "
                       "runs)"));
    }
    absl::SleepFor(backoff.Next());
  }
  // A CHECK of no keys is answered READY by every torch 1.13 server and by nothing else.
  const absl::Time probe_deadline =
      std::min(deadline, absl::Now() + std::min(io_timeout, absl::Seconds(5)));
  auto probe = impl->Call(fd, ts::EncodeCheck({}), ts::Reply::kByte, probe_deadline);
  if (!probe.ok() || probe->byte != ts::kReady) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        impl->address, " does not answer torch 1.13's TCPStore protocol (a CHECK of no keys got ",
        probe.ok() ? absl::StrCat("byte ", probe->byte) : std::string(probe.status().message()),
        "): it is not torchrun's agent store, or a torch whose store protocol differs. Set "
        "PLEXUS_STORE_ADDR=<host of rank 0>:<free port> to use a plexus store instead"));
  }
  impl->Give(fd);
  return std::unique_ptr<TorchStore>(new TorchStore(std::move(impl)));
}

TorchStore::TorchStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TorchStore::~TorchStore() = default;

std::string TorchStore::description() const { return impl_->Where(); }

absl::Status TorchStore::Set(std::string_view key, std::string_view value) {
  PLEXUS_RETURN_IF_ERROR(bootstrap::CheckKey(key));
  if (value.size() > kMaxStoreValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat("value of key '", std::string(key), "' has ",
                                                   value.size(), " bytes; the limit is ",
                                                   kMaxStoreValueBytes));
  }
  // SET has no reply; the CHECK behind it on the same socket returns once the server has
  // applied the SET, so that Set() means stored (and a dead server is noticed here).
  std::string request = ts::EncodeSet(key, value);
  request += ts::EncodeCheck({});
  PLEXUS_ASSIGN_OR_RETURN(
      auto reply, impl_->RoundTrip(absl::StrCat("Set of key '", std::string(key), "'"), request,
                                   ts::Reply::kByte));
  if (reply.byte != ts::kReady) {
    return absl::DataLossError(absl::StrCat("the ", impl_->Where(), " answered byte ", reply.byte,
                                            " to a CHECK of no keys after Set"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> TorchStore::Get(std::string_view key, absl::Duration timeout) {
  PLEXUS_RETURN_IF_ERROR(bootstrap::CheckKey(key));
  const std::string k(key);
  int fd = -1;
  PLEXUS_RETURN_IF_ERROR(impl_->WaitFor({k}, timeout, &fd));
  auto reply = impl_->Call(fd, ts::EncodeGet(k), ts::Reply::kBytes, impl_->IoDeadline());
  if (!reply.ok()) {
    close(fd);
    return impl_->Lost(absl::StrCat("Get of key '", k, "'"), reply.status());
  }
  impl_->Give(fd);
  return std::move(reply->bytes);
}

absl::StatusOr<int64_t> TorchStore::Add(std::string_view key, int64_t delta) {
  PLEXUS_RETURN_IF_ERROR(bootstrap::CheckKey(key));
  const std::string k(key);
  auto reply = impl_->RoundTrip(absl::StrCat("Add to key '", k, "'"), ts::EncodeAdd(k, delta),
                                ts::Reply::kInt64);
  if (reply.ok()) return reply->value;
  // torch's server closes the connection when the key holds no counter: tell that apart from a
  // server that went away by reading the key.
  auto present = impl_->RoundTrip("checking a key", ts::EncodeCheck({k}), ts::Reply::kByte);
  if (present.ok() && present->byte == ts::kReady) {
    auto value = Get(k, absl::Seconds(1));
    int64_t current = 0;
    if (value.ok() && !absl::SimpleAtoi(*value, &current)) {
      return absl::InvalidArgumentError(
          absl::StrCat("Add to key '", k, "' in the ", impl_->Where(), ": the key holds '",
                       absl::CHexEscape(value->substr(0, 64)), "', not a decimal counter"));
    }
  }
  return reply.status();
}

absl::Status TorchStore::Wait(absl::Span<const std::string> keys, absl::Duration timeout) {
  for (const std::string& k : keys) PLEXUS_RETURN_IF_ERROR(bootstrap::CheckKey(k));
  if (keys.empty()) return absl::OkStatus();
  int fd = -1;
  PLEXUS_RETURN_IF_ERROR(impl_->WaitFor(keys, timeout, &fd));
  impl_->Give(fd);
  return absl::OkStatus();
}

absl::StatusOr<bool> TorchStore::Check(absl::Span<const std::string> keys) {
  for (const std::string& k : keys) PLEXUS_RETURN_IF_ERROR(bootstrap::CheckKey(k));
  PLEXUS_ASSIGN_OR_RETURN(auto reply,
                          impl_->RoundTrip(absl::StrCat("Check of ", Impl::KeyList(keys)),
                                           ts::EncodeCheck(keys), ts::Reply::kByte));
  if (reply.byte == ts::kReady) return true;
  if (reply.byte == ts::kNotReady) return false;
  return absl::DataLossError(absl::StrCat("the ", impl_->Where(), " answered a CHECK with byte ",
                                          reply.byte, " (expected 0 or 1)"));
}

absl::StatusOr<bool> TorchStore::Delete(std::string_view key) {
  PLEXUS_RETURN_IF_ERROR(bootstrap::CheckKey(key));
  const std::string k(key);
  PLEXUS_ASSIGN_OR_RETURN(auto reply, impl_->RoundTrip(absl::StrCat("Delete of key '", k, "'"),
                                                       ts::EncodeDelete(k), ts::Reply::kInt64));
  return reply.value > 0;
}

}  // namespace plexus::transport

// TcpStore: the client. One request in flight per socket; concurrent callers take sockets from a
// pool, so a parked Get never blocks another thread's Set. Every socket starts with a Hello that
// names the job, so a server that is not (or no longer) this job's refuses it.
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bootstrap/store_keys.hpp"
#include "bootstrap/store_protocol.hpp"
#include "plexus/base/net.hpp"
#include "plexus/base/status.hpp"
#include "plexus/base/wait_policy.hpp"
#include "plexus/transport/store.hpp"

namespace plexus::transport {

namespace net = base::net;

namespace proto = store_protocol;

namespace {

// Whether a pooled socket was closed by the server (idle timeout, or the server went away): it
// then reads as end-of-file or an error at once, while a live idle one has nothing to read.
bool ClosedByServer(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  return poll(&p, 1, 0) != 0;
}

}  // namespace

struct TcpStore::Impl {
  std::string address;  // as the user gave it
  net::SocketAddress resolved;
  absl::Duration io_timeout;
  std::string job_id;      // what this client says in its Hello
  std::string server_job;  // what the server said it serves
  bool server_job_nonce = false;
  std::mutex mu;
  std::vector<int> idle;

  ~Impl() {
    for (int fd : idle) close(fd);
  }

  absl::Status Lost(const absl::Status& why) const {
    return absl::UnavailableError(absl::StrCat("lost the connection to the tcp store at ", address,
                                               ": ", std::string(why.message()),
                                               " (did the rank serving it, rank 0, exit or "
                                               "crash?)"));
  }

  absl::StatusOr<int> TakeSocket() {
    {
      std::lock_guard<std::mutex> lock(mu);
      while (!idle.empty()) {
        const int fd = idle.back();
        idle.pop_back();
        if (!ClosedByServer(fd)) return fd;
        close(fd);  // e.g. closed for idleness: open a new one
      }
    }
    bool retryable = false;
    const absl::Time deadline = absl::Now() + io_timeout;
    auto fd = net::ConnectTcp(resolved, deadline, &retryable);
    if (!fd.ok()) return Lost(fd.status());
    // The new socket names the job the server told us at Connect, so that a server replaced by
    // another job's on the same port refuses it instead of serving it that job's keys.
    auto reply = Exchange(*fd, Hello(server_job_nonce ? server_job : job_id), deadline);
    if (!reply.ok()) {
      close(*fd);
      return Lost(reply.status());
    }
    if (reply->code != proto::Code::kOk) {
      close(*fd);
      return absl::FailedPreconditionError(
          absl::StrCat("the tcp store at ", address, " refused a new connection: ", reply->value));
    }
    return fd;
  }

  static proto::Request Hello(const std::string& job) {
    proto::Request hello;
    hello.op = proto::Op::kHello;
    hello.job = job;
    return hello;
  }

  void ReturnSocket(int fd) {
    std::lock_guard<std::mutex> lock(mu);
    idle.push_back(fd);
  }

  // One request/reply exchange on `fd`; the socket is unusable after any error.
  static absl::StatusOr<proto::Response> Exchange(int fd, const proto::Request& request,
                                                  absl::Time deadline) {
    const std::string frame = proto::EncodeRequest(request);
    PLEXUS_RETURN_IF_ERROR(net::SendAll(fd, frame.data(), frame.size(), deadline));
    uint8_t header[proto::kHeaderBytes];
    PLEXUS_RETURN_IF_ERROR(net::RecvAll(fd, header, sizeof header, deadline));
    PLEXUS_ASSIGN_OR_RETURN(auto size,
                            proto::PeekFrame(absl::MakeConstSpan(header, sizeof header)));
    std::string body(size - proto::kHeaderBytes, '\0');
    PLEXUS_RETURN_IF_ERROR(net::RecvAll(fd, body.data(), body.size(), deadline));
    PLEXUS_ASSIGN_OR_RETURN(auto response,
                            proto::DecodeResponse(absl::MakeConstSpan(
                                reinterpret_cast<const uint8_t*>(body.data()), body.size())));
    if (response.op != request.op) {
      return absl::InternalError(absl::StrCat("reply to a '", proto::OpName(response.op),
                                              "' arrived for a '", proto::OpName(request.op),
                                              "' request"));
    }
    return response;
  }

  // Sends `request`; waits `wait` (the caller's timeout for Get/Wait) plus io_timeout for the
  // reply. Protocol-level errors (timeouts, bad counters) come back as a Response code.
  absl::StatusOr<proto::Response> Call(const proto::Request& request, absl::Duration wait) {
    PLEXUS_ASSIGN_OR_RETURN(auto fd, TakeSocket());
    const absl::Time deadline =
        wait == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + wait + io_timeout;
    auto response = Exchange(fd, request, deadline);
    if (!response.ok()) {
      close(fd);
      if (absl::IsDeadlineExceeded(response.status())) {
        return absl::DeadlineExceededError(absl::StrCat(
            "the tcp store at ", address, " did not answer a '", proto::OpName(request.op),
            "' within ", absl::FormatDuration(wait + io_timeout),
            " (is the rank serving it, rank 0, stopped or overloaded?)"));
      }
      return Lost(response.status());
    }
    ReturnSocket(fd);
    return response;
  }
};

namespace {

uint64_t ToTimeoutMs(absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) return proto::kNoTimeout;
  if (timeout <= absl::ZeroDuration()) return 0;
  return static_cast<uint64_t>(
      absl::ToInt64Milliseconds(absl::Ceil(timeout, absl::Milliseconds(1))));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpStore>> TcpStore::Connect(std::string_view address,
                                                            absl::Duration timeout,
                                                            absl::Duration io_timeout,
                                                            std::string_view job_id) {
  PLEXUS_ASSIGN_OR_RETURN(auto hp, net::ParseHostPort(address, "store address"));
  if (job_id.size() > proto::kMaxJobIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("job id of ", job_id.size(), " bytes; the limit is ", proto::kMaxJobIdBytes));
  }
  if (hp.port == 0) {
    return absl::InvalidArgumentError(absl::StrCat("store address '", std::string(address),
                                                   "' has port 0: clients need the real port"));
  }
  if (hp.host.empty()) hp.host = "127.0.0.1";
  const absl::Time deadline = absl::Now() + timeout;
  // Jittered, so that the ranks of a job dialing rank 0 together do not retry in lockstep.
  base::Backoff backoff(absl::Milliseconds(5), absl::Milliseconds(500), absl::Milliseconds(10));
  std::string last_error = "no attempt made";
  int attempts = 0;
  for (;;) {
    ++attempts;
    auto resolved = net::Resolve(hp);
    if (resolved.ok()) {
      for (const net::SocketAddress& sa : *resolved) {
        bool retryable = false;
        // Cap each attempt so that one silently dropped SYN does not eat the whole timeout.
        const absl::Time attempt_deadline = std::min(deadline, absl::Now() + absl::Seconds(5));
        auto fd = net::ConnectTcp(sa, attempt_deadline, &retryable);
        if (!fd.ok()) {
          last_error = std::string(fd.status().message());
          if (!retryable) return fd.status();
          continue;
        }
        auto reply = Impl::Exchange(*fd, Impl::Hello(std::string(job_id)),
                                    std::max(deadline, absl::Now() + absl::Seconds(1)));
        if (!reply.ok()) {
          close(*fd);
          if (absl::IsInvalidArgument(reply.status()) || absl::IsInternal(reply.status())) {
            return absl::FailedPreconditionError(absl::StrCat(
                "the server at ", std::string(address),
                " is not a plexus tcp store: ", std::string(reply.status().message())));
          }
          last_error = std::string(reply.status().message());
          continue;
        }
        if (reply->code == proto::Code::kBusy) {
          close(*fd);
          return absl::ResourceExhaustedError(absl::StrCat(
              "the tcp store at ", std::string(address), " refused us: ", reply->value));
        }
        if (reply->code != proto::Code::kOk) {
          close(*fd);
          return absl::FailedPreconditionError(absl::StrCat(
              "the tcp store at ", std::string(address), " refused us: ", reply->value));
        }
        auto impl = std::make_unique<Impl>();
        impl->address = std::string(address);
        impl->resolved = sa;
        impl->io_timeout = io_timeout;
        impl->job_id = std::string(job_id);
        impl->server_job = reply->job;
        impl->server_job_nonce = reply->flag;
        impl->idle.push_back(*fd);
        return std::unique_ptr<TcpStore>(new TcpStore(std::move(impl)));
      }
    } else {
      last_error = std::string(resolved.status().message());
    }
    if (!backoff.SleepBefore(deadline)) break;
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "could not connect to the tcp store at ", std::string(address), " within ",
      absl::FormatDuration(timeout), " (", attempts, " attempts; last error: ", last_error,
      "). Is rank 0 running, and does the store address point at its host?"));
}

TcpStore::TcpStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TcpStore::~TcpStore() = default;

std::string TcpStore::description() const { return absl::StrCat("tcp store at ", impl_->address); }
const std::string& TcpStore::server_job_id() const { return impl_->server_job; }
bool TcpStore::server_job_id_is_nonce() const { return impl_->server_job_nonce; }

absl::Status TcpStore::Set(std::string_view key, std::string_view value) {
  PLEXUS_RETURN_IF_ERROR(bootstrap::CheckKey(key));
  if (value.size() > kMaxStoreValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat("value of key '", std::string(key), "' has ",
                                                   value.size(), " bytes; the limit is ",
                                                   kMaxStoreValueBytes));
  }
  proto::Request req;
  req.op = proto::Op::kSet;
  req.keys.emplace_back(key);
  req.value = std::string(value);
  PLEXUS_ASSIGN_OR_RETURN(auto r, impl_->Call(req, absl::ZeroDuration()));
  if (r.code == proto::Code::kFull) return absl::ResourceExhaustedError(r.value);
  if (r.code != proto::Code::kOk) return absl::InvalidArgumentError(r.value);
  return absl::OkStatus();
}

absl::StatusOr<std::string> TcpStore::Get(std::string_view key, absl::Duration timeout) {
  PLEXUS_RETURN_IF_ERROR(bootstrap::CheckKey(key));
  proto::Request req;
  req.op = proto::Op::kGet;
  req.keys.emplace_back(key);
  req.timeout_ms = ToTimeoutMs(timeout);
  PLEXUS_ASSIGN_OR_RETURN(auto r, impl_->Call(req, std::max(timeout, absl::ZeroDuration())));
  if (r.code == proto::Code::kTimeout) {
    return absl::DeadlineExceededError(
        absl::StrCat("key '", std::string(key), "' was not set within ",
                     absl::FormatDuration(timeout), " in the ", description()));
  }
  if (r.code != proto::Code::kOk) return absl::InvalidArgumentError(r.value);
  return std::move(r.value);
}

absl::StatusOr<int64_t> TcpStore::Add(std::string_view key, int64_t delta) {
  PLEXUS_RETURN_IF_ERROR(bootstrap::CheckKey(key));
  proto::Request req;
  req.op = proto::Op::kAdd;
  req.keys.emplace_back(key);
  req.delta = delta;
  PLEXUS_ASSIGN_OR_RETURN(auto r, impl_->Call(req, absl::ZeroDuration()));
  if (r.code == proto::Code::kFull) return absl::ResourceExhaustedError(r.value);
  if (r.code != proto::Code::kOk) {
    return absl::InvalidArgumentError(absl::StrCat(r.value, " in the ", description()));
  }
  return r.number;
}

absl::Status TcpStore::Wait(absl::Span<const std::string> keys, absl::Duration timeout) {
  for (const std::string& k : keys) {
    PLEXUS_RETURN_IF_ERROR(bootstrap::CheckKey(k));
  }
  proto::Request req;
  req.op = proto::Op::kWait;
  req.keys.assign(keys.begin(), keys.end());
  req.timeout_ms = ToTimeoutMs(timeout);
  if (proto::EncodeRequest(req).size() > proto::kHeaderBytes + proto::kMaxBodyBytes) {
    return absl::InvalidArgumentError("too many keys in one Wait for a store frame");
  }
  PLEXUS_ASSIGN_OR_RETURN(auto r, impl_->Call(req, std::max(timeout, absl::ZeroDuration())));
  if (r.code == proto::Code::kTimeout) {
    return absl::DeadlineExceededError(
        absl::StrCat("timed out after ", absl::FormatDuration(timeout), " waiting in the ",
                     description(), ": ", r.value));
  }
  if (r.code != proto::Code::kOk) return absl::InvalidArgumentError(r.value);
  return absl::OkStatus();
}

absl::StatusOr<bool> TcpStore::Check(absl::Span<const std::string> keys) {
  for (const std::string& k : keys) {
    PLEXUS_RETURN_IF_ERROR(bootstrap::CheckKey(k));
  }
  proto::Request req;
  req.op = proto::Op::kCheck;
  req.keys.assign(keys.begin(), keys.end());
  if (proto::EncodeRequest(req).size() > proto::kHeaderBytes + proto::kMaxBodyBytes) {
    return absl::InvalidArgumentError("too many keys in one Check for a store frame");
  }
  PLEXUS_ASSIGN_OR_RETURN(auto r, impl_->Call(req, absl::ZeroDuration()));
  if (r.code != proto::Code::kOk) return absl::InvalidArgumentError(r.value);
  return r.flag;
}

absl::StatusOr<bool> TcpStore::Delete(std::string_view key) {
  PLEXUS_RETURN_IF_ERROR(bootstrap::CheckKey(key));
  proto::Request req;
  req.op = proto::Op::kDelete;
  req.keys.emplace_back(key);
  PLEXUS_ASSIGN_OR_RETURN(auto r, impl_->Call(req, absl::ZeroDuration()));
  if (r.code != proto::Code::kOk) return absl::InvalidArgumentError(r.value);
  return r.flag;
}

}  // namespace plexus::transport

#include "plexus/base/admin.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "plexus/base/log.hpp"
#include "plexus/base/net.hpp"
#include "plexus/base/status.hpp"

namespace plexus::base::admin {
namespace {

using Json = nlohmann::json;
constexpr int kMaxDepth = 4;
constexpr size_t kMaxCommand = 64;

std::string Dump(const Json& j) {
  // Replace invalid UTF-8 instead of throwing: requests are hostile input.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// Nesting depth of JSON text, outside strings; a cheap bound before the real parser runs.
int Depth(std::string_view text) {
  int depth = 0, worst = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') in_string = true;
    if (c == '{' || c == '[') worst = std::max(worst, ++depth);
    if (c == '}' || c == ']') --depth;
  }
  return worst;
}

std::string ErrorReply(const absl::Status& status) {
  return Dump(Json{{"ok", false},
                   {"code", absl::StatusCodeToString(status.code())},
                   {"error", std::string(status.message())}});
}

absl::StatusCode CodeFromName(const std::string& name) {
  for (int c = 0; c <= 16; ++c) {
    if (absl::StatusCodeToString(static_cast<absl::StatusCode>(c)) == name) {
      return static_cast<absl::StatusCode>(c);
    }
  }
  return absl::StatusCode::kUnknown;
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

bool IsLoopback(const net::SocketAddress& a) {
  if (a.family() == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(a.get());
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (a.family() == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a.get());
    return IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr);
  }
  return false;
}

void PutLength(uint32_t n, unsigned char out[4]) {
  out[0] = static_cast<unsigned char>(n >> 24);
  out[1] = static_cast<unsigned char>(n >> 16);
  out[2] = static_cast<unsigned char>(n >> 8);
  out[3] = static_cast<unsigned char>(n);
}

uint32_t GetLength(const unsigned char in[4]) {
  return (uint32_t{in[0]} << 24) | (uint32_t{in[1]} << 16) | (uint32_t{in[2]} << 8) | in[3];
}

absl::Status SendFrame(int fd, std::string_view body, absl::Time deadline) {
  unsigned char len[4];
  PutLength(static_cast<uint32_t>(body.size()), len);
  PLEXUS_RETURN_IF_ERROR(net::SendAll(fd, len, 4, deadline));
  return net::SendAll(fd, body.data(), body.size(), deadline);
}

}  // namespace

absl::Status CheckArgs(const AdminRequest& request,
                       std::initializer_list<std::string_view> allowed) {
  for (const auto& [key, value] : request.args) {
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      std::string names;
      for (std::string_view a : allowed) {
        absl::StrAppend(&names, names.empty() ? "" : ", ", std::string(a));
      }
      return absl::InvalidArgumentError(absl::StrCat("admin command '", request.command,
                                                     "': unknown argument '", key,
                                                     "' (expected: ", names, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<AdminRequest> DecodeRequest(std::string_view body) {
  if (Depth(body) > kMaxDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("admin request: JSON nested deeper than ", kMaxDepth));
  }
  Json j = Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        "admin request: expected a JSON object {\"token\", \"command\", \"args\"}");
  }
  AdminRequest r;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    if (key == "token" || key == "command") {
      if (!it->is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("admin request: ", key, ": expected a string"));
      }
      (key == "token" ? r.token : r.command) = it->get<std::string>();
    } else if (key == "args") {
      if (!it->is_object()) {
        return absl::InvalidArgumentError("admin request: args: expected an object");
      }
      for (auto a = it->begin(); a != it->end(); ++a) {
        if (!a->is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat("admin request: args.", a.key(), ": expected a string"));
        }
        r.args[a.key()] = a->get<std::string>();
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "admin request: ", key, ": unknown field (expected one of: token, command, args)"));
    }
  }
  if (r.command.empty() || r.command.size() > kMaxCommand) {
    return absl::InvalidArgumentError(
        absl::StrCat("admin request: command: must have 1 to ", kMaxCommand, " characters"));
  }
  for (char c : r.command) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_')) {
      return absl::InvalidArgumentError(
          "admin request: command: only letters, digits, '-' and '_' are allowed");
    }
  }
  return r;
}

std::string EncodeRequest(const AdminRequest& request) {
  Json args = Json::object();
  for (const auto& [k, v] : request.args) args[k] = v;
  return Dump(Json{{"token", request.token}, {"command", request.command}, {"args", args}});
}

absl::StatusOr<std::unique_ptr<AdminServer>> AdminServer::Start(AdminOptions options) {
  if (options.token.empty()) {
    return absl::InvalidArgumentError("admin endpoint: a token is required (it is never open)");
  }
  if (options.max_request_bytes == 0) options.max_request_bytes = kDefaultMaxRequestBytes;
  PLEXUS_ASSIGN_OR_RETURN(net::SocketAddress sa,
                          net::ResolveFirst(options.address, "admin endpoint address"));
  if (!IsLoopback(sa)) {
    return absl::InvalidArgumentError(
        absl::StrCat("admin endpoint address ", options.address,
                     " is not a loopback address (it is served on 127.0.0.1 or ::1 only)"));
  }
  const int fd = ::socket(sa.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return net::ErrnoStatus(errno, "admin endpoint: socket");
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, sa.get(), sa.length) != 0 || ::listen(fd, 16) != 0) {
    const int err = errno;
    ::close(fd);
    return net::ErrnoStatus(err, absl::StrCat("admin endpoint: listen on ", options.address));
  }
  std::unique_ptr<AdminServer> s(new AdminServer());
  s->options_ = std::move(options);
  s->listen_fd_ = fd;
  auto local = net::LocalAddress(fd);
  s->address_ = local.ok() ? net::FormatAddress(*local) : s->options_.address;
  s->thread_ = std::thread([p = s.get()] { p->Serve(); });
  return s;
}

AdminServer::~AdminServer() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void AdminServer::Handle(std::string command, std::string help, Handler handler) {
  std::lock_guard<std::mutex> lock(mu_);
  handlers_[std::move(command)] = {std::move(help), std::move(handler)};
}

void AdminServer::Remove(const std::string& command) {
  std::lock_guard<std::mutex> run(run_mu_);
  std::lock_guard<std::mutex> lock(mu_);
  handlers_.erase(command);
}

std::string AdminServer::address() const { return address_; }

namespace {

// One connection of the serving loop: its request is read, then its reply written, without
// blocking, before `deadline`.
struct AdminClient {
  int fd = -1;
  absl::Time deadline;
  bool replying = false;
  unsigned char len[4] = {};
  size_t got = 0;    // bytes of the length prefix, then of the body
  std::string body;  // sized once the prefix is whole
  std::string out;   // the framed reply
  size_t sent = 0;
};

std::string Framed(std::string_view body) {
  unsigned char len[4];
  PutLength(static_cast<uint32_t>(body.size()), len);
  std::string out(reinterpret_cast<const char*>(len), 4);
  out.append(body);
  return out;
}

}  // namespace

void AdminServer::Serve() {
  std::vector<AdminClient> clients;
  std::vector<pollfd> fds;
  auto drop = [&](size_t i) {
    ::close(clients[i].fd);
    clients.erase(clients.begin() + static_cast<std::ptrdiff_t>(i));
  };
  // Reads what the client sent; once the request is whole, runs it and starts the reply.
  auto read = [&](AdminClient& c) -> bool {
    for (;;) {
      const bool prefix = c.got < 4;
      char* into = prefix ? reinterpret_cast<char*>(c.len) + c.got : c.body.data() + (c.got - 4);
      const size_t want = prefix ? 4 - c.got : c.body.size() - (c.got - 4);
      if (want > 0) {
        const ssize_t r = ::recv(c.fd, into, want, 0);
        if (r == 0) return false;
        if (r < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
        c.got += static_cast<size_t>(r);
        if (static_cast<size_t>(r) < want) return true;
      }
      if (prefix) {
        const uint32_t n = GetLength(c.len);
        if (n > options_.max_request_bytes) {
          // Not read: the request is refused whole, and the connection closed after the reply.
          c.out = Framed(ErrorReply(absl::InvalidArgumentError(
              absl::StrCat("admin request of ", n, " bytes is over the limit of ",
                           options_.max_request_bytes, " bytes"))));
          break;
        }
        c.body.resize(n);
        continue;
      }
      c.out = Framed(Dispatch(c.body));
      break;
    }
    c.replying = true;
    c.deadline = absl::Now() + options_.request_timeout;
    return true;
  };
  // Writes what the socket takes of the reply; false once it is all sent or the client is gone.
  auto write = [](AdminClient& c) -> bool {
    while (c.sent < c.out.size()) {
      const ssize_t r = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
      if (r < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
      c.sent += static_cast<size_t>(r);
    }
    return false;
  };
  while (!stop_.load()) {
    fds.clear();
    fds.push_back({listen_fd_, POLLIN, 0});
    absl::Time wake = absl::Now() + absl::Milliseconds(100);  // stop_ is checked as often
    for (const AdminClient& c : clients) {
      fds.push_back({c.fd, static_cast<short>(c.replying ? POLLOUT : POLLIN), 0});
      wake = std::min(wake, c.deadline);
    }
    if (::poll(fds.data(), fds.size(), net::PollTimeoutMs(wake, 100)) < 0) continue;
    // Every client first (the indices match `fds`), newest last, so that erasing goes backwards.
    for (size_t i = clients.size(); i-- > 0;) {
      const short ready = fds[i + 1].revents;
      AdminClient& c = clients[i];
      bool keep = true;
      if (ready != 0 && !c.replying) keep = read(c);
      if (keep && c.replying) keep = write(c);
      if (keep && absl::Now() > c.deadline) keep = false;  // silent or not reading the reply
      if (!keep) drop(i);
    }
    if ((fds[0].revents & POLLIN) == 0) continue;
    for (;;) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) break;
      if (clients.size() >= std::max<size_t>(options_.max_connections, 1)) {
        auto oldest = std::find_if(clients.begin(), clients.end(),
                                   [](const AdminClient& c) { return !c.replying; });
        if (oldest == clients.end()) {
          Logf(LogLevel::kWarning,
               "plexus admin endpoint %s: refusing a connection: all %d connections are "
               "being answered (AdminOptions::max_connections)",
               address_, static_cast<int>(clients.size()));
          ::close(fd);
          continue;
        }
        Logf(LogLevel::kWarning,
             "plexus admin endpoint %s: dropping the oldest connection that has not sent its "
             "request yet: %d connections open (AdminOptions::max_connections)",
             address_, static_cast<int>(clients.size()));
        drop(static_cast<size_t>(oldest - clients.begin()));
      }
      AdminClient c;
      c.fd = fd;
      c.deadline = absl::Now() + options_.request_timeout;
      clients.push_back(std::move(c));
    }
  }
  for (const AdminClient& c : clients) ::close(c.fd);
}

std::string AdminServer::Dispatch(std::string_view body) {
  if (body.size() > options_.max_request_bytes) {
    return ErrorReply(absl::InvalidArgumentError(
        absl::StrCat("admin request of ", body.size(), " bytes is over the limit of ",
                     options_.max_request_bytes, " bytes")));
  }
  absl::StatusOr<AdminRequest> r = DecodeRequest(body);
  if (!r.ok()) return ErrorReply(r.status());
  if (!ConstantTimeEquals(r->token, options_.token)) {
    return ErrorReply(absl::UnauthenticatedError(
        "admin request: wrong or missing token (see the endpoint's token setting)"));
  }
  std::lock_guard<std::mutex> run(run_mu_);
  Handler handler;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (r->command == "help") {
      Json out = Json::object();
      for (const auto& [name, h] : handlers_) out[name] = h.first;
      return Dump(Json{{"ok", true}, {"result", out}});
    }
    auto it = handlers_.find(r->command);
    if (it == handlers_.end()) {
      std::vector<std::string> names{"help"};
      for (const auto& [name, h] : handlers_) names.push_back(name);
      return ErrorReply(
          absl::NotFoundError(absl::StrCat("admin: unknown command '", r->command,
                                           "' (commands: ", absl::StrJoin(names, ", "), ")")));
    }
    handler = it->second.second;
  }
  absl::StatusOr<std::string> result = handler(*r);
  if (!result.ok()) return ErrorReply(result.status());
  Json parsed = Json::parse(*result, nullptr, false);
  if (parsed.is_discarded()) {
    return ErrorReply(absl::InternalError(
        absl::StrCat("admin: command '", r->command, "' produced invalid JSON")));
  }
  return Dump(Json{{"ok", true}, {"result", parsed}});
}

absl::StatusOr<std::string> AdminCall(std::string_view address, const AdminRequest& request,
                                      absl::Duration timeout, size_t max_reply_bytes) {
  const absl::Time deadline = absl::Now() + timeout;
  const std::string where = absl::StrCat("admin endpoint ", std::string(address));
  PLEXUS_ASSIGN_OR_RETURN(net::SocketAddress sa, net::ResolveFirst(address, "admin address"));
  bool retryable = false;
  absl::StatusOr<int> fd = net::ConnectTcp(sa, deadline, &retryable);
  if (!fd.ok()) return Annotate(fd.status(), where);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{*fd};
  PLEXUS_RETURN_IF_ERROR(Annotate(SendFrame(*fd, EncodeRequest(request), deadline), where));
  unsigned char len[4];
  PLEXUS_RETURN_IF_ERROR(Annotate(net::RecvAll(*fd, len, 4, deadline), where));
  const uint32_t n = GetLength(len);
  if (n > max_reply_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(where, ": a reply of ", n, " bytes is over ", max_reply_bytes));
  }
  std::string body(n, '\0');
  PLEXUS_RETURN_IF_ERROR(Annotate(net::RecvAll(*fd, body.data(), n, deadline), where));
  Json j = Json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("ok") || !j["ok"].is_boolean()) {
    return absl::InternalError(absl::StrCat(where, ": malformed reply"));
  }
  if (j["ok"].get<bool>()) return Dump(j.value("result", Json()));
  auto text = [&](const char* key, const char* fallback) {
    auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string(fallback);
  };
  return absl::Status(CodeFromName(text("code", "UNKNOWN")), text("error", "(no message)"));
}

}  // namespace plexus::base::admin

#include "shm/session.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstddef>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "futex.hpp"
#include "plexus/base/env.hpp"
#include "plexus/base/host.hpp"
#include "plexus/base/log.hpp"
#include "plexus/base/status.hpp"

namespace plexus::transport::internal::shm {
namespace {

std::string Errno(int err) { return std::string(strerror(err)); }

absl::Status SysError(const std::string& what, int err) {
  return absl::InternalError(absl::StrCat("shm: ", what, ": ", Errno(err)));
}

// Handshake messages. Both ends are processes of one host, so native layout is the wire format;
// every received message is still checked for size, magic and version.
struct Hello {
  uint32_t magic;
  uint32_t version;
  uint64_t ring_bytes;
  uint64_t probe_address;
  uint64_t probe_value;
};
struct Reply {
  uint32_t magic;
  uint32_t version;
  uint32_t status;         // 0: accepted; otherwise `reason` says why not
  uint32_t peer_can_pull;  // the acceptor can read the connector's memory
  uint64_t probe_address;
  uint64_t probe_value;
  char reason[200];
};
struct Final {
  uint32_t magic;
  uint32_t version;
  uint32_t status;
  uint32_t peer_can_pull;  // the connector can read the acceptor's memory
  char reason[200];
};
constexpr uint32_t kHandshakeMagic = 0x48534c50;  // "PLSH"

struct FileHeader {
  uint32_t magic;
  uint32_t version;
  uint64_t ring_bytes;
};
// Head and tail on their own cache lines: the producer writes one, the consumer the other.
struct RingControl {
  alignas(64) uint64_t head;
  alignas(64) uint64_t tail;
};
static_assert(sizeof(RingControl) == 128);
constexpr size_t kControlOffset = 4096;

static_assert(kMailboxAreaOffset % alignof(MailboxInbox) == 0);
static_assert(kMailboxAreaOffset + 2 * sizeof(MailboxInbox) <= kRingAreaOffset);

size_t FileBytes(size_t ring_bytes) { return kRingAreaOffset + 2 * ring_bytes; }

bool ValidRingBytes(uint64_t r) {
  return r >= kMinRingBytes && r <= kMaxRingBytes && (r & (r - 1)) == 0;
}

void CopyReason(char (&out)[200], const std::string& reason) {
  const size_t n = std::min(reason.size(), sizeof(out) - 1);
  std::memcpy(out, reason.data(), n);
  out[n] = '\0';
}

absl::Duration Remaining(absl::Time deadline) {
  return std::max(deadline - absl::Now(), absl::ZeroDuration());
}

// Waits until `fd` is readable (or hung up) before `deadline`.
absl::Status WaitReadable(int fd, absl::Time deadline, const std::string& what) {
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const int ms = static_cast<int>(absl::ToInt64Milliseconds(Remaining(deadline)));
    const int rc = ::poll(&p, 1, ms);
    if (rc > 0) return absl::OkStatus();
    if (rc == 0) {
      return absl::DeadlineExceededError(absl::StrCat("shm: timed out waiting for ", what));
    }
    if (errno != EINTR) return SysError(absl::StrCat("poll while waiting for ", what), errno);
  }
}

absl::Status SendWithFds(int sock, const void* msg, size_t size, const int* fds, size_t nfds,
                         const std::string& what) {
  iovec iov{const_cast<void*>(msg), size};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  if (nfds > 0) {
    mh.msg_control = control;
    mh.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
  }
  for (;;) {
    const ssize_t n = ::sendmsg(sock, &mh, MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(size)) return absl::OkStatus();
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::UnavailableError(absl::StrCat("shm: sending the ", what, ": ", Errno(errno)));
    }
    return absl::InternalError(absl::StrCat("shm: short send of the ", what));
  }
}

// Receives one handshake message of exactly `size` bytes, with up to 2 descriptors.
absl::Status RecvWithFds(int sock, void* msg, size_t size, std::vector<UniqueFd>* fds,
                         absl::Time deadline, const std::string& what) {
  PLEXUS_RETURN_IF_ERROR(WaitReadable(sock, deadline, what));
  std::vector<uint8_t> buf(size + 1);
  iovec iov{buf.data(), buf.size()};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(8 * sizeof(int))] = {};
  mh.msg_control = control;
  mh.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = ::recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    return absl::UnavailableError(absl::StrCat("shm: receiving the ", what, ": ", Errno(errno)));
  }
  for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds->emplace_back(fd);
      }
    }
  }
  if (n == 0) {
    return absl::UnavailableError(absl::StrCat("shm: the peer closed the socket before the ", what,
                                               " (handshake rejected or peer died)"));
  }
  if ((mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 || static_cast<size_t>(n) != size) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm: malformed ", what, " (", n, " bytes, expected ", size, ")"));
  }
  std::memcpy(msg, buf.data(), size);
  return absl::OkStatus();
}

absl::Status CheckVersion(uint32_t magic, uint32_t version, const std::string& what) {
  if (magic != kHandshakeMagic) {
    return absl::InvalidArgumentError(absl::StrCat("shm: ", what, " has bad magic 0x",
                                                   absl::Hex(magic), " (not a Plexus shm peer?)"));
  }
  if (version != kProtocolVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("shm: ", what, " speaks protocol version ", version, ", this side speaks ",
                     kProtocolVersion, " (mixing Plexus builds?)"));
  }
  return absl::OkStatus();
}

// Whether this process may read 8 bytes at `address` of `pid` and finds `value` there.
bool ProbeCma(pid_t pid, uint64_t address, uint64_t value) {
  uint64_t got = ~value;
  const CmaSegment seg{address, sizeof got};
  if (!CmaRead(pid, reinterpret_cast<uint8_t*>(&got), {&seg, 1}).ok()) return false;
  return got == value;
}

absl::StatusOr<pid_t> PeerPid(int sock) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return SysError("SO_PEERCRED", errno);
  }
  return cred.pid;
}

sockaddr_un AbstractAddress(const std::string& name, socklen_t* len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  a.sun_path[0] = '\0';
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

absl::Status CheckName(const std::string& name) {
  if (name.empty() || name.size() > sizeof(sockaddr_un::sun_path) - 1) {
    return absl::InvalidArgumentError(absl::StrCat("shm: address '", name, "' must have 1 to ",
                                                   sizeof(sockaddr_un::sun_path) - 1,
                                                   " characters"));
  }
  return absl::OkStatus();
}

void WireRings(Session* s, bool connector, size_t ring_bytes) {
  uint8_t* base = s->file.data();
  auto* control = reinterpret_cast<RingControl*>(base + kControlOffset);
  Ring ring0(base + kRingAreaOffset, ring_bytes, &control[0].head, &control[0].tail);
  Ring ring1(base + kRingAreaOffset + ring_bytes, ring_bytes, &control[1].head, &control[1].tail);
  s->tx = connector ? ring0 : ring1;
  s->rx = connector ? ring1 : ring0;
  auto* inboxes = reinterpret_cast<MailboxInbox*>(base + kMailboxAreaOffset);
  s->mail_tx = connector ? &inboxes[0] : &inboxes[1];
  s->mail_rx = connector ? &inboxes[1] : &inboxes[0];
}

// Memory shared with a peer process must not shrink under us (reads past the end would raise
// SIGBUS): the creator seals its memfds, the other side refuses unsealed ones.
constexpr int kRequiredSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

absl::Status SealShared(int fd, const char* what) {
  if (::fcntl(fd, F_ADD_SEALS, kRequiredSeals) != 0) {
    return SysError(absl::StrCat("sealing ", what), errno);
  }
  return absl::OkStatus();
}

absl::Status CheckSealed(int fd, const char* what) {
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_SEAL)) != (F_SEAL_SHRINK | F_SEAL_SEAL)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm: the peer's ", what, " is not sealed against shrinking"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Mapping> MapPeerDoorbell(int fd) {
  PLEXUS_RETURN_IF_ERROR(CheckSealed(fd, "doorbell"));
  struct stat st {};
  if (::fstat(fd, &st) != 0) return SysError("fstat of the peer's doorbell", errno);
  if (st.st_size != 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm: peer's doorbell is ", st.st_size, " bytes, expected 4096"));
  }
  return MapShared(fd, 4096, "the peer's doorbell");
}

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

Mapping& Mapping::operator=(Mapping&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) ::munmap(data_, size_);
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
  }
  return *this;
}

Mapping::~Mapping() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

absl::StatusOr<Mapping> MapShared(int fd, size_t size, const char* what) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return SysError(absl::StrCat("mmap of ", what), errno);
  return Mapping(p, size);
}

void FaultInOwnFile(const Mapping& m) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t bytes = std::min(m.size(), kFaultInLimit);
  for (size_t at = 0; at < bytes; at += page) *static_cast<volatile uint8_t*>(m.data() + at) = 0;
}

void FaultInPeerFile(const Mapping& m) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t bytes = std::min(m.size(), kFaultInLimit);
  std::vector<unsigned char> resident((bytes + page - 1) / page);
  if (::mincore(m.data(), bytes, resident.data()) != 0) return;
  for (size_t i = 0; i < resident.size(); ++i) {
    if ((resident[i] & 1) != 0) (void)*static_cast<volatile uint8_t*>(m.data() + i * page);
  }
}

Doorbell::Doorbell(uint8_t* page)
    : seq_(reinterpret_cast<uint32_t*>(page + 64)),
      sleepers_(reinterpret_cast<uint32_t*>(page + 128)) {}

void Doorbell::Ring() {
  // Orders the caller's publication (ring head/tail) before the sleeper check: pairs with the
  // sleeper's increment-then-recheck in BeginSleep.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (std::atomic_ref<uint32_t>(*sleepers_).load(std::memory_order_seq_cst) == 0) return;
  std::atomic_ref<uint32_t>(*seq_).fetch_add(1, std::memory_order_seq_cst);
  FutexWake(seq_, /*shared=*/true);
}

uint32_t Doorbell::BeginSleep() {
  std::atomic_ref<uint32_t>(*sleepers_).fetch_add(1, std::memory_order_seq_cst);
  return std::atomic_ref<uint32_t>(*seq_).load(std::memory_order_seq_cst);
}

void Doorbell::Sleep(uint32_t token, absl::Duration max) {
  FutexWait(seq_, token, /*shared=*/true, max);
}

void Doorbell::EndSleep() {
  std::atomic_ref<uint32_t>(*sleepers_).fetch_sub(1, std::memory_order_seq_cst);
}

absl::StatusOr<LocalDoorbell> CreateDoorbell() {
  LocalDoorbell d;
  d.fd = UniqueFd(::memfd_create("plexus-shm-doorbell", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!d.fd.valid()) return SysError("memfd_create (doorbell)", errno);
  if (::ftruncate(d.fd.get(), 4096) != 0) return SysError("ftruncate (doorbell)", errno);
  PLEXUS_RETURN_IF_ERROR(SealShared(d.fd.get(), "the doorbell"));
  PLEXUS_ASSIGN_OR_RETURN(auto m, MapShared(d.fd.get(), 4096, "the doorbell"));
  d.mapping = std::move(m);
  d.bell = Doorbell(d.mapping.data());
  return d;
}

std::string UniqueAddress() {
  static std::atomic<uint64_t> counter{0};
  static thread_local absl::BitGen gen;
  return absl::StrCat("plexus-shm-", ::getpid(), "-", counter.fetch_add(1), "-",
                      absl::Hex(absl::Uniform<uint32_t>(gen)));
}

absl::StatusOr<UniqueFd> ListenSocket(const std::string& address) {
  PLEXUS_RETURN_IF_ERROR(CheckName(address));
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return SysError("socket(AF_UNIX)", errno);
  socklen_t len;
  sockaddr_un a = AbstractAddress(address, &len);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), len) != 0) {
    if (errno == EADDRINUSE) {
      return absl::AlreadyExistsError(
          absl::StrCat("shm: address '", address, "' is already in use by another listener"));
    }
    return SysError(absl::StrCat("bind to '", address, "'"), errno);
  }
  if (::listen(fd.get(), 128) != 0) return SysError("listen", errno);
  return fd;
}

absl::StatusOr<Session> ConnectSession(const std::string& address, int local_doorbell_fd,
                                       const HandshakeOptions& options) {
  const absl::Time deadline = absl::Now() + options.timeout;
  PLEXUS_RETURN_IF_ERROR(CheckName(address));
  if (!ValidRingBytes(options.ring_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("shm: ring size ", options.ring_bytes,
                                                   " must be a power of two in [", kMinRingBytes,
                                                   ", ", kMaxRingBytes, "]"));
  }
  Session s;
  s.peer_address = address;
  s.socket = UniqueFd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!s.socket.valid()) return SysError("socket(AF_UNIX)", errno);
  socklen_t len;
  sockaddr_un a = AbstractAddress(address, &len);
  int rc;
  do {
    rc = ::connect(s.socket.get(), reinterpret_cast<sockaddr*>(&a), len);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int err = errno;
    if (err == ECONNREFUSED || err == ENOENT) {
      return absl::UnavailableError(
          absl::StrCat("shm: no listener at address '", address, "' (connect: ", Errno(err), ")"));
    }
    return absl::UnavailableError(
        absl::StrCat("shm: cannot connect to '", address, "': ", Errno(err)));
  }
  PLEXUS_ASSIGN_OR_RETURN(auto pid, PeerPid(s.socket.get()));
  s.peer_pid = pid;

  UniqueFd file(::memfd_create("plexus-shm-connection", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!file.valid()) return SysError("memfd_create", errno);
  const size_t file_bytes = FileBytes(options.ring_bytes);
  if (::ftruncate(file.get(), static_cast<off_t>(file_bytes)) != 0) {
    return SysError(absl::StrCat("ftruncate of the ", file_bytes, "-byte connection file"), errno);
  }
  PLEXUS_RETURN_IF_ERROR(SealShared(file.get(), "the connection file"));
  PLEXUS_ASSIGN_OR_RETURN(auto m, MapShared(file.get(), file_bytes, "the connection file"));
  s.file = std::move(m);
  // Fresh memory: nothing to overwrite. The listener maps its side before it replies.
  FaultInOwnFile(s.file);
  auto* fh = reinterpret_cast<FileHeader*>(s.file.data());
  fh->magic = options.magic;
  fh->version = options.version;
  fh->ring_bytes = options.ring_bytes;
  WireRings(&s, /*connector=*/true, options.ring_bytes);

  static thread_local absl::BitGen gen;
  const uint64_t probe = absl::Uniform<uint64_t>(gen);
  Hello hello{kHandshakeMagic, options.version, options.ring_bytes,
              reinterpret_cast<uintptr_t>(&probe), probe};
  const int fds[2] = {file.get(), local_doorbell_fd};
  PLEXUS_RETURN_IF_ERROR(
      SendWithFds(s.socket.get(), &hello, sizeof hello, fds, 2, "handshake hello"));
  Reply reply{};
  std::vector<UniqueFd> got;
  PLEXUS_RETURN_IF_ERROR(RecvWithFds(s.socket.get(), &reply, sizeof reply, &got, deadline,
                                     absl::StrCat("handshake reply from '", address, "'")));
  PLEXUS_RETURN_IF_ERROR(CheckVersion(reply.magic, reply.version, "the listener's reply"));
  if (reply.status != 0) {
    reply.reason[sizeof reply.reason - 1] = '\0';
    return absl::FailedPreconditionError(
        absl::StrCat("shm: '", address, "' rejected the connection: ", reply.reason));
  }
  if (got.size() != 1) {
    return absl::InvalidArgumentError("shm: handshake reply without exactly one doorbell");
  }
  PLEXUS_ASSIGN_OR_RETURN(auto bell, MapPeerDoorbell(got[0].get()));
  s.peer_doorbell_page = std::move(bell);
  s.peer_doorbell = Doorbell(s.peer_doorbell_page.data());
  s.peer_can_pull = reply.peer_can_pull != 0;

  Final fin{kHandshakeMagic, kProtocolVersion, 0, 0, {}};
  fin.peer_can_pull =
      options.allow_cma && ProbeCma(s.peer_pid, reply.probe_address, reply.probe_value) ? 1 : 0;
  PLEXUS_RETURN_IF_ERROR(
      SendWithFds(s.socket.get(), &fin, sizeof fin, nullptr, 0, "handshake final"));
  return s;
}

absl::StatusOr<Session> AcceptSession(UniqueFd socket, int local_doorbell_fd,
                                      const HandshakeOptions& options) {
  const absl::Time deadline = absl::Now() + options.timeout;
  PLEXUS_ASSIGN_OR_RETURN(Session s,
                          BeginAcceptSession(std::move(socket), local_doorbell_fd, options));
  PLEXUS_RETURN_IF_ERROR(FinishAcceptSession(&s, deadline));
  return s;
}

absl::StatusOr<Session> BeginAcceptSession(UniqueFd socket, int local_doorbell_fd,
                                           const HandshakeOptions& options) {
  const absl::Time deadline = absl::Now() + options.timeout;
  Session s;
  s.socket = std::move(socket);
  PLEXUS_ASSIGN_OR_RETURN(auto pid, PeerPid(s.socket.get()));
  s.peer_pid = pid;
  s.peer_address = absl::StrCat("shm-peer-pid-", s.peer_pid);

  Hello hello{};
  std::vector<UniqueFd> got;
  PLEXUS_RETURN_IF_ERROR(
      RecvWithFds(s.socket.get(), &hello, sizeof hello, &got, deadline, "handshake hello"));
  Reply reply{kHandshakeMagic, kProtocolVersion, 1, 0, 0, 0, {}};
  // Refuses with a reason the connector can show, and returns the same error here.
  auto reject = [&](absl::Status why) {
    CopyReason(reply.reason, std::string(why.message()));
    (void)SendWithFds(s.socket.get(), &reply, sizeof reply, nullptr, 0, "handshake reply");
    return why;
  };
  if (auto st = CheckVersion(hello.magic, hello.version, "the connector's hello"); !st.ok()) {
    return reject(st);
  }
  if (got.size() != 2) {
    return reject(absl::InvalidArgumentError(
        absl::StrCat("shm: hello carried ", got.size(), " descriptors, expected 2")));
  }
  if (!ValidRingBytes(hello.ring_bytes)) {
    return reject(absl::InvalidArgumentError(
        absl::StrCat("shm: connector asks for an invalid ring size of ", hello.ring_bytes)));
  }
  const size_t file_bytes = FileBytes(hello.ring_bytes);
  if (absl::Status sealed = CheckSealed(got[0].get(), "connection file"); !sealed.ok()) {
    return reject(sealed);
  }
  struct stat st {};
  if (::fstat(got[0].get(), &st) != 0 || static_cast<size_t>(st.st_size) != file_bytes) {
    return reject(absl::InvalidArgumentError(
        absl::StrCat("shm: connection file is ", st.st_size, " bytes, expected ", file_bytes)));
  }
  auto m = MapShared(got[0].get(), file_bytes, "the connection file");
  if (!m.ok()) return reject(m.status());
  s.file = std::move(*m);
  FaultInPeerFile(s.file);  // the connector may be writing: only reads
  const auto* fh = reinterpret_cast<const FileHeader*>(s.file.data());
  if (fh->magic != kFileMagic || fh->version != kProtocolVersion ||
      fh->ring_bytes != hello.ring_bytes) {
    return reject(absl::InvalidArgumentError(absl::StrCat(
        "shm: connection file header mismatch (magic 0x", absl::Hex(fh->magic), ", version ",
        fh->version, ", ring ", fh->ring_bytes, "; expected 0x", absl::Hex(kFileMagic),
        ", version ", kProtocolVersion, ", ring ", hello.ring_bytes, ")")));
  }
  WireRings(&s, /*connector=*/false, hello.ring_bytes);
  auto bell = MapPeerDoorbell(got[1].get());
  if (!bell.ok()) return reject(bell.status());
  s.peer_doorbell_page = std::move(*bell);
  s.peer_doorbell = Doorbell(s.peer_doorbell_page.data());

  static thread_local absl::BitGen gen;
  const uint64_t probe = absl::Uniform<uint64_t>(gen);
  reply.status = 0;
  reply.peer_can_pull =
      options.allow_cma && ProbeCma(s.peer_pid, hello.probe_address, hello.probe_value) ? 1 : 0;
  reply.probe_address = reinterpret_cast<uintptr_t>(&probe);
  reply.probe_value = probe;
  const int fds[1] = {local_doorbell_fd};
  PLEXUS_RETURN_IF_ERROR(
      SendWithFds(s.socket.get(), &reply, sizeof reply, fds, 1, "handshake reply"));
  return s;
}

absl::Status FinishAcceptSession(Session* s, absl::Time deadline) {
  Final fin{};
  std::vector<UniqueFd> got;
  PLEXUS_RETURN_IF_ERROR(
      RecvWithFds(s->socket.get(), &fin, sizeof fin, &got, deadline, "handshake final"));
  PLEXUS_RETURN_IF_ERROR(CheckVersion(fin.magic, fin.version, "the connector's final message"));
  s->peer_can_pull = fin.peer_can_pull != 0;
  return absl::OkStatus();
}

namespace {

absl::Status CmaReadSerial(pid_t pid, uint8_t* dst, absl::Span<const CmaSegment> segments) {
  size_t seg = 0;
  uint64_t seg_done = 0;
  while (seg < segments.size()) {
    iovec remote[64];
    size_t n = 0;
    uint64_t want = 0;
    for (size_t i = seg; i < segments.size() && n < 64; ++i) {
      const uint64_t skip = i == seg ? seg_done : 0;
      if (segments[i].length == skip) continue;
      remote[n].iov_base = reinterpret_cast<void*>(segments[i].address + skip);
      remote[n].iov_len = segments[i].length - skip;
      want += remote[n].iov_len;
      ++n;
    }
    if (n == 0) break;
    iovec local{dst, want};
    const ssize_t got = ::process_vm_readv(pid, &local, 1, remote, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      const std::string text =
          absl::StrCat("cross-memory read from process ", pid, ": ", Errno(err));
      if (err == EPERM || err == ENOSYS) return absl::PermissionDeniedError(text);
      if (err == ESRCH) return absl::UnavailableError(absl::StrCat(text, " (peer died)"));
      return absl::DataLossError(text);
    }
    if (got == 0) {
      return absl::DataLossError(
          absl::StrCat("cross-memory read from process ", pid, " made no progress"));
    }
    dst += got;
    uint64_t left = static_cast<uint64_t>(got);
    while (left > 0 && seg < segments.size()) {
      const uint64_t in_seg = segments[seg].length - seg_done;
      if (left >= in_seg) {
        left -= in_seg;
        ++seg;
        seg_done = 0;
      } else {
        seg_done += left;
        left = 0;
      }
    }
    while (seg < segments.size() && segments[seg].length == seg_done) {
      ++seg;
      seg_done = 0;
    }
  }
  return absl::OkStatus();
}

// A bulk read is split in two: the caller reads the first half while this helper thread reads
// the second. On a two-core host the sending process sleeps while its peer pulls, so the second
// core is free; one core alone reaches about half of memcpy's bandwidth through process_vm_readv.
class CopyHelper {
 public:
  // One per process: a child made by fork() has no copy of the thread, so it starts its own (the
  // parent's object is left untouched: its mutex may have been held at the fork).
  static CopyHelper& Get() {
    static std::mutex mu;
    static CopyHelper* helper = nullptr;  // never destroyed: detached worker
    static pid_t owner = 0;
    std::lock_guard<std::mutex> lock(mu);
    if (helper == nullptr || owner != getpid()) {
      helper = new CopyHelper();
      owner = getpid();
    }
    return *helper;
  }

  // Runs `job` on the helper thread; false (and nothing started) when it is busy.
  bool TryStart(pid_t pid, uint8_t* dst, std::vector<CmaSegment> segments) {
    std::unique_lock<std::mutex> lock(mu_);
    if (busy_) return false;
    busy_ = true;
    done_ = false;
    pid_ = pid;
    dst_ = dst;
    segments_ = std::move(segments);
    lock.unlock();
    cv_.notify_all();
    return true;
  }

  absl::Status Finish() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    busy_ = false;
    return result_;
  }

 private:
  CopyHelper() {
    std::thread([this] { Loop(); }).detach();
  }

  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return busy_ && !done_ && !running_; });
      running_ = true;
      lock.unlock();
      absl::Status result = CmaReadSerial(pid_, dst_, segments_);
      lock.lock();
      result_ = std::move(result);
      running_ = false;
      done_ = true;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  bool busy_ = false;
  bool done_ = false;
  bool running_ = false;
  pid_t pid_ = 0;
  uint8_t* dst_ = nullptr;
  std::vector<CmaSegment> segments_;
  absl::Status result_;
};

constexpr uint64_t kParallelCmaBytes = uint64_t{4} << 20;

bool ParallelCmaEnabled() {
  static const bool enabled = [] {
    static const base::Param<bool> param("PLEXUS_SHM_PARALLEL_COPY", true,
                                         "split large shm copies across two threads");
    auto on = param.Get();
    if (!on.ok()) {
      base::Logf(base::LogLevel::kWarning, "plexus: %s; using the default",
                 std::string(on.status().message()));
    }
    return on.value_or(true) && base::OnlineCpuCount() >= 2;
  }();
  return enabled;
}

}  // namespace

absl::Status CmaRead(pid_t pid, uint8_t* dst, absl::Span<const CmaSegment> segments) {
  uint64_t total = 0;
  for (const CmaSegment& s : segments) total += s.length;
  if (total < kParallelCmaBytes || !ParallelCmaEnabled()) {
    return CmaReadSerial(pid, dst, segments);
  }
  // Split at the byte midpoint (page aligned): [0, half) here, [half, total) on the helper.
  const uint64_t half = (total / 2) & ~uint64_t{4095};
  std::vector<CmaSegment> first, second;
  uint64_t at = 0;
  for (const CmaSegment& s : segments) {
    if (at + s.length <= half) {
      first.push_back(s);
    } else if (at >= half) {
      second.push_back(s);
    } else {
      const uint64_t cut = half - at;
      first.push_back({s.address, cut});
      second.push_back({s.address + cut, s.length - cut});
    }
    at += s.length;
  }
  CopyHelper& helper = CopyHelper::Get();
  if (!helper.TryStart(pid, dst + half, std::move(second)))
    return CmaReadSerial(pid, dst, segments);
  absl::Status mine = CmaReadSerial(pid, dst, first);
  absl::Status theirs = helper.Finish();
  return mine.ok() ? theirs : mine;
}

}  // namespace plexus::transport::internal::shm

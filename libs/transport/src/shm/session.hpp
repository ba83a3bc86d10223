// Shared-memory session set-up of the shm backend: the mapping layout, the rings, the doorbells,
// and the handshake over an abstract AF_UNIX socket that passes the memfds with SCM_RIGHTS.
//
// Layout of the connection file (a memfd created by the connector, mapped by both sides):
//   [0, 4096)                    FileHeader (magic, version, ring size)
//   [4096, 4096 + 128)           RingControl of ring 0 (connector -> acceptor)
//   [4096 + 128, 4096 + 256)     RingControl of ring 1 (acceptor -> connector)
//   [8192, 8192 + 32832)         MailboxInbox of the acceptor (the connector sends into it)
//   [41024, 41024 + 32832)       MailboxInbox of the connector
//   [77824, 77824 + R)           bytes of ring 0;   [77824 + R, 77824 + 2R) bytes of ring 1
// Each device also owns a one-page doorbell memfd that it hands to every peer: a peer that
// produced or consumed ring bytes bumps the futex word there, and wakes the device's progress
// loop (FUTEX_WAKE, shared) only when that loop announced that it sleeps.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "mailbox.hpp"
#include "shm/frame.hpp"

namespace plexus::transport::internal::shm {

inline constexpr uint32_t kFileMagic = 0x53584c50;  // "PLXS"
inline constexpr uint32_t kProtocolVersion = 2;
inline constexpr size_t kMailboxAreaOffset = 8192;
inline constexpr size_t kRingAreaOffset = 77824;
inline constexpr size_t kMinRingBytes = size_t{64} << 10;
inline constexpr size_t kMaxRingBytes = size_t{1} << 30;

// Owns a file descriptor.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  ~UniqueFd();
  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  bool valid() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Owns a shared mapping.
class Mapping {
 public:
  Mapping() = default;
  Mapping(void* data, size_t size) : data_(static_cast<uint8_t*>(data)), size_(size) {}
  Mapping(Mapping&& o) noexcept : data_(o.data_), size_(o.size_) { o.data_ = nullptr; }
  Mapping& operator=(Mapping&& o) noexcept;
  ~Mapping();
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Maps `size` bytes of `fd` shared read-write.
absl::StatusOr<Mapping> MapShared(int fd, size_t size, const char* what);
// A connection's rings are faulted in while it is made, one byte touched per page, not by its
// first megabytes of traffic (a fault costs microseconds, more under virtualisation; a page's
// copy through the ring a fraction of one). Each covers at most the first kFaultInLimit bytes.
inline constexpr size_t kFaultInLimit = size_t{64} << 20;
// Our own fresh file: a store of 0 into every page.
void FaultInOwnFile(const Mapping& m);
// A peer's file: a load from every page the file already holds (mincore), none from a hole, so
// that a peer's file never makes this process allocate.
void FaultInPeerFile(const Mapping& m);

// One direction of a connection: a single-producer single-consumer byte ring whose positions
// grow forever (position % capacity is the byte offset). Nothing here trusts the peer: the
// reader of a position checks it against what it knows before using it.
class Ring {
 public:
  Ring() = default;
  Ring(uint8_t* bytes, uint64_t capacity, uint64_t* head, uint64_t* tail)
      : bytes_(bytes), capacity_(capacity), head_(head), tail_(tail) {}

  uint64_t capacity() const { return capacity_; }
  uint64_t LoadHead() const {
    return std::atomic_ref<uint64_t>(*head_).load(std::memory_order_acquire);
  }
  uint64_t LoadTail() const {
    return std::atomic_ref<uint64_t>(*tail_).load(std::memory_order_acquire);
  }
  void StoreHead(uint64_t v) {
    std::atomic_ref<uint64_t>(*head_).store(v, std::memory_order_release);
  }
  void StoreTail(uint64_t v) {
    std::atomic_ref<uint64_t>(*tail_).store(v, std::memory_order_release);
  }

  void CopyIn(uint64_t pos, const void* src, size_t n) {
    const size_t at = pos & (capacity_ - 1);
    const size_t first = n < capacity_ - at ? n : capacity_ - at;
    std::memcpy(bytes_ + at, src, first);
    if (first < n) std::memcpy(bytes_, static_cast<const uint8_t*>(src) + first, n - first);
  }
  void CopyOut(uint64_t pos, void* dst, size_t n) const {
    const size_t at = pos & (capacity_ - 1);
    const size_t first = n < capacity_ - at ? n : capacity_ - at;
    std::memcpy(dst, bytes_ + at, first);
    if (first < n) std::memcpy(static_cast<uint8_t*>(dst) + first, bytes_, n - first);
  }
  // The ring bytes of [pos, pos + n) as at most two contiguous pieces.
  struct Pieces {
    const uint8_t* first;
    size_t first_size;
    const uint8_t* second;
    size_t second_size;
  };
  Pieces View(uint64_t pos, size_t n) const {
    const size_t at = pos & (capacity_ - 1);
    const size_t first = n < capacity_ - at ? n : capacity_ - at;
    return {bytes_ + at, first, bytes_, n - first};
  }
  // The same pieces, writable: where a producer writes a frame's payload in place.
  std::pair<absl::Span<uint8_t>, absl::Span<uint8_t>> WritableView(uint64_t pos, size_t n) {
    const Pieces p = View(pos, n);
    return {absl::MakeSpan(bytes_ + (pos & (capacity_ - 1)), p.first_size),
            absl::MakeSpan(bytes_, p.second_size)};
  }

 private:
  uint8_t* bytes_ = nullptr;
  uint64_t capacity_ = 0;
  uint64_t* head_ = nullptr;
  uint64_t* tail_ = nullptr;
};

// A device's doorbell: one page of shared memory holding a futex word and a sleeper count.
class Doorbell {
 public:
  Doorbell() = default;
  explicit Doorbell(uint8_t* page);
  // Wakes the owner if it announced that it sleeps; callers first publish what they did.
  void Ring();
  // Owner side. Sleep protocol: token = BeginSleep(); re-check for work; if none,
  // Sleep(token, max); always EndSleep().
  uint32_t BeginSleep();
  void Sleep(uint32_t token, absl::Duration max);
  void EndSleep();

 private:
  uint32_t* seq_ = nullptr;
  uint32_t* sleepers_ = nullptr;
};

// A doorbell page of this process: the memfd (handed to peers) and its mapping.
struct LocalDoorbell {
  UniqueFd fd;
  Mapping mapping;
  Doorbell bell;
};
absl::StatusOr<LocalDoorbell> CreateDoorbell();

// Knobs of a handshake. Tests use the overrides to play a misbehaving peer.
struct HandshakeOptions {
  size_t ring_bytes = size_t{4} << 20;  // connector: power of two in [kMinRingBytes, kMaxRingBytes]
  absl::Duration timeout = absl::Seconds(10);
  bool allow_cma = true;  // false: tell the peer that cross-memory reads of it are refused
  uint32_t version = kProtocolVersion;  // test override
  uint32_t magic = kFileMagic;          // test override
};

// One established session, from either side.
struct Session {
  UniqueFd socket;  // kept open: EOF / POLLHUP on it is how a dead peer is noticed
  Mapping file;
  Mapping peer_doorbell_page;
  Doorbell peer_doorbell;
  Ring tx;                          // what this side writes
  Ring rx;                          // what this side reads
  MailboxInbox* mail_tx = nullptr;  // the peer's inbox, in the connection file
  MailboxInbox* mail_rx = nullptr;  // this side's inbox
  pid_t peer_pid = 0;
  bool peer_can_pull = false;  // the peer reads this side's memory with process_vm_readv
  std::string peer_address;
};

// The abstract socket name Listen("") picks: unique per process and call.
std::string UniqueAddress();
// A listening SOCK_SEQPACKET socket on the abstract name `address`.
absl::StatusOr<UniqueFd> ListenSocket(const std::string& address);
// Connects to `address`, creates the connection file, and handshakes.
absl::StatusOr<Session> ConnectSession(const std::string& address, int local_doorbell_fd,
                                       const HandshakeOptions& options);
// Handshakes as the acceptor on an accepted socket (Begin, then Finish within options.timeout).
absl::StatusOr<Session> AcceptSession(UniqueFd socket, int local_doorbell_fd,
                                      const HandshakeOptions& options);
// The acceptor's handshake in two steps, so that a listener can serve many connectors at once
// without blocking on any: Begin reads the connector's hello (call it once the socket is
// readable), checks it and replies; Finish reads the connector's final message (once readable
// again) and completes `session`. Both refuse a peer whose messages are malformed.
absl::StatusOr<Session> BeginAcceptSession(UniqueFd socket, int local_doorbell_fd,
                                           const HandshakeOptions& options);
absl::Status FinishAcceptSession(Session* session, absl::Time deadline);

// Reads the bytes of `segments` (addresses in process `pid`) into `dst`, in order; loops over
// partial reads. Errors carry the errno text (EPERM/ENOSYS: cross-memory attach refused; ESRCH:
// the peer is gone; EFAULT: the peer named memory it does not have).
absl::Status CmaRead(pid_t pid, uint8_t* dst, absl::Span<const CmaSegment> segments);

}  // namespace plexus::transport::internal::shm

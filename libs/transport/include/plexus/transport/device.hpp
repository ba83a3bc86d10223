// A Device is one backend instance: it registers memory, listens and connects.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "plexus/transport/completion.hpp"
#include "plexus/transport/connection.hpp"
#include "plexus/transport/memory.hpp"
#include "plexus/transport/types.hpp"

namespace plexus::transport {

enum class ProgressMode : uint8_t {
  kThread = 0,  // a device thread moves bytes; callers only consume completions
  kCaller = 1,  // CompletionQueue::Poll/Wait move bytes in the caller's thread (lowest latency)
};

// Settings of the tcp backend (DeviceOptions::tcp); other backends ignore them.
struct TcpOptions {
  // The congestion control (TCP_CONGESTION) of connections whose two ends are on this host (the
  // peer is a loopback address or the socket's own address), "" = the system's
  // (net.ipv4.tcp_congestion_control). Loopback has no congestion to control; BBR, a common
  // system default, paces every send at its bandwidth estimate, which on loopback lags the
  // bursts of a collective (docs/measurements/collectives.md, "tcp 2 processes 1 MiB: launch
  // order and congestion control"). Reno neither paces nor needs privileges (it is always in
  // net.ipv4.tcp_allowed_congestion_control); a name the kernel refuses fails the connection.
  // Connections to other hosts keep the system's.
  std::string loopback_congestion_control = "reno";
  // Sockets per connection, 1..64; messages of at least `stripe_threshold` bytes are striped.
  int sockets_per_connection = 1;
  size_t stripe_threshold = size_t{1} << 20;
};

// Settings of the shm backend (DeviceOptions::shm); other backends ignore them.
struct ShmOptions {
  // Bytes of each direction's ring.
  size_t ring_bytes = size_t{4} << 20;
  // Messages and writes of at least this many bytes are pulled by the receiver with cross-memory
  // attach (one copy) instead of streaming through the ring (two copies, made by both sides at
  // once). 0 = default (2 MiB, where one transfer with a CPU per side is fastest; lower it when
  // CPUs, not copies in flight, are short). PLEXUS_SHM_CMA_THRESHOLD overrides.
  size_t cma_threshold = 0;
  // The same from a lower size for a send on a connection whose own receives posted take at
  // least as many bytes (a two-way exchange, as in a 2-process allgather or allreduce): then the
  // sending CPU has its own copy to make, and one copy per side beats the ring's two.
  // 0 = default (128 KiB); a value at or above cma_threshold turns it off.
  // PLEXUS_SHM_EXCHANGE_CMA_THRESHOLD overrides.
  size_t exchange_cma_threshold = 0;
  // The same from this size for a send that finds its connection idle (nothing queued or
  // awaiting the peer's acknowledgement before it): a lone one-way message, such as a
  // 2-process broadcast's, which the receiver then pulls from the sender's buffer in one copy.
  // Sends queued behind it keep the ring, where the two sides' copies overlap. It pays only when
  // the receiver has a CPU of its own to pull with, which the transport cannot know:
  // 0 = default (off); a communicator that creates its devices sets 128 KiB when its ranks do not
  // outnumber the host's CPUs. PLEXUS_SHM_LONE_CMA_THRESHOLD overrides a 0 here.
  size_t lone_cma_threshold = 0;
};

// A device's settings: those of every backend, then one group per backend with settings of its
// own (as Gloo's per-transport attributes).
struct DeviceOptions {
  Backend backend = Backend::kTcp;
  ProgressMode progress = ProgressMode::kThread;
  // tcp: local IP to bind listening and outgoing sockets to ("" = any), so that a multipath
  // layer can choose the path. verbs: the RDMA device name or local IP ("" = first device).
  std::string local_address = {};
  // An operation that makes no progress for this long fails its connection (DeadlineExceeded).
  absl::Duration op_timeout = absl::Seconds(30);
  absl::Duration connect_timeout = absl::Seconds(10);
  // Frames announcing more than this are treated as malformed.
  size_t max_message_bytes = size_t{1} << 34;
  // Bytes held for messages that arrive before their receive is posted (PostRecv), per
  // connection and over all connections of the device. 0 = the environment's
  // PLEXUS_MAX_HELD_BYTES_PER_CONNECTION / PLEXUS_MAX_HELD_BYTES_PER_DEVICE, else 256 MiB / 1 GiB.
  // When the next message does not fit, the backend stops reading from that connection until
  // receives are posted (tcp and shm: the sender blocks, and its op_timeout runs); a message that
  // alone exceeds a cap while no receive is posted fails the connection (ResourceExhausted).
  // inproc refuses such a PostSend instead; verbs fails the connection.
  size_t max_held_bytes_per_connection = 0;
  size_t max_held_bytes_per_device = 0;
  TcpOptions tcp = {};
  ShmOptions shm = {};
};

// Pins one connection to a network path (a multipath layer opens one connection per path):
// where it leaves from and, on RDMA, which source GID and flow label its queue pair uses.
struct PathBinding {
  // tcp, verbs: the local IP the connection leaves from ("" = DeviceOptions::local_address).
  // verbs: the rdma_cm id is bound to it, which picks the RDMA port and that address's GID.
  std::string local_address;
  // verbs: the queue pair's source GID table index (`ibv_query_gid_table`, rdma-core's
  // `show_gids`); -1 = the GID of local_address, its RoCE v2 entry where the port has one. An
  // explicit index must hold local_address's GID (e.g. to pick its RoCE v1 entry instead).
  int gid_index = -1;
  // verbs: the flow label of the queue pair's GRH, at most 20 bits (kMaxFlowLabel). RoCE v2
  // NICs derive the UDP source port from it (RoceV2SourcePort), which is what ECMP switches
  // hash: paths with distinct labels can take distinct equal-cost routes. 0 = the NIC's own
  // choice (mlx5 and rxe derive it from the two queue pair numbers).
  uint32_t flow_label = 0;
};

inline constexpr uint32_t kMaxFlowLabel = 0xFFFFF;

// InvalidArgument naming `what` (e.g. "path 2") and the field: a flow label over 20 bits, or a
// gid_index below -1 or above 255.
absl::Status ValidatePathBinding(const PathBinding& binding, std::string_view what);

// The UDP source port a RoCE v2 NIC sends a non-zero `flow_label` with (Linux's
// rdma_flow_label_to_udp_sport: low 14 bits XOR the high 6, in 0xC000..0xFFFF).
uint16_t RoceV2SourcePort(uint32_t flow_label);

// Accepts connections on the address it reports.
class Listener {
 public:
  virtual ~Listener() = default;
  // The address peers pass to Device::Connect (tcp "ip:port", shm/inproc a name).
  virtual std::string address() const = 0;
  // Waits for the next incoming connection; DeadlineExceeded after `timeout`.
  virtual absl::StatusOr<std::unique_ptr<Connection>> Accept(
      CompletionQueue* cq, absl::Duration timeout = absl::InfiniteDuration()) = 0;
};

class Device : public ProgressDriver {
 public:
  // Creates a device of options.backend; Unavailable (with the reason) when the backend is not
  // compiled in or no hardware exists.
  static absl::StatusOr<std::shared_ptr<Device>> Create(const DeviceOptions& options);
  // Whether Create(backend) can succeed on this machine now; the reason when not.
  static bool Available(Backend backend, std::string* why_not = nullptr);

  ~Device() override = default;
  virtual Backend backend() const = 0;
  const DeviceOptions& options() const { return options_; }

  // A completion queue wired to this device's progress mode.
  virtual std::unique_ptr<CompletionQueue> CreateCompletionQueue();

  virtual absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(
      void* data, size_t bytes, MemoryKind kind = MemoryKind::kHost) = 0;

  // address "" picks a free one (tcp: an ephemeral port on local_address).
  virtual absl::StatusOr<std::unique_ptr<Listener>> Listen(std::string_view address) = 0;

  // Connects to a Listener's address; completions of the connection go to `cq`.
  virtual absl::StatusOr<std::unique_ptr<Connection>> Connect(std::string_view address,
                                                              CompletionQueue* cq) = 0;

  // Connect from `local_address` instead of DeviceOptions::local_address (tcp: the IP the
  // connection's sockets bind to; verbs: the IP the rdma_cm id binds to, which picks the port
  // and source GID, on this device), so that one device, and so one set of registered regions,
  // can open one connection per network path: ConnectOnPath with a binding that names the
  // source address alone. "" or the device's own address is plain Connect; backends that cannot
  // choose a source per connection (inproc, shm) return Unimplemented for any other address.
  absl::StatusOr<std::unique_ptr<Connection>> ConnectFrom(std::string_view local_address,
                                                          std::string_view address,
                                                          CompletionQueue* cq);

  // Connect over one network path: from path.local_address (as ConnectFrom) and, on verbs, with
  // the queue pair's source GID index and flow label (set in its transition to RTR). Errors:
  // InvalidArgument from ValidatePathBinding; InvalidArgument when the GID index is not in the
  // port's table or does not hold local_address (naming both and the valid entries);
  // Unimplemented from backends without GIDs (tcp, shm, inproc) for a gid_index or flow_label,
  // and from backends that cannot choose a source (shm, inproc) for another local_address. The
  // base implementation is the latter's: plain Connect for "" or the device's own address.
  virtual absl::StatusOr<std::unique_ptr<Connection>> ConnectOnPath(const PathBinding& path,
                                                                    std::string_view address,
                                                                    CompletionQueue* cq);

  // Listen for one network path: address "" = an ephemeral port on path.local_address (or on
  // the device's address when that is "" too); accepted connections take the binding's GID
  // index and flow label (verbs), checked against the port of each connection as it arrives.
  // The same errors as ConnectOnPath.
  virtual absl::StatusOr<std::unique_ptr<Listener>> ListenOnPath(const PathBinding& path,
                                                                 std::string_view address);

  // ProgressDriver: a no-op sleep in kThread mode.
  void Progress(absl::Duration max_block) override;

 protected:
  explicit Device(DeviceOptions options) : options_(std::move(options)) {}
  // For backends without GIDs: OK when `path` names a source address only; else
  // InvalidArgument (ValidatePathBinding) or Unimplemented naming the backend.
  static absl::Status RequireAddressOnly(const PathBinding& path, Backend backend);
  // Caller-mode progress of the backend.
  virtual void DriveProgress(absl::Duration max_block) = 0;

 private:
  DeviceOptions options_;
};

}  // namespace plexus::transport

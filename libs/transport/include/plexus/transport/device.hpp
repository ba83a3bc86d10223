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

struct DeviceOptions {
  Backend backend = Backend::kTcp;
  ProgressMode progress = ProgressMode::kThread;
  // tcp: local IP to bind listening and outgoing sockets to ("" = any), so that a multipath
  // layer can choose the path. verbs: the RDMA device name or local IP ("" = first device).
  std::string local_address;
  // tcp: sockets per connection; messages of at least `stripe_threshold` bytes are striped.
  int sockets_per_connection = 1;
  size_t stripe_threshold = size_t{1} << 20;
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
  // shm: bytes of each direction's ring.
  size_t shm_ring_bytes = size_t{4} << 20;
  // shm: messages and writes of at least this many bytes are pulled by the receiver with
  // cross-memory attach (one copy) instead of streaming through the ring (two copies, made by
  // both sides at once). 0 = default (2 MiB, where one transfer with a CPU per side is fastest;
  // lower it when CPUs, not copies in flight, are short). PLEXUS_SHM_CMA_THRESHOLD overrides.
  size_t shm_cma_threshold = 0;
};

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
  // connection's sockets bind to), so that one device, and so one set of registered regions,
  // can open one connection per network path. "" or the device's own address is plain Connect;
  // backends that cannot choose a source per connection (inproc, shm, verbs) return
  // Unimplemented for any other address.
  virtual absl::StatusOr<std::unique_ptr<Connection>> ConnectFrom(std::string_view local_address,
                                                                  std::string_view address,
                                                                  CompletionQueue* cq);

  // ProgressDriver: a no-op sleep in kThread mode.
  void Progress(absl::Duration max_block) override;

 protected:
  explicit Device(DeviceOptions options) : options_(std::move(options)) {}
  // Caller-mode progress of the backend.
  virtual void DriveProgress(absl::Duration max_block) = 0;

 private:
  DeviceOptions options_;
};

}  // namespace plexus::transport

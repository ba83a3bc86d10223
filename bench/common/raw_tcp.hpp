// The raw-socket references the benchmarks measure Plexus against (plexus-bench-transport's raw
// TCP ping-pong and bulk transfer, plexus-bench-rpc's raw TCP ping-pong floor), and CPU pinning,
// shared so that every bench runs its reference the same way. Loopback (127.0.0.1) only.
#pragma once

#include <sys/types.h>

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace plexus::bench {

// A listening socket on 127.0.0.1 with an ephemeral port (written to *port).
absl::StatusOr<int> TcpListenLoopback(int* port);
// Accepts one connection on `listen_fd`, with TCP_NODELAY.
absl::StatusOr<int> TcpAccept(int listen_fd);
// Connects to 127.0.0.1:port with TCP_NODELAY.
absl::StatusOr<int> TcpConnectLoopback(int port);
// Blocking reads/writes of exactly n bytes; an error names the operation and errno (or EOF).
// With a `spin`, each read polls the socket without blocking for that long before it blocks:
// the reference under the same waiting policy as a Plexus wait that spins first.
absl::Status ReadFull(int fd, void* data, size_t n, absl::Duration spin = absl::ZeroDuration());
// One recv() of at most `len` bytes after polling for `spin`: what recv() returns.
ssize_t RecvAfterSpin(int fd, void* data, size_t len, absl::Duration spin);
absl::Status WriteFull(int fd, const void* data, size_t n);
// Pins the calling thread to `cpu` (modulo the online CPUs); a negative cpu: every CPU.
void PinToCpu(int cpu);

}  // namespace plexus::bench

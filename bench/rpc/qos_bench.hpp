// plexus-bench-rpc's global QoS figures: small calls' latency under a bulk background, with and
// without a "qos" engine on the server, and with and without one on the client's channel
// (qos_bench.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace plexus::benchrpc {

struct QosMixOptions {
  double seconds = 2;  // measured time of one run (after a warm-up of 200 ms)
  uint32_t bulk_bytes = 256 << 10;
  int bulk_inflight = 16;     // bulk calls kept in flight by the bulk connection
  uint32_t small_bytes = 64;  // one small call at a time from another connection
  uint32_t work_passes = 1;   // the handler reads its payload this many times (its service time)
  bool qos = false;           // the qos engine is on the server's (client's) chain from the start
  size_t window = 4;          // client side: the channel's window (calls in flight)
};

struct QosMixSample {
  double small_median_us = 0;
  double small_p99_us = 0;
  double small_calls = 0;
  double bulk_rate = 0;  // bulk calls/s
  uint64_t failed = 0;
};

// One run in this process over tcp 127.0.0.1, a fresh server: with options.qos the qos engine
// (max_concurrent 1, small_bytes 1024) is on its chain from the start, otherwise no engine.
QosMixSample RunQosMix(const QosMixOptions& options);

// The client side, in this process over tcp 127.0.0.1: one channel with a window of
// options.window calls; options.bulk_inflight threads make bulk calls one after another (more
// than the window: the rest wait for a slot) and one thread makes small calls. With options.qos
// the qos engine (small_bytes 1024) is on the channel's chain from the start (the server has
// none): a small call takes the next free slot instead of waiting behind the bulk callers.
QosMixSample RunClientQosMix(const QosMixOptions& options);

}  // namespace plexus::benchrpc

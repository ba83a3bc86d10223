// plexus-bench-restructure --only motion: the five pipelines' restructuring fused with the data's
// motion between two processes (a forked receiver; tcp on 127.0.0.1 under the system's
// congestion control, and shm), end to end: from the sender's start until the receiver has the
// restructured bytes in its buffer and acknowledged them. Per pipeline and transport, the
// median over --runs of each way's mean over 4 messages in a row, the ways alternating run by
// run (a balanced order):
//
//   fused                 a produced send: the program's OutputStream writes the output into the
//                         transport's frames (tcp's staging chunk, shm's ring) from the inputs
//   copy_restructure_send Fianchetto's Multi-Axl baseline: copy the inputs into a staging buffer
//                         (the accelerator's DMA to the host), run the executor into a full-size
//                         output buffer, send it
//   restructure_send      run the executor into the output buffer, send it (fused against this
//                         isolates the fusion; the baseline against it, the copy)
//   send                  send the output already made (the transfer alone)
//   restructure           the executor alone, no send
//
// A program whose output does not stream (PII redaction: bit copies of its parts) runs its best
// non-fused path in the fused column, named by the figures' "fused_path" field: a gather send of
// its inputs when the output is their concatenation, else restructure_send. Every received
// message is checked against the program's output computed once (a difference fails the run).
#pragma once

#include <string>

#include "plexus/tooling/figures.hpp"

namespace plexus::bench::restructure {

struct MotionArgs {
  int runs = 5;
  double shape_scale = 1.0;  // of the pipelines' outermost dimension
  std::string transport;     // "tcp", "shm" or "" (both)
  bool pin = true;           // the sender on CPU 0, the receiver on CPU 1
};

// Adds the figures to `out`; false when a run failed or a received message was wrong (the
// reason on stderr).
bool RunMotion(const MotionArgs& args, plexus::tooling::FigureWriter& out);

}  // namespace plexus::bench::restructure

// plexus-bench-restructure --only device: the five pipelines on a CUDA device, from device inputs
// to the restructured output in page-locked host memory (what a device-buffer send transmits),
// per pipeline the median over --runs of, alternating run by run:
//
//   fused    DeviceExecutor::Run with the output in page-locked host memory: the kernels write
//            across the bus (what DeviceOutputStream does before the transport sends)
//   staged   the program into device memory, then a device-to-host copy (two passes)
//   device   the program into device memory alone (the kernels' own time)
//
// and, with --compare, the same stages as chains of torch operations on the GPU followed by
// `.cpu()` (python_peers.py --device cuda; torch built with CUDA). The send that follows is the
// same host-memory send on every side (--only motion measures it). Every fused output is checked
// against the CPU executor's (bit for bit, or within the documented bounds where Pow and Log10
// run). Without a device: one line saying why, exit 77.
#pragma once

#include "plexus/tooling/figures.hpp"

namespace plexus::bench::restructure {

struct DeviceArgs {
  int runs = 5;
  double shape_scale = 1.0;
  bool compare = false;
  std::string python;  // runs the torch peer (--compare)
};

// 0 when every run was right, 1 on a failure or a wrong output, 77 without a device.
int RunDevice(const DeviceArgs& args, plexus::tooling::FigureWriter& out);

}  // namespace plexus::bench::restructure

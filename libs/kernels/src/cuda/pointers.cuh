// The pointer arrays the multi-buffer kernels (reduce.cu, gather.cu) take by value, as
// src/device_kernels.cpp passes them to cuLaunchKernel.
#pragma once

// Must match kMaxDeviceReduceInputs in plexus/kernels/reduce.hpp.
constexpr int kMaxInputs = 16;

struct Inputs {
  const void* in[kMaxInputs];
};
struct Outputs {
  void* out[kMaxInputs];
};

// What the host hands the restructuring kernels (cuda/restructure.cu) for one step: a plain
// struct passed by value, laid out alike by the host compiler and nvcc (fixed-width fields only),
// and (host code only) how a step becomes one.
#pragma once

#include <cstdint>

namespace plexus::restructure::internal {

inline constexpr int kDeviceLevels = 6;  // kMaxLevels

// Element types as the kernels know them (not kernels::DataType's values).
enum DeviceType : int32_t {
  kDevF32 = 0,
  kDevF16 = 1,
  kDevBF16 = 2,
  kDevI32 = 3,
  kDevI8 = 4,
  kDevU8 = 5
};
// Ops as the kernels know them.
enum DeviceOp : int32_t {
  kDevCopyBits = 0,  // kCopy, or kCast to the same type
  kDevCast = 1,
  kDevAdd = 2,
  kDevMul = 3,
  kDevDiv = 4,
  kDevPow = 5,
  kDevLog10 = 6,
  kDevMaxPool = 7,
};

struct DeviceStepParams {
  int64_t iters[kDeviceLevels];  // levels [0, levels) used, level 0 outermost
  int64_t dst_stride[kDeviceLevels];
  int64_t src1_stride[kDeviceLevels];
  int64_t src2_stride[kDeviceLevels];
  int64_t dst_base, src1_base, src2_base;  // in elements
  int64_t points;  // the points a thread handles one of: every point, or (max pooling) every
                   // point of the outer levels
  int32_t levels;
  int32_t outer_levels;  // levels the points walk (max pooling: levels - window levels)
  int32_t op;            // DeviceOp
  int32_t dst_type, src1_type, src2_type;  // DeviceType
  int32_t src2_is_scalar;                  // binary ops: 1 scalar, 0 a buffer
  int32_t aligned;                         // every operand's memory is aligned to its element size
  float scalar;
  int32_t pad;
};

// Element-wise steps over the same nest run as one kernel (a fused group): a thread computes
// every step at its point, keeping each result in a register for the later steps that read it
// through the same access, and stores only what is read after the group (or is an output).
inline constexpr int kDeviceFusedSteps = 8;

struct DeviceFusedParams {
  DeviceStepParams steps[kDeviceFusedSteps];  // steps[0].points: the group's points
  uint8_t* dst[kDeviceFusedSteps];
  const uint8_t* src1[kDeviceFusedSteps];
  const uint8_t* src2[kDeviceFusedSteps];  // null unless a buffer
  int32_t forward1[kDeviceFusedSteps];     // the group's step whose result src1 is, or -1
  int32_t forward2[kDeviceFusedSteps];     // the same for src2
  int32_t store[kDeviceFusedSteps];        // 0: the result is only forwarded
  int32_t count;
  int32_t pad;
};

}  // namespace plexus::restructure::internal

#if !defined(__CUDACC__)
#include <vector>

#include "bind.hpp"

namespace plexus::restructure::internal {

// The kernel parameters of a validated step whose buffers are bound to `bufs` (`aligned` from
// their memory).
DeviceStepParams StepParams(const Step& step, const std::vector<Bound>& bufs);

// A run of a validated program's steps launched as one kernel: one step (the step kernel), or a
// fused group (the fused kernel) with, per step, where its operands come from and whether its
// result is stored.
struct DeviceLaunch {
  std::vector<int> steps;  // indices into Program::steps, in order
  // Fused groups (steps.size() > 1) only: the steps re-expressed on the group's common nest, and
  // per step the sources of its operands (a step of the group, or -1) and whether it is stored.
  std::vector<Step> fused;
  std::vector<int32_t> forward1, forward2, store;
};
// The program's launches: maximal runs of element-wise steps (casts between types, arithmetic)
// over the same points (on a common refinement of their nests, at most kDeviceLevels levels)
// that read what an earlier step of the run wrote only through the access it wrote (then
// forwarded) and write nothing an earlier step of the run read or wrote through another access,
// at most kDeviceFusedSteps; every other step alone.
std::vector<DeviceLaunch> PlanDevice(const Program& program);
// The fused kernel's parameters of a group (`launch.steps.size() > 1`) bound to `bufs`.
DeviceFusedParams FusedParams(const DeviceLaunch& launch, const std::vector<Bound>& bufs);

}  // namespace plexus::restructure::internal
#endif

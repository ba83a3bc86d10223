// The restructuring stages of five accelerator pipelines (Fianchetto, Table 3.1) as Programs at
// given shapes; the defaults are the table's. Each function documents the concrete semantics
// chosen for its stages (the table names the ops only). InvalidArgument for shapes that do not
// fit (naming the field).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "plexus/restructure/program.hpp"

namespace plexus::restructure::pipelines {

// Video surveillance (H.264 decoder -> object detector): a (height, width, channels) u8 frame.
//   inputs "frame" u8 [h*w*c]; output "tensor" out_dtype [c * (h/2) * (w/2)]
//   1. Mul:     scaled[i] = f32(frame[i]) * scale                     (scratch f32)
//   2. MaxPool: pooled[y][x][c] = max over the 2x2 window of scaled    (scratch f32, h/2 x w/2 x c)
//   3-4. Reshape + Cast: tensor[c][y][x] = out_dtype(pooled[y][x][c]): the detector's planar
//      (channel-major) layout, written by the cast step's strides (no separate pass).
struct VideoShape {
  int64_t height = 960, width = 540, channels = 3;
  float scale = 1.0f / 255.0f;
  DataType out_dtype = DataType::kF16;
};
absl::StatusOr<Program> VideoSurveillance(const VideoShape& shape = {});

// Sound detection (FFT -> SVM): magnitudes of `frames` x `bins` f32 FFT outputs.
//   inputs "magnitude" f32 [frames*bins], "mel_weights" f32 [bins]; output "features"
//   out_dtype [frames*bins]; scratch "power" f32 [frames*bins]
//   1. Pow:   power = magnitude ** 2                       (the spectrogram)
//   2. Add:   power = power + epsilon                      (in place; keeps log10 finite)
//   3. Mul:   power[f][b] = power[f][b] * mel_weights[b]   (the weight tensor, stride 0 over
//   frames)
//   4. Div:   power = power / reference                    (relative to a reference power)
//   5. Log10: power = log10(power)
//   6. Cast:  features = out_dtype(power)
struct SoundShape {
  int64_t frames = 8192, bins = 768;
  float epsilon = 1e-10f, reference = 1.0f;
  DataType out_dtype = DataType::kF16;
};
absl::StatusOr<Program> SoundDetection(const SoundShape& shape = {});

// Brain stimulation (FFT -> PPO policy): (windows, bins, electrodes) f32 spectra.
//   inputs "spectrum" f32 [w*b*e], "baseline" f32 [b*e]; output "observation" out_dtype [w*b*e];
//   scratch "power" f32
//   1. Pow: power = spectrum ** 2
//   2. Div: power[w][b][e] = power[w][b][e] / baseline[b][e]   (stride 0 over windows)
//   3. Mul: power = power * gain
//   4. Cast: observation = out_dtype(power)
struct BrainShape {
  int64_t windows = 256, bins = 1024, electrodes = 8;
  float gain = 0.5f;
  DataType out_dtype = DataType::kBF16;
};
absl::StatusOr<Program> BrainStimulation(const BrainShape& shape = {});

// Personal information redaction (AES-GCM -> regex): `parts` decrypted streams of rows x cols u8.
//   inputs "part0".."part<n-1>" u8 [rows*cols]; output "text" u8 [parts*rows*cols]
//   Concat: axis 0 puts the parts one after another; axis 1 puts row r of every part side by
//   side (text is rows x parts*cols). Flatten: text is already the flat byte stream the regex
//   engine scans (a view: no step).
struct PiiShape {
  int64_t parts = 4, rows = 2048, cols = 768;
  int axis = 0;
};
absl::StatusOr<Program> PiiRedaction(const PiiShape& shape = {});

// Database hash join (Gzip -> hash join): `parts` decompressed partitions of rows x cols i32.
//   inputs "part0".."part<n-1>" i32 [rows*cols]; output "table" out_dtype [parts*rows*cols];
//   scratch "rows" i32
//   1. Concat: the partitions one after another into "rows" (parts*rows x cols)
//   2. Reshape: (parts, rows, cols) -> (parts*rows, cols), the join engine's table of tuples: a
//      view of contiguous data (no step)
//   3. Cast: table = out_dtype(rows), the key format the join engine takes
struct JoinShape {
  int64_t parts = 4, rows = 1024, cols = 512;
  DataType out_dtype = DataType::kF32;
};
absl::StatusOr<Program> DbHashJoin(const JoinShape& shape = {});

}  // namespace plexus::restructure::pipelines

// The correctness suite shared by the in-process tests (threads) and the multi-process helper:
// every collective against a straightforward reference, computed element by element.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "plexus/collectives/communicator.hpp"
#include "plexus/kernels/reduce.hpp"

namespace plexus::collectives::testing {

inline double Get(DataType dtype, const uint8_t* base, size_t i) {
  switch (dtype) {
    case DataType::kF32: {
      float v;
      std::memcpy(&v, base + 4 * i, 4);
      return v;
    }
    case DataType::kF64: {
      double v;
      std::memcpy(&v, base + 8 * i, 8);
      return v;
    }
    case DataType::kF16:
    case DataType::kBF16: {
      uint16_t v;
      std::memcpy(&v, base + 2 * i, 2);
      return dtype == DataType::kF16 ? plexus::kernels::HalfToFloat(v)
                                     : plexus::kernels::Bf16ToFloat(v);
    }
    case DataType::kI32: {
      int32_t v;
      std::memcpy(&v, base + 4 * i, 4);
      return v;
    }
    case DataType::kI64: {
      int64_t v;
      std::memcpy(&v, base + 8 * i, 8);
      return static_cast<double>(v);
    }
    case DataType::kU8:
      return base[i];
    case DataType::kI8:
      return static_cast<int8_t>(base[i]);
  }
  return 0;
}

// Integers wrap as the library's arithmetic does.
inline void Set(DataType dtype, uint8_t* base, size_t i, double v) {
  switch (dtype) {
    case DataType::kF32: {
      const float f = static_cast<float>(v);
      std::memcpy(base + 4 * i, &f, 4);
      break;
    }
    case DataType::kF64:
      std::memcpy(base + 8 * i, &v, 8);
      break;
    case DataType::kF16:
    case DataType::kBF16: {
      const uint16_t h = dtype == DataType::kF16
                             ? plexus::kernels::FloatToHalf(static_cast<float>(v))
                             : plexus::kernels::FloatToBf16(static_cast<float>(v));
      std::memcpy(base + 2 * i, &h, 2);
      break;
    }
    case DataType::kI32: {
      const int32_t x = static_cast<int32_t>(static_cast<uint32_t>(static_cast<int64_t>(v)));
      std::memcpy(base + 4 * i, &x, 4);
      break;
    }
    case DataType::kI64: {
      const int64_t x = static_cast<int64_t>(v);
      std::memcpy(base + 8 * i, &x, 8);
      break;
    }
    case DataType::kU8:
    case DataType::kI8:
      base[i] = static_cast<uint8_t>(static_cast<int64_t>(v));
      break;
  }
}

// Reduction inputs keep every partial result exact in every type (products of 1s and 2s stay
// below 2^8, sums below 2^7), so the reference does not depend on the reduction order.
inline double Input(ReduceOp op, int rank, size_t i) {
  if (op == ReduceOp::kProd) return ((rank + i) % 3 == 0) ? 2 : 1;
  return 1 + static_cast<double>((rank * 7 + i * 3) % 8);
}
// Data-movement inputs: distinct per (rank, index) modulo 120, exact in every type.
inline double Pattern(int rank, size_t i) {
  return 1 + static_cast<double>((rank * 31 + i * 7) % 120);
}

inline bool IsFloat(DataType dtype) {
  return dtype == DataType::kF32 || dtype == DataType::kF64 || dtype == DataType::kF16 ||
         dtype == DataType::kBF16;
}

// The expected element: op over ranks of Input(op, r, i), kAvg divided as the library does.
inline double Reference(DataType dtype, ReduceOp op, int n, size_t i) {
  double acc = Input(op, 0, i);
  for (int r = 1; r < n; ++r) {
    const double v = Input(op, r, i);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc += v;
        break;
      case ReduceOp::kProd:
        acc *= v;
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
    }
  }
  if (dtype == DataType::kU8) acc = static_cast<double>(static_cast<uint8_t>(acc));
  if (dtype == DataType::kI8) acc = static_cast<double>(static_cast<int8_t>(acc));
  if (op == ReduceOp::kAvg) {
    if (dtype == DataType::kF64) return acc / n;
    if (IsFloat(dtype)) return static_cast<float>(acc) / static_cast<float>(n);
    return static_cast<double>(static_cast<int64_t>(acc) / n);
  }
  return acc;
}

// A buffer whose data starts `misalign` bytes past an aligned allocation.
struct Buffer {
  std::vector<uint8_t> storage;
  uint8_t* data;
  Buffer(size_t bytes, size_t misalign) : storage(bytes + misalign + 64, 0xEE) {
    data = storage.data() + misalign;
  }
};

// Compares `count` elements of `got` with the reference bytes; "" when equal.
template <typename Expected>
std::string Compare(const char* what, DataType dtype, const uint8_t* got, size_t count,
                    Expected expected) {
  const size_t es = DataTypeSize(dtype);
  std::vector<uint8_t> want(es);
  for (size_t i = 0; i < count; ++i) {
    Set(dtype, want.data(), 0, expected(i));
    if (std::memcmp(want.data(), got + i * es, es) != 0) {
      return absl::StrCat(what, " ", std::string(DataTypeName(dtype)), ": element ", i, " is ",
                          Get(dtype, got, i), ", expected ", expected(i));
    }
  }
  return "";
}

struct SuiteResult {
  std::string error;  // first wrong result or failed call; "" when everything passed
  int calls = 0;
};

class Suite {
 public:
  Suite(Communicator& comm, size_t misalign) : comm_(comm), misalign_(misalign) {}

  // Records a failed call (the communicator is broken after it) or a wrong result.
  bool Check(const absl::Status& s, const std::string& what) {
    ++result_.calls;
    if (!s.ok() && result_.error.empty()) {
      result_.error = absl::StrCat(what, ": ", std::string(s.message()));
    }
    return s.ok();
  }
  void Note(const std::string& mismatch, const std::string& what) {
    if (!mismatch.empty() && result_.error.empty()) result_.error = what + ": " + mismatch;
  }
  bool broken() const { return !comm_.health().ok(); }

  void AllReduce(DataType dt, ReduceOp op, Algorithm a, size_t count, bool in_place) {
    const int n = comm_.size(), me = comm_.rank();
    const size_t es = DataTypeSize(dt);
    Buffer send(count * es, misalign_), recv(count * es, misalign_);
    for (size_t i = 0; i < count; ++i) Set(dt, send.data, i, Input(op, me, i));
    uint8_t* out = in_place ? send.data : recv.data;
    const std::string what =
        absl::StrCat("AllReduce ", std::string(ReduceOpName(op)), " ",
                     std::string(AlgorithmName(a)), " count ", count, in_place ? " in place" : "");
    if (!Check(comm_.AllReduce(send.data, out, count, dt, op, {a}), what)) return;
    Note(Compare("allreduce", dt, out, count, [&](size_t i) { return Reference(dt, op, n, i); }),
         what);
  }

  void Reduce(DataType dt, ReduceOp op, Algorithm a, size_t count, int root,
              bool in_place = false) {
    const int n = comm_.size(), me = comm_.rank();
    const size_t es = DataTypeSize(dt);
    Buffer send(count * es, misalign_), recv(count * es, misalign_);
    for (size_t i = 0; i < count; ++i) Set(dt, send.data, i, Input(op, me, i));
    const std::string what =
        absl::StrCat("Reduce ", std::string(ReduceOpName(op)), " ", std::string(AlgorithmName(a)),
                     " root ", root, " count ", count, in_place ? " in place" : "");
    uint8_t* out = in_place && me == root ? send.data : recv.data;
    if (!Check(comm_.Reduce(send.data, out, count, dt, op, root, {a}), what)) return;
    if (me == root) {
      Note(Compare("reduce", dt, out, count, [&](size_t i) { return Reference(dt, op, n, i); }),
           what);
    }
    // The send buffer must be untouched (unless it is the root's output).
    if (out == send.data) return;
    Note(Compare("reduce input", dt, send.data, count, [&](size_t i) { return Input(op, me, i); }),
         what);
  }

  void Broadcast(DataType dt, Algorithm a, size_t count, int root, bool in_place) {
    const int me = comm_.rank();
    const size_t es = DataTypeSize(dt);
    Buffer send(count * es, misalign_), recv(count * es, misalign_);
    for (size_t i = 0; i < count; ++i) Set(dt, send.data, i, Pattern(me, i));
    uint8_t* out = in_place ? send.data : recv.data;
    const std::string what =
        absl::StrCat("Broadcast ", std::string(AlgorithmName(a)), " root ", root);
    if (!Check(comm_.Broadcast(send.data, out, count, dt, root, {a}), what)) return;
    Note(Compare("broadcast", dt, out, count, [&](size_t i) { return Pattern(root, i); }), what);
  }

  void AllGather(DataType dt, Algorithm a, size_t count, bool in_place) {
    const int n = comm_.size(), me = comm_.rank();
    const size_t es = DataTypeSize(dt);
    Buffer send(count * es, misalign_), recv(count * es * n, misalign_);
    for (size_t i = 0; i < count; ++i) Set(dt, send.data, i, Pattern(me, i));
    const uint8_t* in = send.data;
    if (in_place) {
      std::memcpy(recv.data + me * count * es, send.data, count * es);
      in = recv.data + me * count * es;
    }
    const std::string what = absl::StrCat("AllGather ", std::string(AlgorithmName(a)), " count ",
                                          count, in_place ? " in place" : "");
    if (!Check(comm_.AllGather(in, recv.data, count, dt, {a}), what)) return;
    Note(Compare("allgather", dt, recv.data, count * n,
                 [&](size_t j) { return Pattern(static_cast<int>(j / count), j % count); }),
         what);
  }

  void ReduceScatter(DataType dt, ReduceOp op, Algorithm a, size_t count, bool in_place) {
    const int n = comm_.size(), me = comm_.rank();
    const size_t es = DataTypeSize(dt);
    Buffer send(count * es * n, misalign_), recv(count * es, misalign_);
    for (size_t j = 0; j < count * n; ++j) Set(dt, send.data, j, Input(op, me, j));
    uint8_t* out = in_place ? send.data + me * count * es : recv.data;
    const std::string what =
        absl::StrCat("ReduceScatter ", std::string(ReduceOpName(op)), " ",
                     std::string(AlgorithmName(a)), " count ", count, in_place ? " in place" : "");
    if (!Check(comm_.ReduceScatter(send.data, out, count, dt, op, {a}), what)) return;
    Note(Compare("reducescatter", dt, out, count,
                 [&](size_t i) { return Reference(dt, op, n, me * count + i); }),
         what);
  }

  void AllToAll(DataType dt, size_t count, bool in_place) {
    const int n = comm_.size(), me = comm_.rank();
    const size_t es = DataTypeSize(dt);
    Buffer send(count * es * n, misalign_), recv(count * es * n, misalign_);
    for (size_t j = 0; j < count * n; ++j) Set(dt, send.data, j, Pattern(me, j));
    uint8_t* out = in_place ? send.data : recv.data;
    const std::string what = absl::StrCat("AllToAll count ", count, in_place ? " in place" : "");
    if (!Check(comm_.AllToAll(send.data, out, count, dt), what)) return;
    Note(Compare("alltoall", dt, out, count * n,
                 [&](size_t j) {
                   return Pattern(static_cast<int>(j / count), me * count + j % count);
                 }),
         what);
  }

  // Counts differ per pair: f(a, b) = (a + b) % 3 + base; blocks are packed with a one-element
  // gap so that displacements matter.
  void AllToAllV(DataType dt, size_t base) {
    const int n = comm_.size(), me = comm_.rank();
    const size_t es = DataTypeSize(dt);
    auto f = [&](int a, int b) { return static_cast<size_t>((a + b) % 3) + base; };
    std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
    size_t s_total = 0, r_total = 0;
    for (int r = 0; r < n; ++r) {
      sc[r] = f(me, r);
      sd[r] = s_total;
      s_total += sc[r] + 1;
      rc[r] = f(r, me);
      rd[r] = r_total;
      r_total += rc[r] + 1;
    }
    Buffer send(s_total * es, misalign_), recv(r_total * es, misalign_);
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < sc[r]; ++i) Set(dt, send.data, sd[r] + i, Pattern(me, r * 100 + i));
    }
    const std::string what = absl::StrCat("AllToAllV base ", base);
    if (!Check(comm_.AllToAllV(send.data, sc, sd, recv.data, rc, rd, dt), what)) return;
    for (int r = 0; r < n; ++r) {
      Note(Compare("alltoallv", dt, recv.data + rd[r] * es, rc[r],
                   [&](size_t i) { return Pattern(r, me * 100 + i); }),
           what);
    }
  }

  void SendRecv(DataType dt, size_t count) {
    const int n = comm_.size(), me = comm_.rank();
    if (n == 1) return;
    const size_t es = DataTypeSize(dt);
    Buffer send(count * es, misalign_), recv(count * es, misalign_);
    for (size_t i = 0; i < count; ++i) Set(dt, send.data, i, Pattern(me, i));
    const int to = (me + 1) % n, from = (me + n - 1) % n;
    auto s = comm_.SendAsync(send.data, count, dt, to);
    auto r = comm_.RecvAsync(recv.data, count, dt, from);
    const std::string what = absl::StrCat("Send/Recv count ", count);
    if (!Check(s->Wait(), what) || !Check(r->Wait(), what)) return;
    Note(Compare("recv", dt, recv.data, count, [&](size_t i) { return Pattern(from, i); }), what);
  }

  // The whole matrix: collective x dtype x op x algorithm, odd counts, zero-length, in place.
  SuiteResult Run(bool full) {
    const int n = comm_.size();
    const Algorithm algorithms[] = {Algorithm::kRing, Algorithm::kHalvingDoubling,
                                    Algorithm::kTree};
    const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax,
                            ReduceOp::kAvg};
    for (int t = 0; t < kNumDataTypes && !broken(); ++t) {
      const DataType dt = static_cast<DataType>(t);
      for (Algorithm a : algorithms) {
        for (ReduceOp op : ops) {
          if (!full && op != ReduceOp::kSum && op != ReduceOp::kMax) continue;
          AllReduce(dt, op, a, 37, false);
          ReduceScatter(dt, op, a, 5, false);
          Reduce(dt, op, a, 19, (t + static_cast<int>(op)) % n);
        }
        Broadcast(dt, a, 23, t % n, false);
        AllGather(dt, a, 7, false);
      }
      AllToAll(dt, 3, false);
      AllToAllV(dt, t % 2);
      SendRecv(dt, 11);
    }
    for (Algorithm a : algorithms) {
      if (broken()) break;
      // Many chunks, in place, zero-length.
      AllReduce(DataType::kF32, ReduceOp::kSum, a, 4099, false);
      AllReduce(DataType::kBF16, ReduceOp::kAvg, a, 1001, true);
      AllReduce(DataType::kI64, ReduceOp::kMin, a, 0, false);
      // One mailbox fragment exactly, one more element, and the mailbox path's limit.
      AllReduce(DataType::kU8, ReduceOp::kMax, a, 232, false);
      AllReduce(DataType::kU8, ReduceOp::kSum, a, 233, true);
      AllReduce(DataType::kF64, ReduceOp::kProd, a, 1024, false);
      ReduceScatter(DataType::kF64, ReduceOp::kSum, a, 333, true);
      ReduceScatter(DataType::kU8, ReduceOp::kMax, a, 0, false);
      AllGather(DataType::kI32, a, 517, true);
      AllGather(DataType::kF16, a, 0, false);
      Broadcast(DataType::kU8, a, 3001, n - 1, true);
      Broadcast(DataType::kF32, a, 0, 0, false);
      Reduce(DataType::kI32, ReduceOp::kSum, a, 2049, n / 2);
      Reduce(DataType::kF32, ReduceOp::kMax, a, 4099, n - 1, /*in_place=*/true);
      Reduce(DataType::kF64, ReduceOp::kProd, a, 1001, 0);
      Reduce(DataType::kF32, ReduceOp::kSum, a, 3, n - 1);  // fewer elements than ranks
    }
    if (!broken()) {
      AllToAll(DataType::kF32, 257, true);
      AllToAll(DataType::kU8, 0, false);
      AllToAllV(DataType::kF64, 0);
      AllToAllV(DataType::kI32, 300);
      SendRecv(DataType::kF64, 0);
      SendRecv(DataType::kF32, 5000);
      Check(comm_.Barrier(), "Barrier");
    }
    return result_;
  }

 private:
  Communicator& comm_;
  size_t misalign_;
  SuiteResult result_;
};

}  // namespace plexus::collectives::testing

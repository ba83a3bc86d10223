#include "motion_bench.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench_pipelines.hpp"
#include "endpoint.hpp"
#include "order.hpp"
#include "plexus/restructure/executor.hpp"
#include "plexus/restructure/stream.hpp"
#include "plexus/transport/completion.hpp"
#include "plexus/transport/device.hpp"
#include "raw_tcp.hpp"

namespace plexus::bench::restructure {
namespace {

namespace pr = plexus::restructure;
namespace ptr = plexus::transport;
namespace pt = plexus::tooling;

constexpr char kWho[] = "plexus-bench-restructure --only motion";
constexpr absl::Duration kSpin = absl::Microseconds(50);  // then sleep: a 2-core host
constexpr absl::Duration kTimeout = absl::Seconds(60);
constexpr uint8_t kPoison = 0xEE;

enum Way { kFused, kCopyRestructureSend, kRestructureSend, kSend, kRestructure, kWays };
constexpr const char* kWayNames[kWays] = {"fused", "copy_restructure_send", "restructure_send",
                                          "send", "restructure"};
constexpr int kSendingWays = 4;  // every way but kRestructure sends one message
// What the fused column runs for a program whose output is its inputs one after another.
constexpr int kGatherSend = kWays;

// One pipeline: its inputs (the user's buffers), the baseline's staging copies of them, the
// sender's full-size output buffer and the output computed once, which every message must equal.
struct Stage {
  std::string name;
  std::optional<pr::Executor> exec;
  std::vector<std::vector<uint8_t>> inputs, staging;
  std::vector<uint8_t> output, reference;
  size_t in_bytes = 0;
  std::string fused_path;  // "output_stream", "gather_send" or "restructure_send"
  std::string refused;     // why the output does not stream, when it does not

  std::vector<pr::ConstBytes> Inputs(bool staged) const {
    const auto& v = staged ? staging : inputs;
    return std::vector<pr::ConstBytes>(v.begin(), v.end());
  }
};

absl::StatusOr<Stage> Prepare(PipelineProgram p) {
  if (!p.program.ok()) return p.program.status();
  Stage s;
  s.name = p.name;
  auto exec = pr::Executor::Compile(*p.program);
  if (!exec.ok()) return exec.status();
  s.exec.emplace(*std::move(exec));
  std::mt19937 rng(1);
  int outputs = 0;
  for (const pr::BufferDecl& b : s.exec->program().buffers) {
    const size_t bytes = static_cast<size_t>(b.count) * plexus::kernels::DataTypeSize(b.dtype);
    if (b.role == pr::Role::kInput) {
      s.inputs.push_back(RandomInput(b, rng));
      s.staging.emplace_back(bytes, 0);
      s.in_bytes += bytes;
    } else if (b.role == pr::Role::kOutput) {
      ++outputs;
      s.output.assign(bytes, 0);
      s.reference.assign(bytes, 0);
    }
  }
  if (outputs != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(s.name, ": ", outputs, " outputs (one message carries one)"));
  }
  const pr::MutableBytes ref[1] = {{s.reference.data(), s.reference.size()}};
  if (absl::Status st = s.exec->Run(s.Inputs(false), ref); !st.ok()) return st;
  auto stream = pr::OutputStream::Create(*s.exec, s.Inputs(false));
  if (stream.ok()) {
    s.fused_path = "output_stream";
    return s;
  }
  s.refused = std::string(stream.status().message());
  std::vector<uint8_t> joined;
  for (const auto& v : s.inputs) joined.insert(joined.end(), v.begin(), v.end());
  s.fused_path = joined == s.reference ? "gather_send" : "restructure_send";
  return s;
}

// Waits for `sends` send and `recvs` receive completions; *recv_at: when the last receive came.
absl::Status Drain(Endpoint& e, int sends, int recvs, double* recv_at = nullptr) {
  while (sends > 0 || recvs > 0) {
    auto c = e.cq->Wait(kTimeout, kSpin);
    if (!c.ok()) return c.status();
    if (!c->status.ok()) return c->status;
    if (c->opcode == ptr::Opcode::kRecv) {
      --recvs;
      if (recv_at != nullptr) *recv_at = Now();
    } else {
      --sends;
    }
  }
  return absl::OkStatus();
}

[[noreturn]] void Fail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "%s: receiver: %s: %s\n", kWho, what.c_str(), s.ToString().c_str());
  std::_Exit(2);
}

// The receiver (a forked child): for each of `messages` messages, posts an ordinary receive into
// its poisoned buffer, tells the sender it may start (carrying the verdict on the previous
// message), acknowledges the message once it is whole, then compares it with the reference.
[[noreturn]] void Receive(ptr::Backend backend, const Stage& st, int messages, int publish_fd,
                          bool pin) {
  if (pin) PinToCpu(1);
  Endpoint e;
  auto dev = ptr::Device::Create(LoopbackDeviceOptions(backend));
  if (!dev.ok()) Fail("device", dev.status());
  e.device = *dev;
  e.cq = e.device->CreateCompletionQueue();
  auto l = e.device->Listen("");
  if (!l.ok()) Fail("listen", l.status());
  e.listener = *std::move(l);
  const std::string address = e.listener->address();
  if (write(publish_fd, address.data(), address.size()) != static_cast<ssize_t>(address.size())) {
    Fail("publishing the address", absl::InternalError("write to the pipe failed"));
  }
  close(publish_fd);
  auto c = e.listener->Accept(e.cq.get(), kTimeout);
  if (!c.ok()) Fail("accept", c.status());
  e.conn = *std::move(c);
  std::vector<uint8_t> buf(st.reference.size());
  uint8_t verdict = 0;  // 1: the previous message differed from the reference
  const uint8_t ack = 1;
  for (int m = 0; m < messages; ++m) {
    std::memset(buf.data(), kPoison, buf.size());
    if (auto s = e.conn->PostRecv({buf.data(), buf.size()}, 1); !s.ok()) Fail("recv", s);
    if (auto s = e.conn->PostSend(ptr::ConstBuffer{&verdict, 1}, 2); !s.ok()) Fail("ready", s);
    if (auto s = Drain(e, 1, 1); !s.ok()) Fail(absl::StrCat(st.name, " message ", m), s);
    if (auto s = e.conn->PostSend(ptr::ConstBuffer{&ack, 1}, 3); !s.ok()) Fail("ack", s);
    if (auto s = Drain(e, 1, 0); !s.ok()) Fail("ack", s);
    const auto diff = std::mismatch(buf.begin(), buf.end(), st.reference.begin());
    verdict = diff.first != buf.end();
    if (verdict != 0) {
      std::fprintf(stderr, "%s: %s: message %d differs from the program's output from byte %zu\n",
                   kWho, st.name.c_str(), m, static_cast<size_t>(diff.first - buf.begin()));
    }
  }
  if (auto s = e.conn->PostSend(ptr::ConstBuffer{&verdict, 1}, 2); !s.ok()) Fail("verdict", s);
  if (auto s = Drain(e, 1, 0); !s.ok()) Fail("verdict", s);
  std::_Exit(0);
}

// The sender's side of one stage over one transport: the receiver forked, then warm-up rounds
// and --runs rounds of every way in a balanced order. ms[way] gets each timed run.
class Sender {
 public:
  Sender(Stage& st, Endpoint& e) : st_(st), e_(e) {}

  // One way once; *ms its time (sender's start to the receiver's acknowledgement).
  absl::Status Once(Way way, double* ms) {
    if (way == kRestructure) {
      const double t0 = Now();
      if (absl::Status s = Run(false); !s.ok()) return s;
      *ms = (Now() - t0) * 1e3;
      return absl::OkStatus();
    }
    uint8_t ack = 0, ready = 0;
    if (absl::Status s = e_.conn->PostRecv({&ack, 1}, 10); !s.ok()) return s;
    double acked = 0;
    const double t0 = Now();
    std::unique_ptr<pr::OutputStream> stream;  // outlives the send's completion
    absl::Status posted;
    switch (way == kFused ? FusedWay() : way) {
      case kFused: {
        auto created = pr::OutputStream::Create(*st_.exec, st_.Inputs(false));
        if (!created.ok()) return created.status();
        stream = *std::move(created);
        pr::OutputStream* out = stream.get();
        posted = e_.conn->PostSendProduced(
            out->bytes(), [out](size_t off, absl::Span<uint8_t> b) { return out->Produce(off, b); },
            11);
        break;
      }
      case kCopyRestructureSend:
        for (size_t k = 0; k < st_.inputs.size(); ++k) {
          std::memcpy(st_.staging[k].data(), st_.inputs[k].data(), st_.inputs[k].size());
        }
        posted = Run(true);
        if (posted.ok()) posted = SendOutput();
        break;
      case kRestructureSend:
        posted = Run(false);
        if (posted.ok()) posted = SendOutput();
        break;
      case kSend:
        posted = SendOutput();
        break;
      default: {  // kGatherSend
        std::vector<ptr::ConstBuffer> parts;
        for (const auto& v : st_.inputs) parts.push_back({v.data(), v.size()});
        posted = e_.conn->PostSend(absl::MakeConstSpan(parts), 11);
      }
    }
    if (!posted.ok()) return posted;
    if (absl::Status s = Drain(e_, 1, 1, &acked); !s.ok()) return s;
    *ms = (acked - t0) * 1e3;
    // The receiver's verdict on this message, and its go-ahead for the next.
    if (absl::Status s = e_.conn->PostRecv({&ready, 1}, 12); !s.ok()) return s;
    if (absl::Status s = Drain(e_, 0, 1); !s.ok()) return s;
    if (ready != 0) {
      return absl::DataLossError("the receiver's message differs from the program's output");
    }
    return absl::OkStatus();
  }

 private:
  // kFused, or the way standing in for it when the output does not stream.
  int FusedWay() const {
    return st_.fused_path == "output_stream" ? kFused
           : st_.fused_path == "gather_send" ? kGatherSend
                                             : kRestructureSend;
  }
  absl::Status Run(bool staged) {
    const pr::MutableBytes out[1] = {{st_.output.data(), st_.output.size()}};
    return st_.exec->Run(st_.Inputs(staged), out);
  }
  absl::Status SendOutput() {
    return e_.conn->PostSend(ptr::ConstBuffer{st_.output.data(), st_.output.size()}, 11);
  }
  Stage& st_;
  Endpoint& e_;
};

constexpr int kWarmupRounds = 1;
// A timed run of a way is the mean of this many messages, one after another (each acknowledged
// before the next): one message of a few milliseconds is within the reach of the host's noise.
constexpr int kMessagesPerRun = 4;

// Every way's timed runs for one stage over one transport; an error names what failed.
absl::Status Measure(Stage& st, ptr::Backend backend, const MotionArgs& a,
                     std::vector<std::vector<double>>* ms) {
  int fds[2];
  if (pipe(fds) != 0) return absl::InternalError("pipe failed");
  const int messages = (kWarmupRounds + a.runs) * kSendingWays * kMessagesPerRun;
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    close(fds[0]);
    Receive(backend, st, messages, fds[1], a.pin);
  }
  close(fds[1]);
  if (a.pin) PinToCpu(0);
  char address[256] = {};
  const ssize_t n = read(fds[0], address, sizeof address - 1);
  close(fds[0]);
  absl::Status status;
  Endpoint e;
  if (n <= 0) status = absl::UnavailableError("the receiver did not publish its address");
  if (status.ok()) {
    auto dev = ptr::Device::Create(LoopbackDeviceOptions(backend));
    status = dev.status();
    if (status.ok()) {
      e.device = *dev;
      e.cq = e.device->CreateCompletionQueue();
      auto c = e.device->Connect(std::string(address, static_cast<size_t>(n)), e.cq.get());
      status = c.status();
      if (status.ok()) e.conn = *std::move(c);
    }
  }
  uint8_t ready = 0;
  if (status.ok()) status = e.conn->PostRecv({&ready, 1}, 12);
  if (status.ok()) status = Drain(e, 0, 1);
  Sender sender(st, e);
  ms->assign(kWays, {});
  for (int r = 0; status.ok() && r < kWarmupRounds + a.runs; ++r) {
    for (size_t w : BalancedOrder(kWays, static_cast<size_t>(r))) {
      double sum = 0;
      for (int m = 0; status.ok() && m < kMessagesPerRun; ++m) {
        double t = 0;
        status = sender.Once(static_cast<Way>(w), &t);
        sum += t;
      }
      if (!status.ok()) {
        status = absl::Status(status.code(), absl::StrCat(kWayNames[w], ": ", status.message()));
        break;
      }
      if (r >= kWarmupRounds) (*ms)[w].push_back(sum / kMessagesPerRun);
    }
  }
  if (e.conn) e.conn->Close();
  if (!status.ok()) kill(pid, SIGKILL);
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  if (a.pin) PinToCpu(-1);
  if (status.ok() && (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0)) {
    status = absl::InternalError("the receiver process failed");
  }
  return status;
}

}  // namespace

bool RunMotion(const MotionArgs& a, pt::FigureWriter& out) {
  bool ok = true;
  std::vector<ptr::Backend> backends;
  if (a.transport != "shm") backends.push_back(ptr::Backend::kTcp);
  if (a.transport != "tcp") backends.push_back(ptr::Backend::kShm);
  for (PipelineProgram& p : PipelinePrograms(a.shape_scale)) {
    const std::string name = p.name;
    auto st = Prepare(std::move(p));
    if (!st.ok()) {
      std::fprintf(stderr, "%s: %s: %s\n", kWho, name.c_str(), st.status().ToString().c_str());
      ok = false;
      continue;
    }
    for (ptr::Backend backend : backends) {
      const std::string transport(ptr::BackendName(backend));
      std::vector<std::vector<double>> ms;
      if (absl::Status s = Measure(*st, backend, a, &ms); !s.ok()) {
        std::fprintf(stderr, "%s: %s over %s: %s\n", kWho, name.c_str(), transport.c_str(),
                     s.ToString().c_str());
        ok = false;
        continue;
      }
      nlohmann::json extra = {{"program", name},
                              {"transport", transport},
                              {"in_bytes", st->in_bytes},
                              {"out_bytes", st->reference.size()},
                              {"runs", a.runs},
                              {"fused_path", st->fused_path},
                              {"shape_scale", a.shape_scale}};
      if (!st->refused.empty()) extra["output_stream_refused"] = st->refused;
      auto add = [&](std::string figure, double value, std::string unit,
                     std::optional<double> target, const std::vector<double>* runs = nullptr) {
        pt::Figure f;
        f.figure = std::move(figure);
        f.value = value;
        f.unit = std::move(unit);
        if (target) {
          f.target = *target;
          f.met = value >= *target;
        }
        f.extra = extra;
        if (runs != nullptr) {  // the spread, for a host that was not quiet
          f.extra["min"] = *std::min_element(runs->begin(), runs->end());
          f.extra["max"] = *std::max_element(runs->begin(), runs->end());
        }
        out.Add(f);
      };
      std::vector<double> med(kWays);
      for (int w = 0; w < kWays; ++w) {
        med[w] = Median(ms[w]);
        add(absl::StrCat(kWayNames[w], "_ms"), med[w], "ms", std::nullopt, &ms[w]);
      }
      // Each ratio of medians, and (extra field "of_minima") the same ratio of the fastest runs:
      // the figure least moved by other processes on a busy host.
      auto ratio = [&](const char* figure, Way num, Way den, std::optional<double> target) {
        const double fastest = *std::min_element(ms[num].begin(), ms[num].end()) /
                               *std::min_element(ms[den].begin(), ms[den].end());
        extra["of_minima"] = fastest;
        add(figure, med[num] / med[den], "ratio", target);
        extra.erase("of_minima");
      };
      ratio("fused_speedup_vs_copy_restructure_send", kCopyRestructureSend, kFused, 1.0);
      ratio("fused_speedup_vs_restructure_send", kRestructureSend, kFused, std::nullopt);
      ratio("copy_restructure_send_vs_restructure_send", kCopyRestructureSend, kRestructureSend,
            std::nullopt);
    }
  }
  return ok;
}

}  // namespace plexus::bench::restructure

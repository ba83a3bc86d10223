// plexus-bench-rpc-grpc: the gRPC side of plexus-bench-rpc --compare, on the same echo.proto
// (compiled by protoc and grpc_cpp_plugin). Server: the async completion-queue server, one
// thread on one completion queue, with enough calls posted for every call in flight. Client: the
// async stub on one completion queue driven by one thread (blocking in Next). Options and output
// lines as in peer.hpp; started by plexus-bench-rpc, not meant to be run by hand.
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "echo.grpc.pb.h"
#include "peer.hpp"
#include "plexus/tooling/cli.hpp"
#include "raw_tcp.hpp"

namespace pb = plexus::benchrpc;
using plexus::benchrpc::Clock;

namespace {

class CallData {
 public:
  CallData(pb::EchoService::AsyncService* svc, grpc::ServerCompletionQueue* cq)
      : svc_(svc), cq_(cq), responder_(&ctx_) {
    svc_->RequestEcho(&ctx_, &req_, &responder_, cq_, cq_, this);
  }
  void Proceed(bool ok) {
    if (finishing_ || !ok) {
      delete this;
      return;
    }
    new CallData(svc_, cq_);
    const size_t n = std::min<size_t>(req_.reply_bytes(), req_.payload().size());
    rep_.set_payload(req_.payload().data(), n);
    rep_.set_request_ok(pb::PayloadMatches(req_.payload().data(), req_.payload().size()));
    finishing_ = true;
    responder_.Finish(rep_, grpc::Status::OK, this);
  }

 private:
  pb::EchoService::AsyncService* svc_;
  grpc::ServerCompletionQueue* cq_;
  grpc::ServerContext ctx_;
  pb::EchoRequest req_;
  pb::EchoReply rep_;
  grpc::ServerAsyncResponseWriter<pb::EchoReply> responder_;
  bool finishing_ = false;
};

int Serve() {
  pb::BlockTermSignals();
  pb::EchoService::AsyncService svc;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&svc);
  std::unique_ptr<grpc::ServerCompletionQueue> cq = builder.AddCompletionQueue();
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    std::fprintf(stderr, "plexus-bench-rpc-grpc: the server did not start on 127.0.0.1\n");
    return 1;
  }
  for (int i = 0; i < 512; ++i) new CallData(&svc, cq.get());
  std::thread worker([&] {
    void* tag;
    bool ok;
    while (cq->Next(&tag, &ok)) static_cast<CallData*>(tag)->Proceed(ok);
  });
  pb::PublishAddress("127.0.0.1:" + std::to_string(port));
  pb::WaitForTermSignal();
  std::fflush(stdout);
  std::_Exit(0);  // the process ends; no orderly drain of posted calls needed
}

struct Call {
  grpc::ClientContext ctx;
  pb::EchoReply rep;
  grpc::Status status;
  std::unique_ptr<grpc::ClientAsyncResponseReader<pb::EchoReply>> rpc;
  int slot = 0;
  Clock::time_point start;
};

int Client(const pb::PeerArgs& a) {
  auto channel = grpc::CreateChannel(a.address, grpc::InsecureChannelCredentials());
  auto stub = pb::EchoService::NewStub(channel);
  grpc::CompletionQueue cq;
  const int slots = a.mode == "latency" ? 1 : a.inflight;
  const std::string payload = pb::RequestPayload(a.size);
  std::vector<pb::EchoRequest> reqs(static_cast<size_t>(slots));
  for (auto& r : reqs) {
    r.set_payload(payload);
    r.set_reply_bytes(a.reply);
    r.set_tag("ok");
  }
  pb::ClientResult result;
  uint64_t issued = 0;
  auto issue = [&](int slot) {
    auto* c = new Call;
    c->slot = slot;
    reqs[static_cast<size_t>(slot)].set_tag(pb::Denied(issued++, a.deny_percent) ? "deny" : "ok");
    c->start = Clock::now();
    c->rpc = stub->AsyncEcho(&c->ctx, reqs[static_cast<size_t>(slot)], &cq);
    c->rpc->Finish(&c->rep, &c->status, c);
  };
  // Connect before the clock starts.
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
    std::fprintf(stderr, "plexus-bench-rpc-grpc: no connection to %s within 10 s\n",
                 a.address.c_str());
    return 1;
  }
  pb::Phases phases(a.seconds);
  int outstanding = slots;
  for (int s = 0; s < slots; ++s) issue(s);
  void* tag;
  bool ok;
  while (outstanding > 0 && cq.Next(&tag, &ok)) {
    auto* c = static_cast<Call*>(tag);
    const auto now = Clock::now();
    if (phases.Measuring(now)) {
      if (c->status.ok()) {
        ++result.ok;
        result.bytes += a.size;
        result.wrong +=
            !c->rep.request_ok() ||
            !pb::ReplyMatches(c->rep.payload().data(), c->rep.payload().size(), a.size, a.reply);
        if (a.mode == "latency") {
          result.latency_us.push_back(
              std::chrono::duration<double, std::micro>(now - c->start).count());
        }
      } else {
        ++result.failed;
      }
    }
    const int slot = c->slot;
    delete c;
    if (phases.Over(now)) {
      --outstanding;
    } else {
      issue(slot);
    }
  }
  result.seconds = phases.seconds();
  pb::PrintResult(std::move(result));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  plexus::tooling::Tool tool("plexus-bench-rpc-grpc",
                             "The gRPC peer of plexus-bench-rpc --compare (started by it).");
  pb::PeerArgs args;
  pb::AddPeerOptions(&tool.app(), &args);
  if (auto code = tool.Parse(argc, argv)) return *code;
  if (args.cpu >= 0) plexus::bench::PinToCpu(args.cpu);
  if (args.role == "server") return Serve();
  if (args.role == "client") return Client(args);
  return tool.Usage("--role must be server or client");
}

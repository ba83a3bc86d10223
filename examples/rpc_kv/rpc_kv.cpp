// A key-value store over plexus::rpc: a server and a client in one process, over tcp on
// 127.0.0.1. Exits 0 when every call behaved as expected.
#include <cstdio>
#include <map>
#include <mutex>
#include <string>

#include "kv.plexus.hpp"

namespace pr = plexus::rpc;
namespace pt = plexus::transport;

class Store : public plexus::kv::KeyValue::Service {
 public:
  absl::Status Put(pr::ServerContext&, const plexus::kv::PutRequest& req,
                   plexus::kv::PutResponse* resp) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto& e = data_[std::string(req.key)];
    e.value.assign(reinterpret_cast<const char*>(req.value.data()), req.value.size());
    resp->version = ++e.version;
    return absl::OkStatus();
  }
  absl::Status Get(pr::ServerContext& ctx, const plexus::kv::GetRequest& req,
                   plexus::kv::GetResponse* resp) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(std::string(req.key));
    if (it == data_.end()) return absl::NotFoundError("no key " + std::string(req.key));
    // The response must outlive this handler: copy into the call's memory.
    resp->value = pr::AsBytes(ctx.CopyString(it->second.value));
    resp->version = it->second.version;
    return absl::OkStatus();
  }

 private:
  struct Entry {
    std::string value;
    uint64_t version = 0;
  };
  std::mutex mu_;
  std::map<std::string, Entry> data_;
};

int main() {
  auto device = pt::Device::Create({.backend = pt::Backend::kTcp, .local_address = "127.0.0.1"});
  if (!device.ok()) {
    std::fprintf(stderr, "rpc-kv: %s\n", std::string(device.status().message()).c_str());
    return 1;
  }
  Store store;
  auto server = pr::Server::Create(*device);
  if (!server.ok() || !(*server)->Register(&store).ok() || !(*server)->Start().ok()) {
    std::fprintf(stderr, "rpc-kv: server failed to start\n");
    return 1;
  }
  auto channel =
      pr::Channel::Connect(*device, (*server)->address(), {&plexus::kv::KeyValue::Descriptor()});
  if (!channel.ok()) {
    std::fprintf(stderr, "rpc-kv: %s\n", std::string(channel.status().message()).c_str());
    return 1;
  }
  plexus::kv::KeyValue::Stub kv(*channel);
  pr::CallOptions opts;
  opts.timeout = absl::Seconds(10);
  plexus::kv::PutRequest::Builder put;
  put.set_key("greeting").set_value("hello, plexus");
  auto v1 = kv.PutSync(put.message(), opts);
  auto v2 = kv.PutSync(put.message(), opts);
  plexus::kv::GetRequest get;
  get.key = "greeting";
  auto got = kv.GetSync(get, opts);
  get.key = "missing";
  auto missing = kv.GetSync(get, opts);
  const bool ok = v1.ok() && v2.ok() && (*v2)->version == 2 && got.ok() &&
                  std::string(reinterpret_cast<const char*>((*got)->value.data()),
                              (*got)->value.size()) == "hello, plexus" &&
                  missing.status().code() == absl::StatusCode::kNotFound;
  std::printf("put version %llu, get '%.*s', missing: %s\n",
              v2.ok() ? static_cast<unsigned long long>((*v2)->version) : 0ull,
              got.ok() ? static_cast<int>((*got)->value.size()) : 0,
              got.ok() ? reinterpret_cast<const char*>((*got)->value.data()) : "",
              std::string(missing.status().ToString()).c_str());
  return ok ? 0 : 1;
}

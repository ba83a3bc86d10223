// plexus-rpc-ctl: the operator's client of a process's rpc admin endpoint (plexus/rpc/admin.hpp):
// lists servers, channels, connections and engines, and attaches, detaches, reconfigures and
// upgrades policies while the process serves calls. Tables by default, --json for scripts.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "plexus/base/admin.hpp"
#include "plexus/rpc/admin.hpp"
#include "plexus/tooling/cli.hpp"
#include "plexus/tooling/table.hpp"

namespace tooling = plexus::tooling;
namespace admin = plexus::base::admin;
using Json = nlohmann::json;

namespace {

constexpr char kDescription[] =
    "Talks to the rpc admin endpoint of a running process (RpcAdmin; PLEXUS_RPC_ADMIN=host:port\n"
    "and PLEXUS_RPC_ADMIN_TOKEN in that process). --address and --token default to the same\n"
    "variables here. Examples:\n"
    "  plexus-rpc-ctl list\n"
    "  plexus-rpc-ctl attach kv rl --kind rate_limit --config '{\"rate\": 1000, \"burst\": 50}'\n"
    "  plexus-rpc-ctl configure kv rl --config '{\"rate\": 200}'\n"
    "  plexus-rpc-ctl upgrade kv rl\n"
    "  plexus-rpc-ctl metrics --json\n"
    "Any command the endpoint serves, e.g. the collectives' (plexus/collectives/admin.hpp):\n"
    "  plexus-rpc-ctl call coll-list\n"
    "  plexus-rpc-ctl call coll-reconfigure name=train/dp ring_order=3,1,0,2";

void PrintTable(const std::vector<std::string>& header,
                const std::vector<std::vector<std::string>>& rows) {
  std::fputs(tooling::FormatTable(header, rows).c_str(), stdout);
}

std::string Text(const Json& j) { return j.is_string() ? j.get<std::string>() : j.dump(); }

}  // namespace

int main(int argc, char** argv) {
  tooling::Tool tool("plexus-rpc-ctl", kDescription);
  CLI::App& app = tool.app();
  std::string address, token;
  double timeout_s = 10;
  bool json = false;
  auto env = plexus::rpc::RpcAdmin::EnvSettings();
  if (env.ok()) {
    address = env->first;
    token = env->second;
  }
  app.add_option("--address", address, "the endpoint, host:port (default: $PLEXUS_RPC_ADMIN)");
  app.add_option("--token", token, "the endpoint's token (default: $PLEXUS_RPC_ADMIN_TOKEN)");
  tooling::AddNumber(&app, "--timeout", &timeout_s, "seconds to wait for the answer", 0.001,
                     3600.0);
  tooling::AddJsonFlag(&app, &json);
  app.require_subcommand(1);
  app.fallthrough();  // --json, --address, ... also after the subcommand

  admin::AdminRequest req;
  std::string target, name, kind, after, config;
  auto add_target = [&](CLI::App* s) {
    s->add_option("target", target, "the server or channel, as the process named it")->required();
  };
  auto add_name = [&](CLI::App* s) {
    s->add_option("name", name, "the engine's name in the chain")->required();
  };
  CLI::App* list = tool.Subcommand("list", "servers and channels, connections and engine chains");
  CLI::App* engines = tool.Subcommand("engines", "one chain's engines with kind, version, state");
  add_target(engines);
  CLI::App* attach = tool.Subcommand("attach", "attach a new policy engine");
  add_target(attach);
  add_name(attach);
  attach
      ->add_option("--kind", kind,
                   "metrics, rate_limit, acl, admission, balance or a kind the process added")
      ->required();
  attach->add_option("--after", after, "the engine to attach after (default: frontend)");
  attach->add_option("--config", config, "the policy's JSON configuration");
  CLI::App* detach = tool.Subcommand("detach", "remove a policy engine");
  add_target(detach);
  add_name(detach);
  CLI::App* configure = tool.Subcommand("configure", "reconfigure a policy engine in place");
  add_target(configure);
  add_name(configure);
  configure->add_option("--config", config, "the new JSON configuration")->required();
  CLI::App* upgrade = tool.Subcommand(
      "upgrade", "replace an engine by a new version that adopts its state (live upgrade)");
  add_target(upgrade);
  add_name(upgrade);
  upgrade->add_option("--kind", kind, "the new version's kind (default: the same)");
  upgrade->add_option("--config", config,
                      "the new version's JSON configuration (default: the running one's)");
  CLI::App* metrics = tool.Subcommand("metrics", "every metrics engine's counters per method");
  metrics->add_option("target", target, "only this server or channel");
  CLI::App* help = tool.Subcommand("commands", "the commands the endpoint serves");
  (void)help;
  std::string generic_command;
  std::vector<std::string> generic_args;
  CLI::App* call = tool.Subcommand(
      "call", "any command of the endpoint with key=value arguments; prints its JSON result");
  call->add_option("command", generic_command, "the command, e.g. coll-list")->required();
  call->add_option("args", generic_args, "key=value arguments");

  if (auto code = tool.Parse(argc, argv)) return *code;
  if (address.empty()) return tool.Usage("no endpoint: pass --address or set PLEXUS_RPC_ADMIN");
  if (token.empty()) return tool.Usage("no token: pass --token or set PLEXUS_RPC_ADMIN_TOKEN");
  CLI::App* sub = app.get_subcommands().front();
  req.token = token;
  req.command = sub->get_name() == "commands" ? "help" : sub->get_name();
  if (sub == call) {
    req.command = generic_command;
    for (const std::string& kv : generic_args) {
      const size_t eq = kv.find('=');
      if (eq == std::string::npos || eq == 0) {
        return tool.Usage(absl::StrCat("call: argument '", kv, "' is not key=value"));
      }
      req.args[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
  }
  if (!target.empty()) req.args["target"] = target;
  if (!name.empty()) req.args["name"] = name;
  if (!kind.empty()) req.args["kind"] = kind;
  if (!after.empty()) req.args["after"] = after;
  if (!config.empty()) req.args["config"] = config;

  auto reply = admin::AdminCall(address, req, absl::Seconds(timeout_s));
  if (!reply.ok()) return tool.Fail(reply.status());
  if (json || sub == call) {
    std::printf("%s\n", reply->c_str());
    return tooling::kExitOk;
  }
  const Json j = Json::parse(*reply, nullptr, false);
  if (sub == list) {
    std::vector<std::vector<std::string>> rows;
    for (const Json& t : j) {
      std::vector<std::string> conns;
      for (const Json& c : t["connections"]) {
        conns.push_back(absl::StrCat(Text(c["id"]), "@", Text(c["peer"])));
      }
      std::vector<std::string> chain;
      for (const Json& e : t["engines"]) chain.push_back(Text(e));
      rows.push_back({Text(t["name"]), Text(t["role"]), Text(t["address"]),
                      absl::StrJoin(conns, ","), absl::StrJoin(chain, " -> ")});
    }
    PrintTable({"NAME", "ROLE", "ADDRESS", "CONNECTIONS", "ENGINES"}, rows);
  } else if (sub == engines) {
    std::vector<std::vector<std::string>> rows;
    for (const Json& e : j) {
      rows.push_back({Text(e["name"]), Text(e["kind"]), Text(e["version"]), e["state"].dump()});
    }
    PrintTable({"ENGINE", "KIND", "VERSION", "STATE"}, rows);
  } else if (sub == metrics) {
    std::vector<std::vector<std::string>> rows;
    for (const auto& [t, engines_json] : j.items()) {
      for (const auto& [e, methods] : engines_json.items()) {
        for (const auto& [m, v] : methods.items()) {
          rows.push_back({t, e, m, Text(v["calls"]), Text(v["errors"]), Text(v["latency_us_p50"]),
                          Text(v["latency_us_p99"])});
        }
      }
    }
    PrintTable({"TARGET", "ENGINE", "METHOD", "CALLS", "ERRORS", "P50_US<=", "P99_US<="}, rows);
  } else if (sub == upgrade || sub == configure) {
    std::printf("%s %s on %s: %s v%s, calls held %.1f us (draining %.1f us)\n",
                sub == upgrade ? "upgraded" : "configured", name.c_str(), target.c_str(),
                Text(j["engine"]["kind"]).c_str(), Text(j["engine"]["version"]).c_str(),
                j["pause_us"].get<double>(), j["drain_us"].get<double>());
    if (sub == upgrade) {
      std::printf("configuration (%s): %s\n", Text(j["config_from"]).c_str(),
                  j["config"].dump().c_str());
    }
    std::printf("state: %s\n", j["engine"]["state"].dump().c_str());
  } else if (sub == attach || sub == detach) {
    std::vector<std::string> chain;
    for (const Json& e : j["engines"]) chain.push_back(Text(e));
    std::printf("%s %s on %s; chain: %s\n", sub == attach ? "attached" : "detached", name.c_str(),
                target.c_str(), absl::StrJoin(chain, " -> ").c_str());
  } else {
    std::vector<std::vector<std::string>> rows;
    for (const auto& [c, h] : j.items()) rows.push_back({c, Text(h)});
    PrintTable({"COMMAND", "ARGUMENTS"}, rows);
  }
  return tooling::kExitOk;
}

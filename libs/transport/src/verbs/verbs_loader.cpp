// libibverbs and librdmacm, loaded when first probed instead of linked: a program built with
// Plexus's verbs backend starts, links and runs on machines without rdma-core (the backend then
// reports itself unavailable with the reason), and the installed package names no library of
// the build machine. This file defines the rdma-core functions the verbs backend calls, each
// forwarding to the symbol of the library opened with dlopen (never to RTLD_DEFAULT, which
// would find these definitions again).
#include "verbs/verbs_loader.hpp"

#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cerrno>
#include <mutex>
#include <string>
#include <type_traits>

#include "absl/strings/str_cat.h"

namespace plexus::transport::internal {
namespace {

enum Library { kIbverbs = 0, kRdmacm = 1 };

struct Libraries {
  void* handle[2] = {nullptr, nullptr};
  std::string error;  // empty when both loaded
};

const Libraries& Loaded() {
  static const Libraries* libraries = [] {
    auto* l = new Libraries;
    // The sonames rdma-core has kept since 2016 (libibverbs1, librdmacm1).
    const char* names[2] = {"libibverbs.so.1", "librdmacm.so.1"};
    for (int i = 0; i < 2; ++i) {
      l->handle[i] = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
      if (l->handle[i] == nullptr) {
        const char* why = dlerror();
        l->error = absl::StrCat("RDMA verbs unavailable: cannot load ", names[i], " (",
                                why ? why : "unknown error",
                                "); install rdma-core's libibverbs1 and librdmacm1");
        break;
      }
    }
    return l;
  }();
  return *libraries;
}

void* Symbol(Library library, const char* name) {
  const Libraries& l = Loaded();
  if (l.handle[library] == nullptr) return nullptr;
  static std::mutex mu;  // dlsym is thread-safe; dlerror's state is not
  std::lock_guard<std::mutex> lock(mu);
  return dlsym(l.handle[library], name);
}

// Calls `name` from `library`; without the library (or the symbol), fails the way rdma-core's
// functions fail: errno = ENOSYS and a null pointer, -1, or nothing.
template <typename Fn, typename... Args>
auto Call(Library library, const char* name, Args... args) {
  using Result = std::invoke_result_t<Fn, Args...>;
  auto fn = reinterpret_cast<Fn>(Symbol(library, name));
  if (fn == nullptr) {
    errno = ENOSYS;
    if constexpr (std::is_void_v<Result>) {
      return;
    } else if constexpr (std::is_pointer_v<Result>) {
      return static_cast<Result>(nullptr);
    } else {
      return static_cast<Result>(-1);
    }
  } else {
    return fn(args...);
  }
}

}  // namespace

bool VerbsLibrariesLoaded(std::string* why_not) {
  const Libraries& l = Loaded();
  if (!l.error.empty() && why_not != nullptr) *why_not = l.error;
  return l.error.empty();
}

}  // namespace plexus::transport::internal

using plexus::transport::internal::Call;
using plexus::transport::internal::kIbverbs;
using plexus::transport::internal::kRdmacm;

// Names are parenthesized so that rdma-core's function-like macros of the same name (some
// versions define ibv_reg_mr and ibv_query_device as macros) do not expand here.
extern "C" {

void(ibv_ack_cq_events)(struct ibv_cq* cq, unsigned int nevents) {
  Call<decltype(&::ibv_ack_cq_events)>(kIbverbs, "ibv_ack_cq_events", cq, nevents);
}

struct ibv_qp*(ibv_create_qp)(struct ibv_pd* pd, struct ibv_qp_init_attr* qp_init_attr) {
  return Call<decltype(&::ibv_create_qp)>(kIbverbs, "ibv_create_qp", pd, qp_init_attr);
}

int(ibv_destroy_qp)(struct ibv_qp* qp) {
  return Call<decltype(&::ibv_destroy_qp)>(kIbverbs, "ibv_destroy_qp", qp);
}

int(ibv_modify_qp)(struct ibv_qp* qp, struct ibv_qp_attr* attr, int attr_mask) {
  return Call<decltype(&::ibv_modify_qp)>(kIbverbs, "ibv_modify_qp", qp, attr, attr_mask);
}

int(ibv_query_qp)(struct ibv_qp* qp, struct ibv_qp_attr* attr, int attr_mask,
                  struct ibv_qp_init_attr* init_attr) {
  return Call<decltype(&::ibv_query_qp)>(kIbverbs, "ibv_query_qp", qp, attr, attr_mask, init_attr);
}

// rdma-core 32+ (2020); older libraries report ENOSYS, and a path that needs the GID table says so.
ssize_t(_ibv_query_gid_table)(struct ibv_context* context, struct ibv_gid_entry* entries,
                              size_t max_entries, uint32_t flags, size_t entry_size) {
  return Call<decltype(&::_ibv_query_gid_table)>(kIbverbs, "_ibv_query_gid_table", context, entries,
                                                 max_entries, flags, entry_size);
}

struct ibv_pd*(ibv_alloc_pd)(struct ibv_context* context) {
  return Call<decltype(&::ibv_alloc_pd)>(kIbverbs, "ibv_alloc_pd", context);
}

int(ibv_close_device)(struct ibv_context* context) {
  return Call<decltype(&::ibv_close_device)>(kIbverbs, "ibv_close_device", context);
}

struct ibv_comp_channel*(ibv_create_comp_channel)(struct ibv_context* context) {
  return Call<decltype(&::ibv_create_comp_channel)>(kIbverbs, "ibv_create_comp_channel", context);
}

struct ibv_cq*(ibv_create_cq)(struct ibv_context* context, int cqe, void* cq_context,
                              struct ibv_comp_channel* channel, int comp_vector) {
  return Call<decltype(&::ibv_create_cq)>(kIbverbs, "ibv_create_cq", context, cqe, cq_context,
                                          channel, comp_vector);
}

int(ibv_dealloc_pd)(struct ibv_pd* pd) {
  return Call<decltype(&::ibv_dealloc_pd)>(kIbverbs, "ibv_dealloc_pd", pd);
}

int(ibv_dereg_mr)(struct ibv_mr* mr) {
  return Call<decltype(&::ibv_dereg_mr)>(kIbverbs, "ibv_dereg_mr", mr);
}

int(ibv_destroy_comp_channel)(struct ibv_comp_channel* channel) {
  return Call<decltype(&::ibv_destroy_comp_channel)>(kIbverbs, "ibv_destroy_comp_channel", channel);
}

int(ibv_destroy_cq)(struct ibv_cq* cq) {
  return Call<decltype(&::ibv_destroy_cq)>(kIbverbs, "ibv_destroy_cq", cq);
}

void(ibv_free_device_list)(struct ibv_device** list) {
  Call<decltype(&::ibv_free_device_list)>(kIbverbs, "ibv_free_device_list", list);
}

int(ibv_get_cq_event)(struct ibv_comp_channel* channel, struct ibv_cq** cq, void** cq_context) {
  return Call<decltype(&::ibv_get_cq_event)>(kIbverbs, "ibv_get_cq_event", channel, cq, cq_context);
}

struct ibv_device**(ibv_get_device_list)(int* num_devices) {
  return Call<decltype(&::ibv_get_device_list)>(kIbverbs, "ibv_get_device_list", num_devices);
}

const char*(ibv_get_device_name)(struct ibv_device* device) {
  return Call<decltype(&::ibv_get_device_name)>(kIbverbs, "ibv_get_device_name", device);
}

struct ibv_context*(ibv_open_device)(struct ibv_device* device) {
  return Call<decltype(&::ibv_open_device)>(kIbverbs, "ibv_open_device", device);
}

int(ibv_query_device)(struct ibv_context* context, struct ibv_device_attr* device_attr) {
  return Call<decltype(&::ibv_query_device)>(kIbverbs, "ibv_query_device", context, device_attr);
}

struct ibv_mr*(ibv_reg_mr)(struct ibv_pd* pd, void* addr, size_t length, int access) {
  return Call<decltype(&::ibv_reg_mr)>(kIbverbs, "ibv_reg_mr", pd, addr, length, access);
}

// rdma-core's ibv_reg_mr macro calls this one when it cannot prove at compile time that the
// access flags need no optional range (always, in an unoptimised build).
struct ibv_mr*(ibv_reg_mr_iova2)(struct ibv_pd* pd, void* addr, size_t length, uint64_t iova,
                                 unsigned int access) {
  return Call<decltype(&::ibv_reg_mr_iova2)>(kIbverbs, "ibv_reg_mr_iova2", pd, addr, length, iova,
                                             access);
}

const char*(ibv_wc_status_str)(enum ibv_wc_status status) {
  return Call<decltype(&::ibv_wc_status_str)>(kIbverbs, "ibv_wc_status_str", status);
}

int(rdma_accept)(struct rdma_cm_id* id, struct rdma_conn_param* conn_param) {
  return Call<decltype(&::rdma_accept)>(kRdmacm, "rdma_accept", id, conn_param);
}

int(rdma_ack_cm_event)(struct rdma_cm_event* event) {
  return Call<decltype(&::rdma_ack_cm_event)>(kRdmacm, "rdma_ack_cm_event", event);
}

int(rdma_bind_addr)(struct rdma_cm_id* id, struct sockaddr* addr) {
  return Call<decltype(&::rdma_bind_addr)>(kRdmacm, "rdma_bind_addr", id, addr);
}

int(rdma_connect)(struct rdma_cm_id* id, struct rdma_conn_param* conn_param) {
  return Call<decltype(&::rdma_connect)>(kRdmacm, "rdma_connect", id, conn_param);
}

struct rdma_event_channel*(rdma_create_event_channel)(void) {
  return Call<decltype(&::rdma_create_event_channel)>(kRdmacm, "rdma_create_event_channel");
}

int(rdma_create_id)(struct rdma_event_channel* channel, struct rdma_cm_id** id, void* context,
                    enum rdma_port_space ps) {
  return Call<decltype(&::rdma_create_id)>(kRdmacm, "rdma_create_id", channel, id, context, ps);
}

int(rdma_create_qp)(struct rdma_cm_id* id, struct ibv_pd* pd,
                    struct ibv_qp_init_attr* qp_init_attr) {
  return Call<decltype(&::rdma_create_qp)>(kRdmacm, "rdma_create_qp", id, pd, qp_init_attr);
}

void(rdma_destroy_event_channel)(struct rdma_event_channel* channel) {
  Call<decltype(&::rdma_destroy_event_channel)>(kRdmacm, "rdma_destroy_event_channel", channel);
}

int(rdma_destroy_id)(struct rdma_cm_id* id) {
  return Call<decltype(&::rdma_destroy_id)>(kRdmacm, "rdma_destroy_id", id);
}

void(rdma_destroy_qp)(struct rdma_cm_id* id) {
  Call<decltype(&::rdma_destroy_qp)>(kRdmacm, "rdma_destroy_qp", id);
}

int(rdma_disconnect)(struct rdma_cm_id* id) {
  return Call<decltype(&::rdma_disconnect)>(kRdmacm, "rdma_disconnect", id);
}

int(rdma_establish)(struct rdma_cm_id* id) {
  return Call<decltype(&::rdma_establish)>(kRdmacm, "rdma_establish", id);
}

int(rdma_init_qp_attr)(struct rdma_cm_id* id, struct ibv_qp_attr* qp_attr, int* qp_attr_mask) {
  return Call<decltype(&::rdma_init_qp_attr)>(kRdmacm, "rdma_init_qp_attr", id, qp_attr,
                                              qp_attr_mask);
}

const char*(rdma_event_str)(enum rdma_cm_event_type event) {
  return Call<decltype(&::rdma_event_str)>(kRdmacm, "rdma_event_str", event);
}

void(rdma_free_devices)(struct ibv_context** list) {
  Call<decltype(&::rdma_free_devices)>(kRdmacm, "rdma_free_devices", list);
}

int(rdma_get_cm_event)(struct rdma_event_channel* channel, struct rdma_cm_event** event) {
  return Call<decltype(&::rdma_get_cm_event)>(kRdmacm, "rdma_get_cm_event", channel, event);
}

struct ibv_context**(rdma_get_devices)(int* num_devices) {
  return Call<decltype(&::rdma_get_devices)>(kRdmacm, "rdma_get_devices", num_devices);
}

__be16(rdma_get_src_port)(struct rdma_cm_id* id) {
  return Call<decltype(&::rdma_get_src_port)>(kRdmacm, "rdma_get_src_port", id);
}

int(rdma_listen)(struct rdma_cm_id* id, int backlog) {
  return Call<decltype(&::rdma_listen)>(kRdmacm, "rdma_listen", id, backlog);
}

int(rdma_migrate_id)(struct rdma_cm_id* id, struct rdma_event_channel* channel) {
  return Call<decltype(&::rdma_migrate_id)>(kRdmacm, "rdma_migrate_id", id, channel);
}

int(rdma_reject)(struct rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
  return Call<decltype(&::rdma_reject)>(kRdmacm, "rdma_reject", id, private_data, private_data_len);
}

int(rdma_resolve_addr)(struct rdma_cm_id* id, struct sockaddr* src_addr, struct sockaddr* dst_addr,
                       int timeout_ms) {
  return Call<decltype(&::rdma_resolve_addr)>(kRdmacm, "rdma_resolve_addr", id, src_addr, dst_addr,
                                              timeout_ms);
}

int(rdma_resolve_route)(struct rdma_cm_id* id, int timeout_ms) {
  return Call<decltype(&::rdma_resolve_route)>(kRdmacm, "rdma_resolve_route", id, timeout_ms);
}

int(rdma_set_option)(struct rdma_cm_id* id, int level, int optname, void* optval, size_t optlen) {
  return Call<decltype(&::rdma_set_option)>(kRdmacm, "rdma_set_option", id, level, optname, optval,
                                            optlen);
}

}  // extern "C"

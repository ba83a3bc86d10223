// plexus_torch._C: the Python binding of ProcessGroupPlexus. python/plexus_torch/__init__.py
// registers it with torch.distributed as backend "plexus".
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include "plexus/config.hpp"
#include "plexus/torch/process_group.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  // torch's bindings of c10d::ProcessGroup (c10d::Backend) and c10d::Store must be registered
  // first.
  py::module::import("torch.distributed");
  plexus::torch::SetGilReleaser([]() -> std::shared_ptr<void> {
    if (Py_IsInitialized() == 0 || PyGILState_Check() == 0) return nullptr;
    return std::make_shared<py::gil_scoped_release>();
  });
  m.doc() = "Plexus collectives as a torch.distributed backend";
  py::class_<plexus::torch::ProcessGroupPlexus, plexus::torch::GroupBase,
             c10::intrusive_ptr<plexus::torch::ProcessGroupPlexus>>(m, "ProcessGroupPlexus")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout) {
             return plexus::torch::ProcessGroupPlexus::Create(store, rank, size, timeout);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>(),
           "Connects the `size` ranks sharing `store` (collective).")
      .def_property_readonly("transport", &plexus::torch::ProcessGroupPlexus::transport,
                             "The transport the ranks connected over: shm or tcp.");
  m.attr("version") = PLEXUS_VERSION_STRING;
  m.attr("have_cuda") = static_cast<bool>(PLEXUS_HAVE_CUDA);
  // What the class derives from, for the registration in __init__.py: "Backend" (PyTorch 2) or
  // "ProcessGroup" (1.13).
  m.attr("base") = PLEXUS_TORCH_C10D_BACKEND ? "Backend" : "ProcessGroup";
}

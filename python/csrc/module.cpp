// module.cpp - weft.torch._backend: the Python face of the process group.
// weft/torch/__init__.py registers create() with torch.distributed under
// the name "weft".
#include <pybind11/chrono.h>
#include <torch/python.h>

#include "grad_set.hpp"
#include "process_group_weft.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_backend, m) {
  m.doc() =
      "weft's torch.distributed backend (use: import weft.torch; "
      "dist.init_process_group(\"weft\"))";
  // the base class must be known to pybind before a class derives from it
  py::module_::import("torch.distributed");
#if TORCH_VERSION_MAJOR >= 2
  using Base = c10d::Backend;
#else
  using Base = c10d::ProcessGroup;
#endif
  py::class_<weft_torch::ProcessGroupWeft, c10::intrusive_ptr<weft_torch::ProcessGroupWeft>, Base>(
      m, "ProcessGroupWeft")
      .def("peer_transport", &weft_torch::ProcessGroupWeft::peerTransport, py::arg("peer"),
           "the transport weft chose for peer (\"shm\", \"tcp\", \"self\", ...)")
      // weft.torch.recover's steps (the survivors agree, then meet again)
      .def("_shrink", &weft_torch::ProcessGroupWeft::shrink, py::call_guard<py::gil_scoped_release>())
      .def("_shrunk_broadcast", &weft_torch::ProcessGroupWeft::shrunkBroadcast, py::arg("from_rank0"),
           py::call_guard<py::gil_scoped_release>())
      .def("_shrunk_destroy", &weft_torch::ProcessGroupWeft::shrunkDestroy);
  // the creator torch.distributed calls: (store, rank, size, timeout); the
  // rendezvous blocks, so the GIL is released for it
  m.def(
      "create",
      [](const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
         std::chrono::milliseconds timeout) {
        return c10::make_intrusive<weft_torch::ProcessGroupWeft>(store, rank, size, timeout);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
      py::call_guard<py::gil_scoped_release>());
  // weft.torch.GradReducer's set (grad_set.hpp); the calls that reach peers
  // or wait release the GIL
  py::class_<weft_torch::GradSet, std::shared_ptr<weft_torch::GradSet>>(m, "GradSet")
      .def(py::init<const c10::intrusive_ptr<weft_torch::ProcessGroupWeft> &, const std::vector<at::Tensor> &,
                    const std::string &, int64_t, int64_t, double>(),
           py::arg("group"), py::arg("params"), py::arg("op"), py::arg("bucket_cap_bytes"),
           py::arg("first_bucket_cap_bytes"), py::arg("prediv"), py::call_guard<py::gil_scoped_release>())
      .def("views", &weft_torch::GradSet::views, "each parameter's gradient as a view of weft's bucket")
      .def("ready", &weft_torch::GradSet::ready, py::arg("index"), py::call_guard<py::gil_scoped_release>())
      .def("wait", &weft_torch::GradSet::wait, py::call_guard<py::gil_scoped_release>())
      .def("set_sync", &weft_torch::GradSet::setSync, py::arg("sync"))
      .def("bucket_count", &weft_torch::GradSet::bucketCount)
      .def_property_readonly("cuda", &weft_torch::GradSet::onCuda);
  m.def("shutdown_all", &weft_torch::ProcessGroupWeft::shutdownAll,
        "stops every weft process group's threads (weft.torch runs it at exit)",
        py::call_guard<py::gil_scoped_release>());
  m.def("weft_version", []() { return std::string(weft_version_string()); });
  m.attr("torch_version_built") =
      std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR);
}

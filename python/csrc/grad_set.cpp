// grad_set.cpp - weft.torch._backend.GradSet (grad_set.hpp says what it is).
#include "grad_set.hpp"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

// the current CUDA stream as a raw handle: torch 2.2 on (as the backend's)
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
#define WEFT_TORCH_CUDA_STREAMS 1
#endif

namespace weft_torch {

// The set and its communicator: destroyed when the Python object and every
// view of the buckets are gone (neither call is collective).
struct GradSet::State {
  weft_comm *comm = nullptr;
  weft_grad *grad = nullptr;
  ~State() {
    if (grad) weft_grad_destroy(grad);
    if (comm) weft_comm_destroy(comm);
  }
};

void GradSet::fail(const char *call, weft_status st) const {
  const char *msg = state_ && state_->comm ? weft_last_error(state_->comm) : nullptr;
  TORCH_CHECK(false, "weft: GradSet.", call, ": ",
              msg && *msg ? std::string(msg) : std::string(weft_strerror(st)));
}

GradSet::GradSet(const c10::intrusive_ptr<ProcessGroupWeft> &group, const std::vector<at::Tensor> &params,
                 const std::string &op, int64_t cap, int64_t first_cap, double prediv)
    : state_(std::make_shared<State>()) {
  TORCH_CHECK(!params.empty(), "weft: GradSet: no parameters (none requires grad?)");
  TORCH_CHECK(op == "avg" || op == "sum", "weft: GradSet: op \"", op, "\": \"avg\" or \"sum\"");
  TORCH_CHECK(cap > 0 && first_cap >= 0, "weft: GradSet: bucket caps ", cap, " and ", first_cap,
              " bytes (the cap must be > 0)");
  device_ = params[0].device();
  cuda_ = device_.is_cuda();
  for (size_t i = 0; i < params.size(); i++) {
    const at::Tensor &p = params[i];
    TORCH_CHECK(p.device() == device_, "weft: GradSet: parameter ", i, " is on ", p.device(),
                " and parameter 0 on ", device_, ": one device per set (as DDP)");
    TORCH_CHECK(p.layout() == at::kStrided, "weft: GradSet: parameter ", i, " is ", p.layout(),
                " (dense parameters only)");
    weft_dtype d;
    TORCH_CHECK(weftType(p.scalar_type(), &d), "weft: GradSet: parameter ", i, " is ",
                torchDtype(p.scalar_type()), ", which weft does not reduce");
    sizes_.push_back(p.sizes().vec());
    options_.push_back(p.options());
  }
#ifndef WEFT_TORCH_CUDA_STREAMS
  TORCH_CHECK(!cuda_, "weft: GradSet: the parameters are on ", device_, "; this weft backend was built "
              "against torch ", TORCH_VERSION, ", which gives no access to its CUDA streams: build it "
              "against torch 2.2 or later for CUDA parameters");
#endif
  if (cuda_) {
    const char *why = nullptr;
    TORCH_CHECK(weft_memory_usable(WEFT_MEMORY_DEVICE, &why), "weft: GradSet: the parameters are on ",
                device_, ", but this weft takes no GPU memory: ", why);
  }
  state_->comm = group->splitForGradients("GradSet");
  weft_grad_options o;
  weft_grad_options_init(&o);
  o.owned_storage = 1;
  o.op = op == "avg" ? WEFT_AVG : WEFT_SUM;
  o.bucket_cap_bytes = static_cast<size_t>(cap);
  o.first_bucket_cap_bytes = static_cast<size_t>(first_cap);
  o.prediv = prediv;
  weft_status st = weft_grad_create(state_->comm, &o, &state_->grad);
  if (st) fail("__init__", st);
  for (const at::Tensor &p : params) {
    weft_dtype d;
    weftType(p.scalar_type(), &d);
    weft_tensor t = {nullptr, static_cast<size_t>(p.numel()), d,
                     cuda_ ? WEFT_MEMORY_DEVICE : WEFT_MEMORY_HOST};
    if ((st = weft_grad_register(state_->grad, &t, nullptr))) fail("__init__", st);
  }
  if ((st = weft_grad_finalize(state_->grad))) fail("__init__", st);
}

GradSet::~GradSet() = default;

std::vector<at::Tensor> GradSet::views() const {
  std::vector<at::Tensor> out;
  std::shared_ptr<State> keep = state_;
  for (size_t i = 0; i < sizes_.size(); i++) {
    void *ptr = nullptr;
    weft_status st = weft_grad_tensor_ptr(state_->grad, static_cast<int>(i), &ptr);
    if (st) fail("views", st);
    out.push_back(at::from_blob(ptr, sizes_[i], [keep](void *) {}, options_[i]));
  }
  return out;
}

void *GradSet::currentStream() const {
#ifdef WEFT_TORCH_CUDA_STREAMS
  if (cuda_) return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device_).native_handle();
#endif
  return nullptr;
}

void GradSet::ready(int64_t index) {
  // the set's stream: the one backward runs on as it reaches the first gradient
  if (cuda_ && !in_step_) {
    weft_status st = weft_grad_set_stream(state_->grad, currentStream());
    if (st) fail("ready", st);
  }
  in_step_ = true;
  weft_status st = weft_grad_ready(state_->grad, static_cast<int>(index));
  if (st) fail("ready", st);
}

void GradSet::wait() {
  weft_status st = cuda_ ? weft_grad_wait_stream(state_->grad, currentStream()) : weft_grad_wait(state_->grad);
  in_step_ = false;
  if (st) fail("wait", st);
}

void GradSet::setSync(bool sync) {
  weft_status st = weft_grad_set_sync(state_->grad, sync ? 1 : 0);
  if (st) fail("set_sync", st);
}

int64_t GradSet::bucketCount() const {
  return weft_grad_bucket_count(state_->grad);
}

}  // namespace weft_torch

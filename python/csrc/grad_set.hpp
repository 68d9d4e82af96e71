// grad_set.hpp - weft.torch._backend.GradSet: a weft gradient set (weft_grad_*,
// owned storage) over a module's parameters, for weft.torch.GradReducer
// (python/weft/torch/grad.py). The parameters' .grad become views of weft's
// buckets (host memory for CPU tensors, device memory for CUDA ones), each
// bucket reduced as soon as its last gradient is marked ready, on a
// communicator split from a weft process group.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "process_group_weft.hpp"

namespace weft_torch {

class GradSet {
 public:
  // Collective over the group: splits a communicator, registers one tensor
  // per parameter (its numel and dtype, declaration order), finalizes.
  // op "avg" or "sum"; caps in bytes (first_cap 0: cap); prediv as weft's.
  GradSet(const c10::intrusive_ptr<ProcessGroupWeft> &group, const std::vector<at::Tensor> &params,
          const std::string &op, int64_t cap, int64_t first_cap, double prediv);
  ~GradSet();

  // Each parameter's gradient as a view of its place in weft's bucket
  // (zeros at first); the views keep the set's memory alive.
  std::vector<at::Tensor> views() const;
  // weft_grad_ready: gradient `index` is final for this step (CUDA: once the
  // work queued so far on the current stream completes).
  void ready(int64_t index);
  // Ends the step: CPU, the means are in the views on return; CUDA, the
  // current stream waits for them on the GPU (weft_grad_wait_stream).
  void wait();
  // weft_grad_set_sync (accumulation steps: 0); between steps.
  void setSync(bool sync);
  int64_t bucketCount() const;
  bool onCuda() const { return cuda_; }

 private:
  struct State;
  std::shared_ptr<State> state_;
  std::vector<std::vector<int64_t>> sizes_;  // each parameter's
  std::vector<at::TensorOptions> options_;
  bool cuda_ = false;
  c10::Device device_{c10::kCPU};
  bool in_step_ = false;
  void *currentStream() const;
  [[noreturn]] void fail(const char *call, weft_status st) const;
};

}  // namespace weft_torch

// process_group_weft.hpp - weft as a torch.distributed backend: a process
// group whose collectives are weft's non-blocking requests, and the work
// objects that complete them. Built against torch 1.13 (backends derive from
// c10d::ProcessGroup) and torch 2.x (they derive from c10d::Backend).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

#include "weft.h"

namespace weft_torch {

// torch 2.x splits the user-facing ProcessGroup from the per-device Backend
// that third-party libraries provide; torch 1.13 has only ProcessGroup.
#if TORCH_VERSION_MAJOR >= 2
using BackendBase = c10d::Backend;
#else
using BackendBase = c10d::ProcessGroup;
#endif

// The coalesced tensor calls of c10d::Backend (torch 2.1 on)
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
#define WEFT_TORCH_COALESCED_TENSORS 1
#else
#define WEFT_TORCH_COALESCED_TENSORS 0
#endif

class ProcessGroupWeft;

// weft's dtype for a torch dtype (false: weft has none), and a torch dtype
// as a user writes it (torch.int16), for messages.
bool weftType(at::ScalarType s, weft_dtype *d);
std::string torchDtype(at::ScalarType s);

// One torch call: weft requests, the tensors they use (kept alive until
// weft is done with them), and what to do after success (copies out of a
// staging buffer). Completed by the process group's completer threads, which
// also complete the future DDP waits on.
class WorkWeft : public c10d::Work {
 public:
  WorkWeft(int rank, c10d::OpType type, std::string call, std::vector<at::Tensor> outputs);
  ~WorkWeft() override;

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override;

  // Marks the work done (eptr null) or failed, and its future with it.
  void complete(std::exception_ptr eptr);

  std::string call;                  // "allreduce", for messages
  std::vector<weft_request *> reqs;  // owned until completed
  std::vector<at::Tensor> keep;      // every buffer weft reads or writes
  std::function<void()> after;       // on success, before completion
  std::vector<at::Tensor> outputs;
  c10::intrusive_ptr<c10::ivalue::Future> future;
};

class ProcessGroupWeft : public BackendBase {
 public:
  // Collective over the group: rank 0 makes a weft unique id and puts it in
  // the store, the others read it, every rank joins the communicator.
  ProcessGroupWeft(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
                   std::chrono::milliseconds timeout);
  ~ProcessGroupWeft() override;

  const std::string getBackendName() const override { return "weft"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor> &tensors,
                                           const c10d::BroadcastOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor> &tensors,
                                           const c10d::AllreduceOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor> &tensors, const c10d::AllreduceCoalescedOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor> &tensors,
                                        const c10d::ReduceOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>> &outputs,
                                           std::vector<at::Tensor> &inputs,
                                           const c10d::AllgatherOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor &output, at::Tensor &input,
                                                 const c10d::AllgatherOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>> &outputs,
                                        std::vector<at::Tensor> &inputs,
                                        const c10d::GatherOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor> &outputs,
                                         std::vector<std::vector<at::Tensor>> &inputs,
                                         const c10d::ScatterOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor> &outputs,
                                                std::vector<std::vector<at::Tensor>> &inputs,
                                                const c10d::ReduceScatterOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor &output, at::Tensor &input, const c10d::ReduceScatterOptions &opts) override;
#if WEFT_TORCH_COALESCED_TENSORS
  // FSDP2's state dicts, DTensor's full_tensor and redistribute, the functional
  // collectives and _coalescing_manager: torch sends even one tensor here
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
      const c10d::AllgatherOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
      const c10d::ReduceScatterOptions &opts) override;
#endif
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor &output, at::Tensor &input,
                                               std::vector<int64_t> &outputSplits,
                                               std::vector<int64_t> &inputSplits,
                                               const c10d::AllToAllOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor> &outputs,
                                          std::vector<at::Tensor> &inputs,
                                          const c10d::AllToAllOptions &opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor> &tensors, int dstRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor> &tensors, int srcRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor> &tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions &opts) override;

  // The transport weft chose for `peer` ("shm", "tcp", ...), for tests and logs.
  std::string peerTransport(int peer) const;

  // A communicator of the same ranks for a gradient set (weft_comm_split):
  // its buckets leave at moments that differ between ranks, which must not
  // interleave with this group's calls. Collective; the caller destroys it.
  // Recovery after a lost rank (weft.torch.recover): weft_comm_shrink on
  // this group's communicator, kept here, with (its rank, its size); then
  // rank 0's bytes to every survivor over it; then it is destroyed. The
  // group itself is revoked by the shrink and stays to be destroyed.
  std::tuple<int, int> shrink();
  std::string shrunkBroadcast(const std::string &from_rank0);
  void shrunkDestroy();
  weft_comm *splitForGradients(const char *call);

  // Stops the completer threads and destroys the communicator (aborting it
  // when works are still running); later calls are refused. Idempotent.
  void shutdown();
  // shutdown() for every live process group: run at interpreter exit, while
  // a completer can still take the GIL to finish a Python callback (later,
  // Python ends any thread that asks for it, which aborts the process).
  static void shutdownAll();

 private:
  c10::intrusive_ptr<WorkWeft> newWork(c10d::OpType type, const char *call,
                                       std::vector<at::Tensor> outputs);
  // Hands a started work to a completer; p2p works to the polling one, so a
  // receive that waits for its peer never holds back the collectives.
  void enqueue(const c10::intrusive_ptr<WorkWeft> &work, bool p2p);
  [[noreturn]] void failIssue(const char *call, weft_status st) const;
  // Starts the one weft request of `work` under issue_mu_ (start(&req) is the
  // weft_i* call, which reads comm_ there) and hands the work to a completer.
  // The same for several requests in order (one work): where one fails to
  // start, those started are still waited for, then the call is refused.
  c10::intrusive_ptr<c10d::Work> issueMany(const c10::intrusive_ptr<WorkWeft> &work, const char *call,
                                           const at::Tensor &ordered_after,
                                           const std::vector<std::function<weft_status(weft_request **)>> &starts);
  template <typename Start>
  c10::intrusive_ptr<c10d::Work> issueOne(const c10::intrusive_ptr<WorkWeft> &work,
                                          const char *call, bool p2p, Start start);
  void checkLive(const char *call) const;  // under issue_mu_
  // Moves a tensor that is allreduced again and again (DDP's buckets) into
  // weft_mem_alloc memory, where weft reduces it in one pass among the ranks
  // of a host instead of a ring through shared slots. Under issue_mu_.
  void shareIfReused(const at::Tensor &t);
  std::exception_ptr failure(const WorkWeft &work, weft_status st) const;
  void collectiveLoop();
  void p2pLoop();
  void finishWork(WorkWeft &work, weft_status st);

  weft_comm *shrunk_ = nullptr; // shrink()'s, until shrunkDestroy
  weft_comm *comm_ = nullptr;
  // weft: one thread issues on a communicator at a time; torch may call from
  // several (autograd threads, the user's).
  std::mutex issue_mu_;

  std::mutex queue_mu_;
  // one per completer: a collective queued wakes only the collective one
  // (each wake-up is a context switch, dear on a 2-vCPU guest)
  std::condition_variable coll_cv_;
  std::condition_variable p2p_cv_;
  std::deque<c10::intrusive_ptr<WorkWeft>> collectives_;
  std::deque<c10::intrusive_ptr<WorkWeft>> p2p_;
  // the storages allreduced so far (only those shareIfReused may move), and
  // whether it may move any: every peer on this host, over shared memory
  struct Seen {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    const void *data;
  };
  std::unordered_map<const c10::StorageImpl *, Seen> seen_;
  // storages some started work still reads or writes (under queue_mu_): a
  // storage in it never moves, the old memory would go while weft uses it
  std::unordered_map<const c10::StorageImpl *, int> in_flight_;
  bool share_ = false;

  bool stopping_ = false;
  bool shut_ = false;
  int outstanding_ = 0;  // works started and not finished
  std::thread collective_thread_;
  std::thread p2p_thread_;
};

}  // namespace weft_torch

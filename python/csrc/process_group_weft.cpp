// process_group_weft.cpp - the weft process group: each torch call checks its
// tensors, starts weft's non-blocking request(s) and returns a work object;
// two completer threads finish those works (and the futures DDP waits on) as
// weft completes the requests. Every refusal names the call and the reason.
#include "process_group_weft.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <pthread.h>
#include <set>
#include <stdexcept>
#include <thread>

#include <Python.h>

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

// CUDA tensors need torch's current stream as the raw handle weft takes
// (weft_comm_set_stream): c10::Stream::native_handle, through the device
// guard CUDA torch registers, from torch 2.2 on. Nothing here links CUDA: a
// backend built against a CPU-only torch 2.x takes CUDA tensors once run
// under a CUDA torch, and weft finds the driver itself.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
#define WEFT_TORCH_CUDA 1
#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#endif

namespace weft_torch {

bool weftType(at::ScalarType s, weft_dtype *d) {
  switch (s) {
    case at::kFloat: *d = WEFT_F32; return true;
    case at::kDouble: *d = WEFT_F64; return true;
    case at::kHalf: *d = WEFT_F16; return true;
    case at::kBFloat16: *d = WEFT_BF16; return true;
    case at::kChar: *d = WEFT_I8; return true;
    case at::kByte: *d = WEFT_U8; return true;
    case at::kInt: *d = WEFT_I32; return true;
    case at::kLong: *d = WEFT_I64; return true;
    default: return false;
  }
}

// A dtype as a torch user writes it (torch.int16), not as c10 prints it (Short).
std::string torchDtype(at::ScalarType s) {
  switch (s) {
    case at::kFloat: return "torch.float32";
    case at::kDouble: return "torch.float64";
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kChar: return "torch.int8";
    case at::kByte: return "torch.uint8";
    case at::kShort: return "torch.int16";
    case at::kInt: return "torch.int32";
    case at::kLong: return "torch.int64";
    case at::kBool: return "torch.bool";
    case at::kComplexHalf: return "torch.complex32";
    case at::kComplexFloat: return "torch.complex64";
    case at::kComplexDouble: return "torch.complex128";
    default: return std::string("torch dtype ") + c10::toString(s);
  }
}

namespace {

// ---- checks and conversions --------------------------------------------------------

// CUDA tensors: torch 2.2 or later (WEFT_TORCH_CUDA), collectives and
// messages; anything else not on the CPU is refused.
void checkDevice(const char *call, const at::Tensor &t) {
#ifdef WEFT_TORCH_CUDA
  if (t.is_cuda()) {
    // a weft without CUDA cannot tell a device pointer from a host one
    const char *why = nullptr;
    TORCH_CHECK(weft_memory_usable(WEFT_MEMORY_DEVICE, &why), "weft: ", call, ": the tensor is on ",
                t.device(), ", but this weft takes no GPU memory: ", why);
    return;
  }
#else
  TORCH_CHECK(!t.is_cuda(), "weft: ", call, ": the tensor is on ", t.device(),
              "; this weft backend was built against torch ", TORCH_VERSION,
              ", which gives no access to its CUDA streams: build it against torch 2.2 or later "
              "for CUDA tensors");
#endif
  TORCH_CHECK(t.device().is_cpu(), "weft: ", call, ": the tensor is on ", t.device(),
              "; weft takes CPU and CUDA tensors");
}

void checkTensor(const char *call, const at::Tensor &t) {
  TORCH_CHECK(t.defined(), "weft: ", call, ": the tensor is undefined");
  checkDevice(call, t);
  TORCH_CHECK(t.layout() == at::kStrided, "weft: ", call, ": ", t.layout(),
              " tensors are not supported (dense tensors only)");
  // weft reads and writes the tensor's memory where it lies: a strided view
  // would need a copy and a copy back, which this backend does not hide
  TORCH_CHECK(t.is_contiguous(), "weft: ", call, ": the tensor is not contiguous (sizes ",
              t.sizes(), ", strides ", t.strides(),
              "); pass tensor.contiguous() and copy the result back");
}

const at::Tensor &single(const char *call, std::vector<at::Tensor> &tensors) {
  TORCH_CHECK(tensors.size() == 1, "weft: ", call, ": takes one tensor per call, got ",
              tensors.size());
  checkTensor(call, tensors[0]);
  return tensors[0];
}

// What weft moves for a tensor: its own element type when weft has it.
// Calls that only move data (broadcast, gathers, send) move any other type
// (bool, int16, complex...) as bytes; calls that reduce refuse it.
struct Wire {
  weft_dtype dtype;
  size_t count;
};

Wire reduceWire(const char *call, const at::Tensor &t) {
  weft_dtype d;
  TORCH_CHECK(weftType(t.scalar_type(), &d), "weft: ", call, ": cannot reduce ", torchDtype(t.scalar_type()),
              " tensors; weft reduces float32, float64, float16, bfloat16, int8, uint8, "
              "int32 and int64");
  return {d, static_cast<size_t>(t.numel())};
}

Wire moveWire(const at::Tensor &t) {
  weft_dtype d;
  if (weftType(t.scalar_type(), &d)) return {d, static_cast<size_t>(t.numel())};
  return {WEFT_U8, static_cast<size_t>(t.numel()) * t.element_size()};
}

// A reduction as weft runs it: weft's op, and for PREMUL_SUM the factor each
// rank's tensor is multiplied by before the sum. weft has no such op; the
// multiply is one torch pass on this rank's data (in place for an allreduce,
// into the staging buffer where the call packs one anyway), queued before the
// call on the tensor's stream. Every rank then sums the same way, so the result
// is the same bits on every rank, as it is for SUM.
struct Reduction {
  weft_op op = WEFT_SUM;
  bool premul = false;
  double factor = 1;
  at::Tensor factor_tensor;  // a 1-element CUDA tensor for CUDA data: no host sync

  // t *= factor
  void scale_(at::Tensor &t) const {
    if (!premul) return;
    if (factor_tensor.defined())
      t.mul_(factor_tensor);
    else
      t.mul_(factor);
  }
  // out = in * factor (out may be a slice of a staging buffer: one pass)
  void scaleInto(at::Tensor out, const at::Tensor &in) const {
    if (!premul)
      out.copy_(in);
    else if (factor_tensor.defined())
      at::mul_out(out, in, factor_tensor);
    else
      at::mul_out(out, in, at::scalar_tensor(factor, at::TensorOptions().dtype(at::kDouble)));
  }
  // a scaled copy of in (the input of a call that must not change it)
  at::Tensor scaled(const at::Tensor &in) const {
    at::Tensor out = at::empty_like(in, at::MemoryFormat::Contiguous);
    scaleInto(out, in);
    return out;
  }
};

const char *kOps = "weft has SUM, PRODUCT, MIN, MAX, AVG, and PREMUL_SUM for floating tensors";

// `like`: a tensor of the call (PREMUL_SUM checks its dtype and device)
Reduction reductionOf(const char *call, const c10d::ReduceOp &op, const at::Tensor &like) {
  Reduction r;
  switch (static_cast<c10d::ReduceOp::RedOpType>(op)) {
    case c10d::ReduceOp::SUM: r.op = WEFT_SUM; return r;
    case c10d::ReduceOp::PRODUCT: r.op = WEFT_PROD; return r;
    case c10d::ReduceOp::MIN: r.op = WEFT_MIN; return r;
    case c10d::ReduceOp::MAX: r.op = WEFT_MAX; return r;
    case c10d::ReduceOp::AVG: r.op = WEFT_AVG; return r;
    case c10d::ReduceOp::BAND:
      TORCH_CHECK(false, "weft: ", call, ": ReduceOp.BAND is not supported (", kOps, ")");
    case c10d::ReduceOp::BOR:
      TORCH_CHECK(false, "weft: ", call, ": ReduceOp.BOR is not supported (", kOps, ")");
    case c10d::ReduceOp::BXOR:
      TORCH_CHECK(false, "weft: ", call, ": ReduceOp.BXOR is not supported (", kOps, ")");
    case c10d::ReduceOp::PREMUL_SUM: break;
    default:
      TORCH_CHECK(false, "weft: ", call, ": reduce op ",
                  static_cast<int>(static_cast<c10d::ReduceOp::RedOpType>(op)), " is not supported (",
                  kOps, ")");
  }
  TORCH_CHECK(at::isFloatingType(like.scalar_type()), "weft: ", call, ": ReduceOp.PREMUL_SUM takes floating "
              "tensors (float32, float64, float16, bfloat16), not ", torchDtype(like.scalar_type()));
  // torch makes PREMUL_SUM with this supplement and no other (as NCCL reads it)
  const auto *supplement = static_cast<const c10d::NCCLPreMulSumSupplement *>(op.supplement_.get());
  TORCH_CHECK(supplement != nullptr, "weft: ", call,
              ": ReduceOp.PREMUL_SUM without its factor (make it with "
              "torch.distributed._make_nccl_premul_sum(factor))");
  r.op = WEFT_SUM;
  r.premul = true;
  r.factor = supplement->double_factor;
#if TORCH_VERSION_MAJOR >= 2
  at::Tensor f = supplement->tensor_factor;
#else
  at::Tensor f = supplement->tensor_factors.empty() ? at::Tensor() : supplement->tensor_factors[0];
#endif
  if (f.defined()) {
    TORCH_CHECK(f.numel() == 1, "weft: ", call, ": the PREMUL_SUM factor has ", f.numel(),
                " elements; it must be a scalar or a tensor of one element");
    TORCH_CHECK(!f.is_complex() && f.scalar_type() != at::kBool, "weft: ", call,
                ": the PREMUL_SUM factor is ", torchDtype(f.scalar_type()), "; it must be real");
    // a factor on the data's GPU stays there, read by the multiply in stream
    // order; one on the CPU (or data on the CPU) is read now
    if (f.is_cuda() && like.is_cuda() && f.device() == like.device())
      r.factor_tensor = f.reshape({});
    else
      r.factor = f.item<double>();
  }
  return r;
}

void checkSame(const char *call, const at::Tensor &a, const at::Tensor &b, const char *what) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "weft: ", call, ": ", what, " is ",
              torchDtype(b.scalar_type()), " but the input is ", torchDtype(a.scalar_type()));
  TORCH_CHECK(a.device() == b.device(), "weft: ", call, ": ", what, " is on ", b.device(),
              " but the input is on ", a.device());
  checkDevice(call, b);
}

// The stream weft's call is ordered on, for a CUDA tensor: a side stream of
// torch's pool that waits, now, for the work queued so far on torch's
// current stream (as ProcessGroupNCCL's own stream does); NULL for CPU
// tensors. weft makes the stream it is given wait at issue for the call's
// result (weft.h); given the current stream, that would hold backward's
// next kernels until each bucket is reduced, and DDP would overlap nothing.
// The work's wait() returns once the result is in place, so the current
// stream needs no link back. Pool streams round-robin, so calls issued one
// after another seldom share one (a shared one orders their inputs too).
void *streamOf(const at::Tensor &t) {
#ifdef WEFT_TORCH_CUDA
  if (t.defined() && t.is_cuda()) {
    const c10::impl::DeviceGuardImplInterface *impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    c10::Stream side = impl->getStreamFromGlobalPool(t.device(), false);
    c10::Event before(c10::DeviceType::CUDA);
    before.record(impl->getStream(t.device()));
    before.block(side);
    return side.native_handle();
  }
#else
  (void)t;
#endif
  return nullptr;
}

// Copies out of a staging tensor (allgather into a list, say) run on the
// completer thread's current stream; the work completes only once they
// have, so the user's stream never reads a list tensor before its copy.
void syncCopies(const std::vector<at::Tensor> &outputs) {
#ifdef WEFT_TORCH_CUDA
  for (const auto &t : outputs)
    if (t.defined() && t.is_cuda()) {
      c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(t.device()).synchronize();
      return;
    }
#else
  (void)outputs;
#endif
}

// A flat copy of equally sized tensors, in order (the staging of list calls).
at::Tensor stack(const char *call, const std::vector<at::Tensor> &list, const at::Tensor &like,
                 const char *what) {
  std::vector<at::Tensor> flat;
  flat.reserve(list.size());
  for (const auto &t : list) {
    checkSame(call, like, t, what);
    TORCH_CHECK(t.numel() == like.numel(), "weft: ", call, ": every tensor of ", what,
                " must have ", like.numel(), " elements; one has ", t.numel());
    flat.push_back(t.reshape({-1}));
  }
  return at::cat(flat);
}

// The same, each tensor multiplied by a PREMUL_SUM's factor on its way in.
at::Tensor stack(const char *call, const std::vector<at::Tensor> &list, const at::Tensor &like,
                 const char *what, const Reduction &red) {
  if (!red.premul) return stack(call, list, like, what);
  for (const auto &t : list) {
    checkSame(call, like, t, what);
    TORCH_CHECK(t.numel() == like.numel(), "weft: ", call, ": every tensor of ", what,
                " must have ", like.numel(), " elements; one has ", t.numel());
  }
  const int64_t n = like.numel();
  at::Tensor flat = at::empty({static_cast<int64_t>(list.size()) * n}, like.options());
  for (size_t i = 0; i < list.size(); i++)
    red.scaleInto(flat.narrow(0, static_cast<int64_t>(i) * n, n), list[i].reshape({-1}));
  return flat;
}

// weft's sentence for the last failure (it names rank, call, peer and the
// status); the status's own sentence when there is none
std::string weftSentence(const weft_comm *comm, weft_status st) {
  const char *msg = weft_last_error(comm);
  if (msg && *msg) return msg;
  return std::string(weft_strerror(st)) + " (" + weft_status_name(st) + ")";
}

// ---- buckets in shared memory -------------------------------------------------------

// weft's direct allreduce (one pass through every rank's buffers) starts at
// its WEFT_DIRECT_MIN_BYTES, 1 MiB by default; below that the ring is as fast
constexpr size_t kShareMinBytes = size_t{1} << 20;

// WEFT_TORCH_SHARED_BUCKETS=1 opts in. Off by default: the move changes a
// tensor's address under its owner, and a raw pointer taken outside torch
// (tensor.numpy() held across allreduces) would then read freed memory.
bool sharingWanted() {
  const char *v = std::getenv("WEFT_TORCH_SHARED_BUCKETS");
  return v && std::strcmp(v, "1") == 0;
}

void freeShared(void *p) {
  weft_mem_free(p);
}

}  // namespace

// DDP allreduces the same bucket tensors every step; over shared memory,
// weft's ring copies each through slots, twice, while buffers from
// weft_mem_alloc are reduced in one pass (about 1.8x faster for 25 MB on 2
// ranks here). So the second time a storage is allreduced, its bytes move
// into such memory, under the same StorageImpl: the tensor, its views (the
// gradients, with gradient_as_bucket_view) and the reducer's tensors all see
// the new address. Only a storage that torch's own CPU allocator made and
// that the tensor covers whole moves: never memory numpy, a file or another
// library owns. A storage seen once (a fresh tensor each step) never moves:
// that would cost a copy every step, and peers keep a mapping of a shared
// buffer until the communicator ends. Costs one copy, once.
void ProcessGroupWeft::shareIfReused(const at::Tensor &t) {
  if (!share_ || t.nbytes() < kShareMinBytes || t.storage_offset() != 0) return;
  const c10::Storage &storage = t.storage();
  c10::StorageImpl *impl = storage.unsafeGetStorageImpl();
  if (storage.nbytes() != t.nbytes()) return;
  const c10::DataPtr &dp = storage.data_ptr();
  if (dp.get_deleter() == &freeShared) return;  // moved already
  if (dp.get_deleter() == nullptr ||
      dp.get_deleter() != c10::GetDefaultCPUAllocator()->raw_deleter())
    return;
  auto it = seen_.find(impl);
  if (it == seen_.end() || it->second.storage.expired() || it->second.data != dp.get()) {
    if (it != seen_.end()) seen_.erase(it);
    if (seen_.size() >= 256) {  // forget the storages that are gone
      for (auto i = seen_.begin(); i != seen_.end();)
        i = i->second.storage.expired() ? seen_.erase(i) : std::next(i);
    }
    if (seen_.size() < 256)
      seen_.emplace(impl, Seen{c10::weak_intrusive_ptr<c10::StorageImpl>(
                                   c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(impl)),
                               dp.get()});
    return;
  }
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (in_flight_.count(impl)) return;  // asked again at its next allreduce
  }
  seen_.erase(it);
  void *shared = nullptr;
  if (weft_mem_alloc(storage.nbytes(), &shared) != WEFT_OK) return;  // the ring still works
  std::memcpy(shared, dp.get(), storage.nbytes());
  // the old DataPtr, returned, frees torch's memory as it goes
  impl->set_data_ptr(c10::DataPtr(shared, shared, &freeShared, c10::Device(c10::DeviceType::CPU)));
}

// ---- work ----------------------------------------------------------------------------

WorkWeft::WorkWeft(int rank, c10d::OpType type, std::string call_name, std::vector<at::Tensor> outs)
    : c10d::Work(rank, type),
      call(std::move(call_name)),
      outputs(std::move(outs)),
      future(
          c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
}

// The completers hold a reference until the requests are done, so a work is
// only destroyed once weft no longer uses its buffers.
WorkWeft::~WorkWeft() = default;

c10::intrusive_ptr<c10::ivalue::Future> WorkWeft::getFuture() {
  return future;
}

std::vector<at::Tensor> WorkWeft::result() {
  return outputs;
}

void WorkWeft::complete(std::exception_ptr eptr) {
  finish(eptr);
  // after finish: callbacks chained on the future run here, and work.wait()
  // should not wait for them
  if (eptr)
    future->setError(eptr);
  else
    future->markCompleted(c10::IValue(outputs));
}

// ---- the process group ---------------------------------------------------------------

namespace {
std::mutex live_mu;
std::set<ProcessGroupWeft *> live_groups;  // for shutdownAll at interpreter exit

// ---- the unique id through the store, one key per init -------------------------------
//
// A store can outlive a group: torchrun's agent store, or rank 0's multi-tenant
// TCPStore, keeps its keys across destroy_process_group, and torch names the
// default group (and the new groups after it) alike after every destroy. So each
// init has its own key: every rank counts its inits of a group of this size on
// this store (weft_inits/SIZE/rankR, an atomic add), and the n-th init of every
// rank is one generation, whose id rank 0 puts under weft_unique_id/SIZE/n once
// every rank has counted it.
//
// The counts stay equal while inits succeed or fail everywhere: an init that
// fails before the id was handed out takes its count back ('E' below). Where they
// differ all the same (an init that failed part-way, a rank that skipped one),
// rank 0 sees it, sets every count to the highest, and every rank fails at once
// naming both inits ('A'); the next init on every rank pairs again.

std::string initsKey(int size, int rank) {
  return "weft_inits/" + std::to_string(size) + "/rank" + std::to_string(rank);
}

std::string idKey(int size, int64_t generation) {
  return "weft_unique_id/" + std::to_string(size) + "/" + std::to_string(generation);
}

// A rank's count of inits so far (an add of 0 reads without changing it).
int64_t initsOf(c10d::Store &store, int size, int rank) { return store.add(initsKey(size, rank), 0); }

std::vector<uint8_t> bytesOf(const std::string &s) { return std::vector<uint8_t>(s.begin(), s.end()); }

bool pastDeadline(std::chrono::steady_clock::time_point start, std::chrono::milliseconds timeout) {
  return timeout.count() > 0 && std::chrono::steady_clock::now() - start >= timeout;
}

void pause(std::chrono::milliseconds *wait) {
  std::this_thread::sleep_for(*wait);
  *wait = std::min(*wait * 2, std::chrono::milliseconds(50));
}

// Rank 0: waits until every rank has counted this init, then hands out the id
// (or the sentence of why there is none) under this generation's key.
void publishId(c10d::Store &store, int size, int64_t generation, std::chrono::milliseconds timeout,
               weft_unique_id *id) {
  std::vector<int64_t> counts(size, 0);
  counts[0] = generation;
  auto start = std::chrono::steady_clock::now();
  auto wait = std::chrono::milliseconds(1);
  for (int r = 1; r < size;) {
    counts[r] = initsOf(store, size, r);
    if (counts[r] >= generation) {
      r++;
      continue;
    }
    if (pastDeadline(start, timeout)) {
      std::string why = "rank " + std::to_string(r) + " did not begin init #" + std::to_string(generation) +
                        " of this group (it is at init #" + std::to_string(counts[r]) + ") within the timeout of " +
                        std::to_string(timeout.count()) + " ms";
      store.set(idKey(size, generation), bytesOf("E" + why));
      store.add(initsKey(size, 0), -1);
      TORCH_CHECK(false, "weft: init of rank 0 of ", size, ": ", why);
    }
    pause(&wait);
  }
  int64_t highest = *std::max_element(counts.begin(), counts.end());
  if (highest > generation) {
    int other = static_cast<int>(std::max_element(counts.begin(), counts.end()) - counts.begin());
    std::string why = "rank 0 was at its init #" + std::to_string(generation) + " of this group on this store, rank " +
                      std::to_string(other) + " at its init #" + std::to_string(highest) +
                      " (an earlier init_process_group failed or was skipped on some ranks); every rank's count "
                      "is now #" + std::to_string(highest) + ", so the next init_process_group on every rank pairs "
                      "them again";
    // rank 0's own count last: a rank that sees it raised fails, and may init
    // again at once, which must find its own count aligned already
    for (int r = size - 1; r >= 0; r--) store.set(initsKey(size, r), bytesOf(std::to_string(highest)));
    std::set<int64_t> told;
    for (int64_t g : counts)
      if (told.insert(g).second) store.set(idKey(size, g), bytesOf("A" + why));
    TORCH_CHECK(false, "weft: init: ", why);
  }
  weft_status st = weft_get_unique_id(id);
  if (st != WEFT_OK) {
    std::string why = "rank 0 could not make a unique id: " + weftSentence(nullptr, st);
    store.set(idKey(size, generation), bytesOf("E" + why));
    store.add(initsKey(size, 0), -1);
    TORCH_CHECK(false, "weft: init: ", why);
  }
  store.set(idKey(size, generation), bytesOf(std::string("I") + std::string(id->bytes, sizeof id->bytes)));
}

// Another rank: waits for this generation's id, polling, so that rank 0 found
// at a later init fails it at once (rank 0 never writes this key then). An
// init that fails here before an id was handed out takes its count back.
void fetchId(c10d::Store &store, int rank, int size, int64_t generation, std::chrono::milliseconds timeout,
             weft_unique_id *id) {
  const std::string key = idKey(size, generation);
  auto start = std::chrono::steady_clock::now();
  auto wait = std::chrono::milliseconds(1);
  while (!store.check({key})) {
    int64_t rank0 = initsOf(store, size, 0);
    // Rank 0 ahead: it may have written this key (the 'A' sentence) between the
    // check above and that read, then raised its count by a new init; its words
    // name the counts it aligned, so they win where they are there.
    if (rank0 > generation && store.check({key})) break;
    TORCH_CHECK(rank0 <= generation, "weft: init: rank 0 is at its init #", rank0,
                " of this group on this store, rank ", rank, " at its init #", generation,
                " (an earlier init_process_group failed or was skipped on some ranks)");
    if (pastDeadline(start, timeout)) {
      store.add(initsKey(size, rank), -1);
      TORCH_CHECK(false, "weft: init of rank ", rank, " of ", size,
                  ": rank 0 did not publish the weft unique id of init #", generation, " (store key \"", key,
                  "\") within the timeout of ", timeout.count(), " ms; rank 0 is at init #", rank0);
    }
    pause(&wait);
  }
  std::vector<uint8_t> value = store.get(key);
  std::string text(value.begin() + (value.empty() ? 0 : 1), value.end());
  if (!value.empty() && value[0] == 'E') store.add(initsKey(size, rank), -1);
  TORCH_CHECK(!value.empty() && value[0] != 'E' && value[0] != 'A', "weft: init: ", text);
  TORCH_CHECK(value[0] == 'I' && value.size() == 1 + sizeof id->bytes,
              "weft: init: the store holds no weft unique id under \"", key, "\" (", value.size(), " bytes)");
  std::memcpy(id->bytes, value.data() + 1, sizeof id->bytes);
}
}  // namespace

ProcessGroupWeft::ProcessGroupWeft(const c10::intrusive_ptr<c10d::Store> &store, int rank, int size,
                                   std::chrono::milliseconds timeout)
    : BackendBase(rank, size) {
  weft_config cfg;
  weft_config_init(&cfg);
  cfg.rank = rank;
  cfg.size = size;
  cfg.timeout_s = timeout.count() > 0 ? static_cast<double>(timeout.count()) / 1000.0 : 0;
  weft_status st;
  if (size == 1) {
    st = weft_comm_init_config(&cfg, &comm_);  // one rank meets nobody
  } else {
    // like NCCL's process group: rank 0 makes the id, the store carries it,
    // under this init's own key (above). A failure on rank 0 goes into the
    // store too, so the others fail at once with its sentence instead of
    // waiting for the store's timeout.
    weft_unique_id id;
    int64_t generation = store->add(initsKey(size, rank), 1);
    if (rank == 0)
      publishId(*store, size, generation, timeout, &id);
    else
      fetchId(*store, rank, size, generation, timeout, &id);
    st = weft_comm_init_rank_config(&comm_, &id, &cfg);
  }
  TORCH_CHECK(st == WEFT_OK, "weft: init of rank ", rank, " of ", size,
              " failed: ", weftSentence(nullptr, st));
  share_ = size > 1 && sharingWanted();
  for (int peer = 0; share_ && peer < size; peer++)
    share_ = peer == rank || peerTransport(peer) == "shm";
  collective_thread_ = std::thread([this] { collectiveLoop(); });
  p2p_thread_ = std::thread([this] { p2pLoop(); });
  // named, so top -H, gdb and /proc/PID/task show which thread is which
  pthread_setname_np(collective_thread_.native_handle(), "weft-pg-coll");
  pthread_setname_np(p2p_thread_.native_handle(), "weft-pg-p2p");
  std::lock_guard<std::mutex> lock(live_mu);
  live_groups.insert(this);
}

ProcessGroupWeft::~ProcessGroupWeft() {
  // Python drops the last reference with the GIL held; a completer may be
  // running a Python callback chained on a future, which needs it
  PyThreadState *saved = Py_IsInitialized() && PyGILState_Check() ? PyEval_SaveThread() : nullptr;
  {
    std::lock_guard<std::mutex> lock(live_mu);  // waits for a shutdownAll in progress
    live_groups.erase(this);
  }
  shutdown();
  if (saved) PyEval_RestoreThread(saved);
}

void ProcessGroupWeft::shutdown() {
  std::lock_guard<std::mutex> issue(issue_mu_);
  bool pending;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (shut_) return;
    shut_ = true;
    pending = outstanding_ > 0;
    stopping_ = true;
  }
  // Requests still waiting for peers would hold the completers until the
  // timeout; the abort completes them with an error (and tells the peers).
  if (pending) weft_comm_abort(comm_);
  coll_cv_.notify_all();
  p2p_cv_.notify_all();
  if (collective_thread_.joinable()) collective_thread_.join();
  if (p2p_thread_.joinable()) p2p_thread_.join();
  weft_comm_destroy(comm_);
  comm_ = nullptr;
  shrunkDestroy();
}

void ProcessGroupWeft::shutdownAll() {
  // held throughout: a group's destructor waits here before it goes
  std::lock_guard<std::mutex> lock(live_mu);
  for (auto *pg : live_groups) pg->shutdown();
}

std::tuple<int, int> ProcessGroupWeft::shrink() {
  std::lock_guard<std::mutex> issue(issue_mu_);
  checkLive("recover");
  TORCH_CHECK(shrunk_ == nullptr, "weft: recover: a shrink of this group is already held");
  // revokes comm_ first: a call the collective thread is blocked in ends
  weft_status st = weft_comm_shrink(comm_, &shrunk_);
  TORCH_CHECK(st == WEFT_OK, "weft: recover: shrinking the group to its live ranks: ",
              weftSentence(comm_, st));
  return {weft_comm_rank(shrunk_), weft_comm_size(shrunk_)};
}

std::string ProcessGroupWeft::shrunkBroadcast(const std::string &from_rank0) {
  TORCH_CHECK(shrunk_ != nullptr, "weft: recover: no shrink held");
  char buf[512] = {0};
  if (weft_comm_rank(shrunk_) == 0) {
    TORCH_CHECK(from_rank0.size() < sizeof buf, "weft: recover: ", from_rank0.size(),
                " bytes to pass on, at most ", sizeof buf - 1);
    std::memcpy(buf, from_rank0.data(), from_rank0.size());
  }
  weft_status st = weft_broadcast(shrunk_, buf, buf, sizeof buf, WEFT_U8, 0);
  TORCH_CHECK(st == WEFT_OK, "weft: recover: ", weftSentence(shrunk_, st));
  return std::string(buf);
}

void ProcessGroupWeft::shrunkDestroy() {
  if (shrunk_) weft_comm_destroy(shrunk_);
  shrunk_ = nullptr;
}

weft_comm *ProcessGroupWeft::splitForGradients(const char *call) {
  std::lock_guard<std::mutex> issue(issue_mu_);
  checkLive(call);
  weft_comm *out = nullptr;
  weft_status st = weft_comm_split(comm_, 0, getRank(), &out);
  TORCH_CHECK(st == WEFT_OK, "weft: ", call, ": a communicator of its own for the gradients: ",
              weftSentence(comm_, st));
  return out;
}

void ProcessGroupWeft::checkLive(const char *call) const {
  TORCH_CHECK(comm_ != nullptr, "weft: ", call,
              ": the process group was shut down (at interpreter exit)");
}

std::string ProcessGroupWeft::peerTransport(int peer) const {
  const char *transport = nullptr, *reason = nullptr;
  weft_status st = weft_comm_peer_transport(comm_, peer, &transport, &reason);
  TORCH_CHECK(st == WEFT_OK, "weft: peer_transport: ", weft_last_error(comm_));
  return transport;
}

c10::intrusive_ptr<WorkWeft> ProcessGroupWeft::newWork(c10d::OpType type, const char *call,
                                                       std::vector<at::Tensor> outputs) {
  return c10::make_intrusive<WorkWeft>(getRank(), type, call, std::move(outputs));
}

void ProcessGroupWeft::enqueue(const c10::intrusive_ptr<WorkWeft> &work, bool p2p) {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    (p2p ? p2p_ : collectives_).push_back(work);
    outstanding_++;
    for (const auto &t : work->keep)
      if (t.defined()) in_flight_[t.storage().unsafeGetStorageImpl()]++;
  }
  (p2p ? p2p_cv_ : coll_cv_).notify_one();
}

void ProcessGroupWeft::failIssue(const char *call, weft_status st) const {
  TORCH_CHECK(false, "weft: ", call, " refused on rank ", getRank(), ": ", weftSentence(comm_, st));
}

std::exception_ptr ProcessGroupWeft::failure(const WorkWeft &work, weft_status st) const {
  std::string msg = "weft: " + work.call + " failed on rank " + std::to_string(getRank()) + ": " +
                    weftSentence(comm_, st);
  return std::make_exception_ptr(std::runtime_error(msg));
}

void ProcessGroupWeft::finishWork(WorkWeft &work, weft_status st) {
  {
    // weft is done with the requests: counted before the user can see the
    // work complete, so a destructor that follows never aborts for it
    std::lock_guard<std::mutex> lock(queue_mu_);
    outstanding_--;
    for (const auto &t : work.keep) {
      if (!t.defined()) continue;
      auto it = in_flight_.find(t.storage().unsafeGetStorageImpl());
      if (it != in_flight_.end() && --it->second == 0) in_flight_.erase(it);
    }
  }
  std::exception_ptr eptr;
  if (st != WEFT_OK) {
    eptr = failure(work, st);
  } else if (work.after) {
    try {
      work.after();
      syncCopies(work.outputs);
    } catch (...) {
      eptr = std::current_exception();
    }
  }
  work.keep.clear();  // staging buffers go now, not when the user drops the work
  work.complete(eptr);
}

// Collectives complete in issue order (weft's rule), so waiting for the
// oldest one at a time loses nothing and needs no polling.
void ProcessGroupWeft::collectiveLoop() {
  at::NoGradGuard no_grad;  // copies out of staging buffers are not part of any graph
  for (;;) {
    c10::intrusive_ptr<WorkWeft> work;
    {
      std::unique_lock<std::mutex> lock(queue_mu_);
      coll_cv_.wait(lock, [this] { return stopping_ || !collectives_.empty(); });
      if (collectives_.empty()) return;
      work = collectives_.front();
      collectives_.pop_front();
    }
    weft_status st = weft_wait_all(work->reqs.data(), static_cast<int>(work->reqs.size()));
    finishWork(*work, st);
  }
}

// Sends and receives complete in any order, each when its peer gets there:
// they are tested in turn, backing off to 200 us between rounds.
void ProcessGroupWeft::p2pLoop() {
  at::NoGradGuard no_grad;
  std::vector<c10::intrusive_ptr<WorkWeft>> live;
  int idle_us = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(queue_mu_);
      if (live.empty()) p2p_cv_.wait(lock, [this] { return stopping_ || !p2p_.empty(); });
      if (live.empty() && p2p_.empty()) return;
      while (!p2p_.empty()) {
        live.push_back(p2p_.front());
        p2p_.pop_front();
        idle_us = 0;
      }
    }
    bool progress = false;
    for (size_t i = 0; i < live.size();) {
      WorkWeft &w = *live[i];
      weft_status st = WEFT_OK;
      bool done = true;
      for (auto &req : w.reqs) {
        int req_done = 1;
        if (req) {
          weft_status s = weft_test(&req, &req_done);
          if (s != WEFT_OK && st == WEFT_OK) st = s;
        }
        done = done && req_done;
      }
      if (done) {
        finishWork(w, st);
        live.erase(live.begin() + static_cast<long>(i));
        progress = true;
      } else {
        i++;
      }
    }
    if (!live.empty() && !progress) {
      idle_us = idle_us ? std::min(idle_us * 2, 200) : 1;
      std::this_thread::sleep_for(std::chrono::microseconds(idle_us));
    } else {
      idle_us = 0;
    }
  }
}

// ---- collectives ---------------------------------------------------------------------

template <typename Start>
c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::issueOne(const c10::intrusive_ptr<WorkWeft> &work,
                                                          const char *call, bool p2p, Start start) {
  std::lock_guard<std::mutex> issue(issue_mu_);
  checkLive(call);
  // CUDA tensors: the call starts after the work queued on torch's current
  // stream now (through a side stream: streamOf)
  weft_comm_set_stream(comm_, streamOf(work->keep.empty() ? at::Tensor() : work->keep[0]));
  weft_request *req = nullptr;
  weft_status st = start(&req);
  if (st != WEFT_OK) failIssue(call, st);
  work->reqs.push_back(req);
  enqueue(work, p2p);
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::broadcast(std::vector<at::Tensor> &tensors,
                                                           const c10d::BroadcastOptions &opts) {
  const char *call = "broadcast";
  const at::Tensor &t = single(call, tensors);
  TORCH_CHECK(opts.rootTensor == 0, "weft: ", call, ": root_tensor must be 0");
  const int root = static_cast<int>(opts.rootRank);
  Wire w = moveWire(t);
  auto work = newWork(c10d::OpType::BROADCAST, call, tensors);
  work->keep = {t};
  void *p = t.data_ptr();
  return issueOne(work, call, false, [&](weft_request **req) {
    return weft_ibroadcast(comm_, getRank() == root ? p : nullptr, p, w.count, w.dtype, root, req);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::issueMany(
    const c10::intrusive_ptr<WorkWeft> &work, const char *call, const at::Tensor &ordered_after,
    const std::vector<std::function<weft_status(weft_request **)>> &starts) {
  std::lock_guard<std::mutex> issue(issue_mu_);
  checkLive(call);
  weft_comm_set_stream(comm_, streamOf(ordered_after));
  for (const auto &start : starts) {
    weft_request *req = nullptr;
    weft_status st = start(&req);
    if (st != WEFT_OK) {
      enqueue(work, false);  // the ones started are still waited for (and freed)
      failIssue(call, st);
    }
    work->reqs.push_back(req);
  }
  enqueue(work, false);
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::allreduce(std::vector<at::Tensor> &tensors,
                                                           const c10d::AllreduceOptions &opts) {
  const char *call = "allreduce";
  at::Tensor t = single(call, tensors);
  Wire w = reduceWire(call, t);
  Reduction red = reductionOf(call, opts.reduceOp, t);
  auto work = newWork(c10d::OpType::ALLREDUCE, call, tensors);
  work->keep = {t};
  {
    at::NoGradGuard no_grad;
    red.scale_(t);  // PREMUL_SUM: the tensor is the result anyway
  }
  return issueOne(work, call, false, [&](weft_request **req) {
    shareIfReused(t);
    return weft_iallreduce(comm_, t.data_ptr(), t.data_ptr(), w.count, w.dtype, red.op, req);
  });
}

// One weft allreduce per tensor, no packing: weft's own small-message path
// is cheaper than a copy in and out, and mixed dtypes just work.
c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::allreduce_coalesced(
    std::vector<at::Tensor> &tensors, const c10d::AllreduceCoalescedOptions &opts) {
  const char *call = "allreduce_coalesced";
  std::vector<Wire> wires;
  std::vector<Reduction> reds;
  for (const auto &t : tensors) {
    checkTensor(call, t);
    TORCH_CHECK(t.device() == tensors[0].device(), "weft: ", call, ": tensors on ", tensors[0].device(), " and ",
                t.device(), " in one call");
    wires.push_back(reduceWire(call, t));
    reds.push_back(reductionOf(call, opts.reduceOp, t));
  }
  auto work = newWork(c10d::OpType::ALLREDUCE_COALESCED, call, tensors);
  work->keep = tensors;
  std::vector<std::function<weft_status(weft_request **)>> starts;
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < tensors.size(); i++) {
    at::Tensor t = tensors[i];
    reds[i].scale_(t);
    Wire w = wires[i];
    weft_op op = reds[i].op;
    starts.push_back([this, t, w, op](weft_request **req) {
      return weft_iallreduce(comm_, t.data_ptr(), t.data_ptr(), w.count, w.dtype, op, req);
    });
  }
  return issueMany(work, call, tensors.empty() ? at::Tensor() : tensors[0], starts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::reduce(std::vector<at::Tensor> &tensors,
                                                        const c10d::ReduceOptions &opts) {
  const char *call = "reduce";
  const at::Tensor &t = single(call, tensors);
  TORCH_CHECK(opts.rootTensor == 0, "weft: ", call, ": root_tensor must be 0");
  Wire w = reduceWire(call, t);
  Reduction red = reductionOf(call, opts.reduceOp, t);
  const int root = static_cast<int>(opts.rootRank);
  auto work = newWork(c10d::OpType::REDUCE, call, tensors);
  // PREMUL_SUM: a scaled copy is sent (a rank that is not the root keeps its tensor)
  at::Tensor in = t;
  if (red.premul) {
    at::NoGradGuard no_grad;
    in = red.scaled(t);
  }
  work->keep = {t, in};
  return issueOne(work, call, false, [&](weft_request **req) {
    return weft_ireduce(comm_, in.data_ptr(), getRank() == root ? t.data_ptr() : nullptr, w.count, w.dtype,
                        red.op, root, req);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::allgather(
    std::vector<std::vector<at::Tensor>> &outputs, std::vector<at::Tensor> &inputs,
    const c10d::AllgatherOptions &) {
  const char *call = "allgather";
  const at::Tensor &in = single(call, inputs);
  TORCH_CHECK(outputs.size() == 1, "weft: ", call, ": takes one output list, got ", outputs.size());
  auto &outs = outputs[0];
  TORCH_CHECK(static_cast<int>(outs.size()) == getSize(), "weft: ", call, ": the output list has ",
              outs.size(), " tensors; the group has ", getSize(), " ranks");
  for (const auto &o : outs) {
    checkSame(call, in, o, "an output tensor");
    TORCH_CHECK(o.numel() == in.numel(), "weft: ", call, ": an output tensor has ", o.numel(),
                " elements, the input ", in.numel());
  }
  Wire w = moveWire(in);
  at::Tensor flat = at::empty({getSize() * in.numel()}, in.options());
  auto work = newWork(c10d::OpType::ALLGATHER, call, outs);
  work->keep = {in, flat};
  const int64_t n = in.numel();
  work->after = [flat, outs, n]() mutable {
    for (size_t r = 0; r < outs.size(); r++)
      outs[r].copy_(flat.narrow(0, static_cast<int64_t>(r) * n, n).view(outs[r].sizes()));
  };
  return issueOne(work, call, false, [&](weft_request **req) {
    return weft_iallgather(comm_, in.data_ptr(), flat.data_ptr(), w.count, w.dtype, req);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::_allgather_base(at::Tensor &output,
                                                                 at::Tensor &input,
                                                                 const c10d::AllgatherOptions &) {
  const char *call = "allgather_into_tensor";
  checkTensor(call, input);
  checkTensor(call, output);
  checkSame(call, input, output, "the output");
  TORCH_CHECK(output.numel() == getSize() * input.numel(), "weft: ", call, ": the output has ",
              output.numel(), " elements; it must have ranks (", getSize(), ") x input (",
              input.numel(), ")");
  Wire w = moveWire(input);
  auto work = newWork(c10d::OpType::_ALLGATHER_BASE, call, {output});
  work->keep = {input, output};
  return issueOne(work, call, false, [&](weft_request **req) {
    return weft_iallgather(comm_, input.data_ptr(), output.data_ptr(), w.count, w.dtype, req);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::gather(
    std::vector<std::vector<at::Tensor>> &outputs, std::vector<at::Tensor> &inputs,
    const c10d::GatherOptions &opts) {
  const char *call = "gather";
  const at::Tensor &in = single(call, inputs);
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(root >= 0 && root < getSize(), "weft: ", call, ": root ", root,
              " is not a rank of the group (size ", getSize(), ")");
  Wire w = moveWire(in);
  const int64_t n = in.numel();
  std::vector<at::Tensor> outs;
  at::Tensor flat;
  if (getRank() == root) {
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
                "weft: ", call, ": the root needs one list of ", getSize(), " output tensors");
    outs = outputs[0];
    for (const auto &o : outs) {
      checkSame(call, in, o, "an output tensor");
      TORCH_CHECK(o.numel() == n, "weft: ", call, ": an output tensor has ", o.numel(),
                  " elements, the input ", n);
    }
    flat = at::empty({getSize() * n}, in.options());
  } else {
    TORCH_CHECK(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()), "weft: ", call,
                ": only the root passes output tensors");
  }
  auto work = newWork(c10d::OpType::GATHER, call, outs);
  work->keep = {in};
  if (flat.defined()) {
    work->keep.push_back(flat);
    work->after = [flat, outs, n]() mutable {
      for (size_t r = 0; r < outs.size(); r++)
        outs[r].copy_(flat.narrow(0, static_cast<int64_t>(r) * n, n).view(outs[r].sizes()));
    };
  }
  return issueOne(work, call, false, [&](weft_request **req) {
    return weft_igather(comm_, in.data_ptr(), flat.defined() ? flat.data_ptr() : nullptr, w.count,
                        w.dtype, root, req);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::scatter(
    std::vector<at::Tensor> &outputs, std::vector<std::vector<at::Tensor>> &inputs,
    const c10d::ScatterOptions &opts) {
  const char *call = "scatter";
  const at::Tensor &out = single(call, outputs);
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(root >= 0 && root < getSize(), "weft: ", call, ": root ", root,
              " is not a rank of the group (size ", getSize(), ")");
  Wire w = moveWire(out);
  at::NoGradGuard no_grad;
  at::Tensor flat;
  if (getRank() == root) {
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                "weft: ", call, ": the root needs one list of ", getSize(), " input tensors");
    flat = stack(call, inputs[0], out, "the input list");
  } else {
    TORCH_CHECK(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()), "weft: ", call,
                ": only the root passes input tensors");
  }
  auto work = newWork(c10d::OpType::SCATTER, call, outputs);
  work->keep = {out};
  if (flat.defined()) work->keep.push_back(flat);
  return issueOne(work, call, false, [&](weft_request **req) {
    return weft_iscatter(comm_, flat.defined() ? flat.data_ptr() : nullptr, out.data_ptr(), w.count,
                         w.dtype, root, req);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::reduce_scatter(
    std::vector<at::Tensor> &outputs, std::vector<std::vector<at::Tensor>> &inputs,
    const c10d::ReduceScatterOptions &opts) {
  const char *call = "reduce_scatter";
  const at::Tensor &out = single(call, outputs);
  Wire w = reduceWire(call, out);
  Reduction red = reductionOf(call, opts.reduceOp, out);
  TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(), "weft: ", call,
              ": needs one list of ", getSize(), " input tensors");
  at::NoGradGuard no_grad;
  at::Tensor flat = stack(call, inputs[0], out, "the input list", red);
  auto work = newWork(c10d::OpType::REDUCE_SCATTER, call, outputs);
  work->keep = {out, flat};
  return issueOne(work, call, false, [&](weft_request **req) {
    return weft_ireduce_scatter(comm_, flat.data_ptr(), out.data_ptr(), w.count, w.dtype, red.op, req);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::_reduce_scatter_base(
    at::Tensor &output, at::Tensor &input, const c10d::ReduceScatterOptions &opts) {
  const char *call = "reduce_scatter_tensor";
  checkTensor(call, input);
  checkTensor(call, output);
  checkSame(call, input, output, "the output");
  Wire w = reduceWire(call, output);
  Reduction red = reductionOf(call, opts.reduceOp, output);
  TORCH_CHECK(input.numel() == getSize() * output.numel(), "weft: ", call, ": the input has ",
              input.numel(), " elements; it must have ranks (", getSize(), ") x output (",
              output.numel(), ")");
  auto work = newWork(c10d::OpType::_REDUCE_SCATTER_BASE, call, {output});
  at::Tensor in = input;
  if (red.premul) {  // the input stays as it is: the scaled copy is sent
    at::NoGradGuard no_grad;
    in = red.scaled(input);
  }
  work->keep = {in, output};
  return issueOne(work, call, false, [&](weft_request **req) {
    return weft_ireduce_scatter(comm_, in.data_ptr(), output.data_ptr(), w.count, w.dtype, red.op, req);
  });
}

#if WEFT_TORCH_COALESCED_TENSORS
namespace {

// A tensor of this many bytes or more goes as a call of its own, straight
// between its input and output; smaller ones share one call, packed: a copy in
// and out costs less than a call of their own (a few microseconds each over
// shared memory, more over tcp), and FSDP2 and DTensor send many small ones.
constexpr size_t kOwnCallBytes = size_t{64} << 10;

// One pair of a coalesced call, checked: index, input, output.
struct Pair {
  size_t index;
  at::Tensor in, out;
};

// The checks both coalesced calls make: as many outputs as inputs, each pair
// alike (dtype, device) and every pair on one device; `outPerIn`: the output's
// elements over the input's (ranks for allgather; its inverse for
// reduce-scatter is given as inPerOut).
std::vector<Pair> pairsOf(const char *call, std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs,
                          int64_t outPerIn, int64_t inPerOut) {
  TORCH_CHECK(outputs.size() == inputs.size(), "weft: ", call, ": ", inputs.size(), " inputs but ",
              outputs.size(), " outputs");
  std::vector<Pair> pairs;
  for (size_t i = 0; i < inputs.size(); i++) {
    const at::Tensor &in = inputs[i], &out = outputs[i];
    checkTensor(call, in);
    checkTensor(call, out);
    checkSame(call, in, out, "the output");
    TORCH_CHECK(in.device() == inputs[0].device(), "weft: ", call, ": tensors on ", inputs[0].device(), " and ",
                in.device(), " in one call");
    TORCH_CHECK(out.numel() * inPerOut == in.numel() * outPerIn, "weft: ", call, ": output ", i, " has ",
                out.numel(), " elements and input ", i, " ", in.numel(), "; ",
                outPerIn > 1 ? "the output must have ranks (" : "the input must have ranks (",
                std::max(outPerIn, inPerOut), outPerIn > 1 ? ") x input" : ") x output");
    pairs.push_back({i, in, out});
  }
  return pairs;
}

}  // namespace

// Each small pair's bytes packed into one buffer, gathered once, and copied
// out of it; each large pair gathered on its own, straight into its output.
// The packed call moves bytes, so pairs of any dtypes share it.
c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::allgather_into_tensor_coalesced(
    std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs, const c10d::AllgatherOptions &) {
  const char *call = "allgather_into_tensor_coalesced";
  const int64_t size = getSize();
  std::vector<Pair> pairs = pairsOf(call, outputs, inputs, size, 1);
  auto work = newWork(c10d::OpType::COALESCED, call, outputs);
  std::vector<std::function<weft_status(weft_request **)>> starts;
  std::vector<Pair> packed;
  int64_t packed_bytes = 0;
  for (const Pair &p : pairs) {
    if (p.in.nbytes() == 0) continue;
    if (p.in.nbytes() >= kOwnCallBytes) {
      Wire w = moveWire(p.in);
      at::Tensor in = p.in, out = p.out;
      work->keep.insert(work->keep.end(), {in, out});
      starts.push_back([this, in, out, w](weft_request **req) {
        return weft_iallgather(comm_, in.data_ptr(), out.data_ptr(), w.count, w.dtype, req);
      });
    } else {
      packed.push_back(p);
      packed_bytes += static_cast<int64_t>(p.in.nbytes());
    }
  }
  if (!packed.empty()) {
    at::NoGradGuard no_grad;
    auto bytes = at::TensorOptions().dtype(at::kByte).device(packed[0].in.device());
    at::Tensor send = at::empty({packed_bytes}, bytes);
    at::Tensor recv = at::empty({size, packed_bytes}, bytes);
    std::vector<std::pair<at::Tensor, int64_t>> outs;  // output, offset in a rank's block
    int64_t off = 0;
    for (const Pair &p : packed) {
      const int64_t n = static_cast<int64_t>(p.in.nbytes());
      send.narrow(0, off, n).copy_(p.in.reshape({-1}).view(at::kByte));
      outs.emplace_back(p.out, off);
      off += n;
    }
    work->keep.insert(work->keep.end(), {send, recv});
    work->after = [recv, outs, size]() mutable {
      for (auto &o : outs) {
        const int64_t n = static_cast<int64_t>(o.first.nbytes()) / size;
        o.first.reshape({-1}).view(at::kByte).view({size, n}).copy_(recv.narrow(1, o.second, n));
      }
    };
    starts.push_back([this, send, recv, packed_bytes](weft_request **req) {
      return weft_iallgather(comm_, send.data_ptr(), recv.data_ptr(), static_cast<size_t>(packed_bytes), WEFT_U8,
                             req);
    });
  }
  return issueMany(work, call, inputs.empty() ? at::Tensor() : inputs[0], starts);
}

// Small pairs of one dtype share one call: each rank's block of every input
// packed side by side (PREMUL_SUM's multiply in the same pass), reduced and
// scattered once, and copied out; large pairs go on their own.
c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor> &outputs, std::vector<at::Tensor> &inputs, const c10d::ReduceScatterOptions &opts) {
  const char *call = "reduce_scatter_tensor_coalesced";
  const int64_t size = getSize();
  std::vector<Pair> pairs = pairsOf(call, outputs, inputs, 1, size);
  std::vector<Wire> wires;  // each output's; refuses a dtype weft cannot reduce, before any work
  std::vector<Reduction> reds;
  for (const Pair &p : pairs) {
    wires.push_back(reduceWire(call, p.out));
    reds.push_back(reductionOf(call, opts.reduceOp, p.in));
  }
  auto work = newWork(c10d::OpType::COALESCED, call, outputs);
  std::vector<std::function<weft_status(weft_request **)>> starts;
  at::NoGradGuard no_grad;
  // packed groups by dtype, in the order their first pair comes (the same on every rank)
  std::vector<std::vector<size_t>> groups;
  for (size_t i = 0; i < pairs.size(); i++) {
    const Pair &p = pairs[i];
    if (p.out.numel() == 0) continue;
    Wire w = wires[i];
    if (p.in.nbytes() >= kOwnCallBytes) {
      at::Tensor in = reds[i].premul ? reds[i].scaled(p.in) : p.in, out = p.out;
      weft_op op = reds[i].op;
      work->keep.insert(work->keep.end(), {in, out});
      starts.push_back([this, in, out, w, op](weft_request **req) {
        return weft_ireduce_scatter(comm_, in.data_ptr(), out.data_ptr(), w.count, w.dtype, op, req);
      });
      continue;
    }
    auto g = std::find_if(groups.begin(), groups.end(),
                          [&](const std::vector<size_t> &g) { return pairs[g[0]].in.scalar_type() == p.in.scalar_type(); });
    if (g == groups.end())
      groups.push_back({i});
    else
      g->push_back(i);
  }
  for (const auto &g : groups) {
    int64_t total = 0;
    for (size_t i : g) total += pairs[i].out.numel();
    const at::Tensor &like = pairs[g[0]].in;
    at::Tensor send = at::empty({size, total}, like.options());
    at::Tensor recv = at::empty({total}, like.options());
    std::vector<std::pair<at::Tensor, int64_t>> outs;
    int64_t off = 0;
    for (size_t i : g) {
      const int64_t n = pairs[i].out.numel();
      reds[i].scaleInto(send.narrow(1, off, n), pairs[i].in.reshape({size, n}));
      outs.emplace_back(pairs[i].out, off);
      off += n;
    }
    Wire w = reduceWire(call, recv);
    weft_op op = reds[g[0]].op;
    work->keep.insert(work->keep.end(), {send, recv});
    auto before = work->after;
    work->after = [before, recv, outs]() mutable {
      if (before) before();
      for (auto &o : outs) o.first.view({-1}).copy_(recv.narrow(0, o.second, o.first.numel()));
    };
    starts.push_back([this, send, recv, w, op](weft_request **req) {
      return weft_ireduce_scatter(comm_, send.data_ptr(), recv.data_ptr(), w.count, w.dtype, op, req);
    });
  }
  return issueMany(work, call, inputs.empty() ? at::Tensor() : inputs[0], starts);
}
#endif

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::alltoall_base(at::Tensor &output,
                                                               at::Tensor &input,
                                                               std::vector<int64_t> &outputSplits,
                                                               std::vector<int64_t> &inputSplits,
                                                               const c10d::AllToAllOptions &) {
  const char *call = "alltoall_base";
  checkTensor(call, input);
  checkTensor(call, output);
  checkSame(call, input, output, "the output");
  const int64_t size = getSize();
  TORCH_CHECK(input.numel() == output.numel(), "weft: ", call, ": the input has ", input.numel(),
              " elements, the output ", output.numel());
  // weft's alltoall moves equal blocks: split sizes are accepted when they say so
  for (auto *splits : {&inputSplits, &outputSplits}) {
    if (splits->empty()) continue;
    bool equal = static_cast<int64_t>(splits->size()) == size;
    for (int64_t s : *splits) equal = equal && s == (*splits)[0];
    TORCH_CHECK(equal, "weft: ", call, ": unequal split sizes ", c10::IntArrayRef(*splits),
                " are not supported (weft's alltoall moves equal blocks); pass equal ones or none");
  }
  TORCH_CHECK(input.dim() > 0 && input.size(0) % size == 0, "weft: ", call,
              ": the input's first dimension (", input.dim() ? input.size(0) : 0,
              ") does not split into ", size, " equal blocks");
  TORCH_CHECK(input.data_ptr() != output.data_ptr() || input.numel() == 0, "weft: ", call,
              ": the input and output must be different tensors");
  Wire w = moveWire(input);
  auto work = newWork(c10d::OpType::ALLTOALL_BASE, call, {output});
  work->keep = {input, output};
  return issueOne(work, call, false, [&](weft_request **req) {
    return weft_ialltoall(comm_, input.data_ptr(), output.data_ptr(), w.count / size, w.dtype, req);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::alltoall(std::vector<at::Tensor> &outputs,
                                                          std::vector<at::Tensor> &inputs,
                                                          const c10d::AllToAllOptions &) {
  const char *call = "alltoall";
  TORCH_CHECK(
      static_cast<int>(inputs.size()) == getSize() && static_cast<int>(outputs.size()) == getSize(),
      "weft: ", call, ": needs ", getSize(), " input and output tensors, got ", inputs.size(),
      " and ", outputs.size());
  const at::Tensor &like = inputs[0];
  checkTensor(call, like);
  at::NoGradGuard no_grad;
  at::Tensor in = stack(call, inputs, like, "the input list");
  for (const auto &o : outputs) {
    checkSame(call, like, o, "an output tensor");
    TORCH_CHECK(o.numel() == like.numel(), "weft: ", call,
                ": every block must have the same size (weft's alltoall moves equal blocks); "
                "an output has ",
                o.numel(), " elements, the first input ", like.numel());
  }
  at::Tensor out = at::empty_like(in);
  Wire w = moveWire(like);
  auto work = newWork(c10d::OpType::ALLTOALL, call, outputs);
  work->keep = {in, out};
  const int64_t n = like.numel();
  std::vector<at::Tensor> outs = outputs;
  work->after = [out, outs, n]() mutable {
    for (size_t r = 0; r < outs.size(); r++)
      outs[r].copy_(out.narrow(0, static_cast<int64_t>(r) * n, n).view(outs[r].sizes()));
  };
  return issueOne(work, call, false, [&](weft_request **req) {
    return weft_ialltoall(comm_, in.data_ptr(), out.data_ptr(), w.count, w.dtype, req);
  });
}

// ---- point to point ------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::send(std::vector<at::Tensor> &tensors, int dstRank,
                                                      int tag) {
  const char *call = "send";
  // CUDA tensors too (torch 2.2 on): weft stages the message through pinned
  // memory after the work queued on torch's stream; the work completes with
  // the data in place (weft.h)
  const at::Tensor &t = single(call, tensors);
  TORCH_CHECK(tag >= 0, "weft: ", call, ": tag ", tag, " is negative");
  Wire w = moveWire(t);
  auto work = newWork(c10d::OpType::SEND, call, tensors);
  work->keep = {t};
  return issueOne(work, call, true, [&](weft_request **req) {
    return weft_isend(comm_, t.data_ptr(), w.count, w.dtype, dstRank, tag, req);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::recv(std::vector<at::Tensor> &tensors, int srcRank,
                                                      int tag) {
  const char *call = "recv";
  // CUDA tensors too (torch 2.2 on): weft stages the message through pinned
  // memory after the work queued on torch's stream; the work completes with
  // the data in place (weft.h)
  const at::Tensor &t = single(call, tensors);
  TORCH_CHECK(tag >= 0, "weft: ", call, ": tag ", tag, " is negative");
  Wire w = moveWire(t);
  auto work = newWork(c10d::OpType::RECV, call, tensors);
  work->keep = {t};
  return issueOne(work, call, true, [&](weft_request **req) {
    return weft_irecv(comm_, t.data_ptr(), w.count, w.dtype, srcRank, tag, req);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::recvAnysource(std::vector<at::Tensor> &, int) {
  TORCH_CHECK(false,
              "weft: recv from any source is not supported: a weft receive names its "
              "peer (pass src=)");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupWeft::barrier(const c10d::BarrierOptions &) {
  const char *call = "barrier";
  auto work = newWork(c10d::OpType::BARRIER, call, {});
  return issueOne(work, call, false, [&](weft_request **req) { return weft_ibarrier(comm_, req); });
}

}  // namespace weft_torch

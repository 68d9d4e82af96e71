/* ibv_emu.c - a loopback emulator of the verbs calls weft makes, for tests on
 * machines without an RDMA NIC. Built as a shared library that exports the
 * libibverbs symbols (same names and versions), loaded through WEFT_IB_LIBRARY;
 * never part of the library build.
 *
 * The fabric crosses processes: each process keeps its queue pairs, CQs and
 * memory regions in a memfd (no name in any file system, so nothing is ever
 * left behind) that peers map through /proc/<pid>/fd. A port's LID (InfiniBand)
 * or GID (RoCE) names the owning process. The NIC's work is done by the
 * sender's process when it posts or polls: an RDMA write moves the bytes into
 * the target process with process_vm_writev after checking the rkey, the range
 * and the access flags, consumes a posted receive for an immediate, and pushes
 * the receive completion into the target's CQ.
 *
 * RC semantics enforced: the QP state machine with the attribute masks of
 * ibv_modify_qp(3); lkey/rkey, range and access checks; receiver-not-ready
 * retries then IBV_WC_RNR_RETRY_EXC_ERR; unreachable peers retried then
 * IBV_WC_RETRY_EXC_ERR; unsignaled sends make no completion and hold their
 * send-queue slot until a later signaled completion is polled; CQ overrun;
 * an error moves the QP to ERR and flushes everything after it; send-queue
 * depth and inline limits; order only within a QP. RDMA READ: the responder
 * QP needs IBV_ACCESS_REMOTE_READ and the rkey's MR REMOTE_READ (else a remote
 * access error, both ends to ERR), the local MR LOCAL_WRITE; it consumes no
 * receive. A QP may be connected to a QP of its own process, or to itself
 * (NCCL's flush QP): the same rules, with plain copies.
 *
 * GPUDirect RDMA: ibv_reg_dmabuf_mr registers device addresses [iova,
 * iova+length) that the host cannot touch (in weft's CUDA stand-in they are
 * PROT_NONE). The owner maps the dma-buf fd (its memory is what the GPU sees)
 * and keeps that alias's address in the shared MR record, so whichever
 * process executes a work request reaches the bytes by the owner's pid at
 * alias addresses, never at iova. Real hardware does not make the NIC's
 * writes into GPU memory visible to the GPU until a flush (a read through
 * the NIC; NCCL posts one on a loopback QP before the GPU consumes a
 * receive), and the emulator keeps that rule so a missing flush shows: an
 * RDMA write or a send landing in a dma-buf MR goes to the MR's pending
 * buffer (anonymous memory in the owner), its range recorded in a short list
 * in the shared record (merged when overlapping or adjacent; when full, the
 * oldest is applied early: visible early is allowed, stale after a flush
 * never). An RDMA READ whose rkey is a dma-buf MR applies all of that MR's
 * pending ranges first; so does any other use of the MR by the NIC (its
 * reads see its own writes) and deregistration (the bytes arrive in the
 * end). The receive completion of a write with immediate comes at once: the
 * CPU sees it before the GPU sees the data.
 *
 * Threads: like libibverbs, every call is safe from any thread, and different
 * contexts are driven by different threads at once (weft runs one progress
 * thread per communicator). The NIC's work for *every* QP of the process is
 * done by whichever thread polls, so a QP's send queue is touched by its owner
 * (posting) and by other threads (executing): each QP has its own lock, and
 * the tables of this process's objects have theirs (see emu_qp_grab).
 *
 * IBV_EMU_CONFIG (comma-separated): devices=N (default 1), enosys (the device
 * list fails like a kernel without RDMA), link=ib|eth (default eth), mtu=BYTES,
 * max_inline=BYTES, delay_us=N (a send executes N us after posting),
 * reorder (queue pairs are served in random order), fail_wr=N (the N-th
 * executed work request of this process fails), fail_status=N (its
 * ibv_wc_status, default retry exceeded), retry_ms=N (pause between retries),
 * no_dmabuf (ibv_reg_dmabuf_mr fails with EOPNOTSUPP, as on a NIC or kernel
 * without dma-buf support, so callers can test their fall-back). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "ibv_emu.h"

#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr

#define EMU_EXPORT __attribute__((visibility("default")))
#define EMU_MAGIC 0x454d5556u /* "EMUV" */
#define EMU_MAX_QP 256
#define EMU_MAX_CQ 128
#define EMU_MAX_MR 1024
#define EMU_MAX_RQ 256
#define EMU_MAX_SQ 1024
#define EMU_MAX_CQE 4096
#define EMU_MAX_SGE 4
#define EMU_MAX_EVENTS 64
#define EMU_MAX_DEVICES 4
#define EMU_MAX_REMOTES 128
#define EMU_GIDS_ETH 4
#define EMU_MAX_DIRTY 8 /* pending ranges a dma-buf MR records before applying early */

/* ---- the shared region: what peers may read and change ------------------------ */

typedef struct emu_sge {
  uint64_t addr;
  uint32_t length, lkey;
} emu_sge;

typedef struct emu_rwqe {
  uint64_t wr_id;
  int num_sge;
  emu_sge sge[EMU_MAX_SGE];
} emu_rwqe;

typedef struct emu_qp_sh {
  int in_use;
  uint32_t qpn;
  enum ibv_qp_state state;
  uint32_t pd_id;
  int send_cq, recv_cq;
  int port, access;
  uint32_t max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline;
  /* path, from INIT -> RTR -> RTS */
  uint32_t dest_pid, dest_qpn;
  enum ibv_mtu mtu;
  uint8_t timeout, retry_cnt, rnr_retry, min_rnr_timer;
  uint32_t sq_psn, rq_psn;
  /* receive queue: peers consume, the owner posts */
  uint32_t rq_head, rq_tail, rq_high; /* rq_high: most receives ever posted at once */
  emu_rwqe rq[EMU_MAX_RQ];
} emu_qp_sh;

typedef struct emu_cq_sh {
  int in_use;
  int cqe;
  uint32_t head, tail;
  int overrun;
  struct ibv_wc wc[EMU_MAX_CQE];
} emu_cq_sh;

typedef struct emu_range {
  uint64_t off, len; /* from the MR's start */
} emu_range;

typedef struct emu_mr_sh {
  int in_use;
  uint32_t key, pd_id;
  uint64_t addr, length; /* a dma-buf MR: the device addresses, never touched */
  int access;
  /* a dma-buf MR: the owner's addresses of its bytes, for whichever process
   * executes; the dirty list under the region lock, oldest first */
  int dmabuf;
  uint64_t alias;   /* the dma-buf's memory (what the GPU sees) at addr's place */
  uint64_t pending; /* what the NIC wrote and the GPU does not see yet */
  uint32_t ndirty;
  emu_range dirty[EMU_MAX_DIRTY];
} emu_mr_sh;

typedef struct emu_event {
  enum ibv_event_type type;
  int qp, cq; /* indices, -1 when not about one */
} emu_event;

typedef struct emu_region {
  uint32_t magic, pid;
  pthread_mutex_t lock; /* robust and process-shared: a peer may die holding it */
  uint32_t generation;
  uint32_t ev_head, ev_tail;
  emu_event ev[EMU_MAX_EVENTS];
  uint32_t max_rq_deficit;
  uint64_t recv_landed;
  emu_mr_sh mr[EMU_MAX_MR];
  emu_qp_sh qp[EMU_MAX_QP];
  emu_cq_sh cq[EMU_MAX_CQ];
} emu_region;

/* ---- this process's side ---------------------------------------------------------- */

typedef struct emu_swqe {
  uint64_t wr_id;
  enum ibv_wr_opcode opcode;
  unsigned int flags;
  uint32_t imm;
  uint64_t raddr;
  uint32_t rkey;
  int num_sge;
  emu_sge sge[EMU_MAX_SGE];
  uint32_t inline_len;
  uint8_t *inline_data; /* owned copy when IBV_SEND_INLINE */
  double ready_at;
} emu_swqe;

typedef struct emu_qp {
  struct ibv_qp qp; /* first: the library hands out &qp */
  int idx;
  /* Guards everything below: the owner posts while any polling thread may
   * execute. Without it two threads ran the same work request twice (a
   * chunk written twice, outside the receiver's credits) or lost a post
   * (sq_count++ racing sq_count--). Taken before any region lock. */
  pthread_mutex_t sq_lock;
  emu_swqe *sq;    /* posted, not yet executed (ring of sq_cap) */
  uint32_t sq_cap; /* max_send_wr */
  uint32_t sq_head, sq_count;
  uint32_t outstanding; /* posted and not yet freed by a polled completion */
  uint32_t unsignaled;  /* executed without a completion since the last one */
  uint32_t *batches;    /* per completion generated: send-queue slots it frees */
  uint32_t b_head, b_count;
  int retries, rnr_retries;
  double next_try;
} emu_qp;

typedef struct emu_mr {
  struct ibv_mr mr; /* first: the library hands out &mr */
  void *map;        /* a dma-buf MR: the fd mapped from the page floor of its offset */
  size_t map_len;
  void *pending; /* and its pending buffer, mr.length bytes */
} emu_mr;

typedef struct emu_cq {
  struct ibv_cq cq;
  int idx;
} emu_cq;

typedef struct emu_pd {
  struct ibv_pd pd;
  uint32_t id;
} emu_pd;

typedef struct emu_ctx {
  struct ibv_context ctx;
  int dev;
  int event_signaled;
} emu_ctx;

typedef struct emu_config {
  int devices, enosys, link_ib, mtu, max_inline, delay_us, reorder, fail_wr, fail_status, retry_ms;
  int no_dmabuf;
} emu_config;

static struct {
  pid_t pid; /* owner of what follows: a forked child starts afresh */
  int memfd;
  emu_region *region;
  emu_config cfg;
  emu_qp *qps[EMU_MAX_QP];
  struct ibv_mr *mrs[EMU_MAX_MR]; /* what the caller holds, also reachable from here */
  emu_cq *cqs[EMU_MAX_CQ];
  struct {
    uint32_t pid;
    emu_region *region;
  } remotes[EMU_MAX_REMOTES];
  int nremotes;
  uint32_t next_pd;
  uint64_t executed;
  ibv_emu_counters stats;
  struct ibv_device devices[EMU_MAX_DEVICES];
  struct ibv_device *list[EMU_MAX_DEVICES + 1];
} emu;

/* emu_local_lock guards setup and the tables qps[], cqs[], mrs[]; a thread
 * that finds a QP in qps[] locks the QP before letting go of the table, so
 * ibv_destroy_qp (which removes it under the table lock, then waits for the
 * QP's lock) never frees a QP another thread is executing. Never taken while
 * holding a QP's lock or a region lock. emu_remote_lock guards remotes[] and
 * is taken inside a QP's lock, never around anything else. */
static pthread_mutex_t emu_local_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t emu_remote_lock = PTHREAD_MUTEX_INITIALIZER;

/* Counters are bumped by every thread. */
#define EMU_COUNT(field, n) __atomic_fetch_add(&emu.stats.field, (n), __ATOMIC_RELAXED)
#define EMU_UNCOUNT(field, n) __atomic_fetch_sub(&emu.stats.field, (n), __ATOMIC_RELAXED)

static double emu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t emu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void emu_read_config(void) {
  emu_config c = {.devices = 1,
                  .mtu = 4096,
                  .max_inline = 64,
                  .fail_status = IBV_WC_RETRY_EXC_ERR,
                  .retry_ms = 2};
  const char *env = getenv("IBV_EMU_CONFIG");
  char buf[512];
  snprintf(buf, sizeof buf, "%s", env ? env : "");
  for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(tok, '=');
    int v = eq ? atoi(eq + 1) : 1;
    if (eq) *eq = 0;
    if (!strcmp(tok, "devices"))
      c.devices = v < 0 ? 0 : v > EMU_MAX_DEVICES ? EMU_MAX_DEVICES : v;
    else if (!strcmp(tok, "enosys"))
      c.enosys = 1;
    else if (!strcmp(tok, "link"))
      c.link_ib = eq && !strcmp(eq + 1, "ib");
    else if (!strcmp(tok, "mtu"))
      c.mtu = v;
    else if (!strcmp(tok, "max_inline"))
      c.max_inline = v;
    else if (!strcmp(tok, "delay_us"))
      c.delay_us = v;
    else if (!strcmp(tok, "reorder"))
      c.reorder = 1;
    else if (!strcmp(tok, "fail_wr"))
      c.fail_wr = v;
    else if (!strcmp(tok, "fail_status"))
      c.fail_status = v;
    else if (!strcmp(tok, "retry_ms"))
      c.retry_ms = v;
    else if (!strcmp(tok, "no_dmabuf"))
      c.no_dmabuf = 1;
  }
  emu.cfg = c;
}

static enum ibv_mtu emu_mtu_enum(int bytes) {
  return bytes >= 4096   ? IBV_MTU_4096
         : bytes >= 2048 ? IBV_MTU_2048
         : bytes >= 1024 ? IBV_MTU_1024
         : bytes >= 512  ? IBV_MTU_512
                         : IBV_MTU_256;
}

static void emu_lock(emu_region *r) {
  int rc = pthread_mutex_lock(&r->lock);
  if (rc == EOWNERDEAD) pthread_mutex_consistent(&r->lock);
}
static void emu_unlock(emu_region *r) {
  pthread_mutex_unlock(&r->lock);
}

/* The memfd region of this process, made on first use (and again in a
 * forked child, whose queue pairs are its own). */
static int emu_setup(void) {
  if (emu.region && emu.pid == getpid()) return 0;
  if (emu.region) { /* a forked child: the parent's objects are not ours */
    munmap(emu.region, sizeof *emu.region);
    close(emu.memfd);
    for (int i = 0; i < emu.nremotes; i++) munmap(emu.remotes[i].region, sizeof(emu_region));
    memset(emu.qps, 0, sizeof emu.qps);
    memset(emu.cqs, 0, sizeof emu.cqs);
    memset(emu.mrs, 0, sizeof emu.mrs);
    emu.nremotes = 0;
    emu.region = NULL;
  }
  emu_read_config();
  memset(&emu.stats, 0, sizeof emu.stats);
  emu.executed = 0;
  /* peers write our memory with process_vm_writev: Yama must allow it */
  prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  int fd = memfd_create("weft-ibv-emu", MFD_CLOEXEC);
  if (fd < 0) return -1;
  if (ftruncate(fd, sizeof(emu_region))) {
    close(fd);
    return -1;
  }
  emu_region *r = mmap(NULL, sizeof *r, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (r == MAP_FAILED) {
    close(fd);
    return -1;
  }
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&r->lock, &a);
  pthread_mutexattr_destroy(&a);
  r->pid = (uint32_t)getpid();
  r->generation = (uint32_t)getpid() & 0xff;
  r->magic = EMU_MAGIC;
  emu.pid = getpid();
  emu.memfd = fd;
  emu.region = r;
  return 0;
}

/* A peer's region, mapped through /proc/<pid>/fd; NULL when it is gone. */
static emu_region *emu_remote_locked(uint32_t pid);
static emu_region *emu_remote(uint32_t pid) {
  if (pid == (uint32_t)getpid()) return emu.region;
  pthread_mutex_lock(&emu_remote_lock);
  emu_region *r = emu_remote_locked(pid);
  pthread_mutex_unlock(&emu_remote_lock);
  return r;
}
static emu_region *emu_remote_locked(uint32_t pid) {
  for (int i = 0; i < emu.nremotes; i++)
    if (emu.remotes[i].pid == pid) return emu.remotes[i].region;
  if (emu.nremotes == EMU_MAX_REMOTES) return NULL;
  char dir[64];
  snprintf(dir, sizeof dir, "/proc/%u/fd", pid);
  DIR *d = opendir(dir);
  if (!d) return NULL;
  emu_region *found = NULL;
  for (struct dirent *e; !found && (e = readdir(d));) {
    char path[320], link[128] = "";
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n <= 0 || !strstr(link, "memfd:weft-ibv-emu")) continue;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) continue;
    void *p = mmap(NULL, sizeof(emu_region), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) continue;
    emu_region *r = p;
    if (r->magic == EMU_MAGIC && r->pid == pid)
      found = r;
    else
      munmap(p, sizeof(emu_region));
  }
  closedir(d);
  if (found) {
    emu.remotes[emu.nremotes].pid = pid;
    emu.remotes[emu.nremotes].region = found;
    emu.nremotes++;
  }
  return found;
}

/* GIDs and LIDs name the process: pid in the last three bytes. */
static void emu_gid(uint32_t pid, int index, union ibv_gid *gid) {
  memset(gid, 0, sizeof *gid);
  if (index < 2) {
    gid->raw[0] = 0xfe;
    gid->raw[1] = 0x80;
  } else {
    gid->raw[10] = 0xff;
    gid->raw[11] = 0xff;
    gid->raw[12] = 10;
  }
  gid->raw[13] = (uint8_t)(pid >> 16);
  gid->raw[14] = (uint8_t)(pid >> 8);
  gid->raw[15] = (uint8_t)pid;
}
static int emu_gid_roce_v2(int index) {
  return index % 2;
}

/* ---- device, port, PD ------------------------------------------------------------ */

EMU_EXPORT struct ibv_device **ibv_get_device_list(int *num) {
  pthread_mutex_lock(&emu_local_lock);
  int rc = emu_setup();
  if (rc || emu.cfg.enosys) {
    errno = rc ? errno : ENOSYS;
    pthread_mutex_unlock(&emu_local_lock);
    return NULL;
  }
  for (int i = 0; i < emu.cfg.devices; i++) {
    struct ibv_device *d = &emu.devices[i];
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "emu%d", i);
    snprintf(d->dev_name, sizeof d->dev_name, "uverbs%d", i);
    d->node_type = IBV_NODE_CA;
    d->transport_type = IBV_TRANSPORT_IB;
    emu.list[i] = d;
  }
  emu.list[emu.cfg.devices] = NULL;
  if (num) *num = emu.cfg.devices;
  pthread_mutex_unlock(&emu_local_lock);
  return emu.list;
}

EMU_EXPORT void ibv_free_device_list(struct ibv_device **list) {
  (void)list;
}
EMU_EXPORT const char *ibv_get_device_name(struct ibv_device *d) {
  return d->name;
}

static int emu_data_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
static int emu_data_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
static int emu_data_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);

EMU_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *d) {
  pthread_mutex_lock(&emu_local_lock);
  int rc = emu_setup();
  pthread_mutex_unlock(&emu_local_lock);
  if (rc) return NULL;
  emu_ctx *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->ctx.device = d;
  c->dev = (int)(d - emu.devices);
  c->ctx.async_fd = eventfd(0, EFD_CLOEXEC);
  c->ctx.num_comp_vectors = 1;
  c->ctx.ops.poll_cq = emu_data_poll_cq;
  c->ctx.ops.post_send = emu_data_post_send;
  c->ctx.ops.post_recv = emu_data_post_recv;
  pthread_mutex_init(&c->ctx.mutex, NULL);
  return &c->ctx;
}

EMU_EXPORT int ibv_close_device(struct ibv_context *ctx) {
  close(ctx->async_fd);
  free(ctx);
  return 0;
}

EMU_EXPORT int ibv_query_device(struct ibv_context *ctx, struct ibv_device_attr *a) {
  (void)ctx;
  memset(a, 0, sizeof *a);
  snprintf(a->fw_ver, sizeof a->fw_ver, "weft-emu");
  a->max_qp = EMU_MAX_QP;
  a->max_qp_wr = EMU_MAX_SQ;
  a->max_sge = EMU_MAX_SGE;
  a->max_cq = EMU_MAX_CQ;
  a->max_cqe = EMU_MAX_CQE;
  a->max_mr = EMU_MAX_MR;
  a->max_pd = 1 << 20;
  a->phys_port_cnt = 1;
  return 0;
}

EMU_EXPORT int ibv_query_port(struct ibv_context *ctx, uint8_t port,
                              struct _compat_ibv_port_attr *out) {
  (void)ctx;
  if (port != 1) return EINVAL;
  struct ibv_port_attr a = {0};
  a.state = IBV_PORT_ACTIVE;
  a.max_mtu = IBV_MTU_4096;
  a.active_mtu = emu_mtu_enum(emu.cfg.mtu);
  a.gid_tbl_len = emu.cfg.link_ib ? 1 : EMU_GIDS_ETH;
  a.max_msg_sz = 1u << 30;
  a.pkey_tbl_len = 1;
  a.lid = emu.cfg.link_ib ? (uint16_t)getpid() : 0;
  a.sm_lid = emu.cfg.link_ib ? 1 : 0;
  a.active_width = 2;
  a.active_speed = 32;
  a.phys_state = 5;
  a.link_layer = emu.cfg.link_ib ? IBV_LINK_LAYER_INFINIBAND : IBV_LINK_LAYER_ETHERNET;
  /* callers of the 1.1 symbol may pass the older, shorter struct */
  memcpy(out, &a, offsetof(struct ibv_port_attr, flags));
  return 0;
}

EMU_EXPORT int ibv_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid) {
  (void)ctx;
  int len = emu.cfg.link_ib ? 1 : EMU_GIDS_ETH;
  if (port != 1 || index < 0 || index >= len) return -1;
  emu_gid((uint32_t)getpid(), emu.cfg.link_ib ? 0 : index, gid);
  return 0;
}

EMU_EXPORT int _ibv_query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t index,
                                 struct ibv_gid_entry *e, uint32_t flags, size_t size) {
  (void)flags;
  if (size < sizeof *e) return EINVAL;
  if (ibv_query_gid(ctx, (uint8_t)port, (int)index, &e->gid)) return ENODATA;
  e->gid_index = index;
  e->port_num = port;
  e->gid_type = emu.cfg.link_ib               ? IBV_GID_TYPE_IB
                : emu_gid_roce_v2((int)index) ? IBV_GID_TYPE_ROCE_V2
                                              : IBV_GID_TYPE_ROCE_V1;
  e->ndev_ifindex = 0;
  return 0;
}

EMU_EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *ctx) {
  emu_pd *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->pd.context = ctx;
  p->id = __atomic_add_fetch(&emu.next_pd, 1, __ATOMIC_RELAXED);
  return &p->pd;
}

EMU_EXPORT int ibv_dealloc_pd(struct ibv_pd *pd) {
  free(pd);
  return 0;
}

/* ---- memory regions ---------------------------------------------------------------- */

/* Puts `rec` in a free slot of this process's table; &em->mr keyed, or NULL
 * (errno set) when the table is full. */
static struct ibv_mr *emu_mr_add(struct ibv_pd *pd, emu_mr *em, emu_mr_sh rec) {
  emu_region *r = emu.region;
  emu_lock(r);
  int i = 0;
  while (i < EMU_MAX_MR && r->mr[i].in_use) i++;
  if (i == EMU_MAX_MR) {
    emu_unlock(r);
    errno = ENOMEM;
    return NULL;
  }
  uint32_t key = ((++r->generation & 0x3fffff) << 10) | (uint32_t)i;
  rec.in_use = 1;
  rec.key = key;
  rec.pd_id = ((emu_pd *)pd)->id;
  r->mr[i] = rec;
  emu_unlock(r);
  struct ibv_mr *mr = &em->mr;
  mr->context = pd->context;
  mr->pd = pd;
  mr->handle = (uint32_t)i;
  mr->lkey = mr->rkey = key;
  pthread_mutex_lock(&emu_local_lock);
  emu.mrs[i] = mr;
  pthread_mutex_unlock(&emu_local_lock);
  EMU_COUNT(mrs_live, 1);
  return mr;
}

EMU_EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access) {
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
      !(access & IBV_ACCESS_LOCAL_WRITE)) {
    errno = EINVAL; /* as ibv_reg_mr(3) requires */
    return NULL;
  }
  emu_mr *em = calloc(1, sizeof *em);
  if (!em) return NULL;
  em->mr.addr = addr;
  em->mr.length = length;
  emu_mr_sh rec = {.addr = (uint64_t)(uintptr_t)addr, .length = length, .access = access};
  if (!emu_mr_add(pd, em, rec)) {
    free(em);
    return NULL;
  }
  return &em->mr;
}

/* GPU memory exported as a dma-buf. Mapping the fd is how the emulator
 * reaches what the GPU sees, since the device addresses (iova) are not host
 * memory; a real NIC would fail on an fd that is no dma-buf where mmap fails
 * here (EBADF, ENODEV, EACCES). */
EMU_EXPORT struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
                                            uint64_t iova, int fd, int access) {
  if (emu.cfg.no_dmabuf) {
    errno = EOPNOTSUPP;
    return NULL;
  }
  if (((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
       !(access & IBV_ACCESS_LOCAL_WRITE)) ||
      length == 0 || iova + length < iova || offset + length < offset) {
    errno = EINVAL;
    return NULL;
  }
  struct stat st;
  if (fstat(fd, &st)) return NULL;
  if ((uint64_t)st.st_size < offset + length) { /* past the buffer: a SIGBUS when touched */
    errno = EINVAL;
    return NULL;
  }
  uint64_t floor = offset & ~(uint64_t)(sysconf(_SC_PAGESIZE) - 1);
  size_t map_len = (size_t)(offset - floor + length);
  void *map = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)floor);
  if (map == MAP_FAILED) return NULL;
  void *pending = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  emu_mr *em = pending == MAP_FAILED ? NULL : calloc(1, sizeof *em);
  if (!em) {
    int e = errno;
    munmap(map, map_len);
    if (pending != MAP_FAILED) munmap(pending, length);
    errno = e;
    return NULL;
  }
  em->map = map;
  em->map_len = map_len;
  em->pending = pending;
  em->mr.addr = (void *)(uintptr_t)offset; /* as libibverbs sets it: work requests name iova */
  em->mr.length = length;
  emu_mr_sh rec = {.addr = iova,
                   .length = length,
                   .access = access,
                   .dmabuf = 1,
                   .alias = (uint64_t)(uintptr_t)map + (offset - floor),
                   .pending = (uint64_t)(uintptr_t)pending};
  if (!emu_mr_add(pd, em, rec)) {
    int e = errno;
    munmap(map, map_len);
    munmap(pending, length);
    free(em);
    errno = e;
    return NULL;
  }
  EMU_COUNT(dmabuf_mrs_live, 1);
  EMU_COUNT(dmabuf_registered, 1);
  return &em->mr;
}

static int64_t emu_mr_flush(const emu_region *r, emu_mr_sh *m);

EMU_EXPORT int ibv_dereg_mr(struct ibv_mr *mr) {
  emu_mr *em = (emu_mr *)mr;
  emu_region *r = emu.region;
  bool live = false;
  pthread_mutex_lock(&emu_local_lock);
  emu_lock(r);
  if (mr->handle < EMU_MAX_MR && r->mr[mr->handle].key == mr->lkey) {
    emu_mr_sh *m = &r->mr[mr->handle];
    if (m->in_use && m->dmabuf) emu_mr_flush(r, m); /* what the NIC wrote arrives in the end */
    live = m->in_use;
    m->in_use = 0;
    m->ndirty = 0;
    if (emu.mrs[mr->handle] == mr) emu.mrs[mr->handle] = NULL;
  }
  emu_unlock(r);
  pthread_mutex_unlock(&emu_local_lock);
  if (live) {
    EMU_UNCOUNT(mrs_live, 1);
    if (em->map) EMU_UNCOUNT(dmabuf_mrs_live, 1);
  }
  if (em->map) munmap(em->map, em->map_len);
  if (em->pending) munmap(em->pending, mr->length);
  free(em);
  return 0;
}

/* The region `key` names, if it covers [addr, addr+len) with `access`. */
static int emu_mr_check(const emu_region *r, uint32_t key, uint32_t pd_id, uint64_t addr,
                        uint64_t len, int access) {
  uint32_t i = key & 1023;
  const emu_mr_sh *m = &r->mr[i];
  if (!m->in_use || m->key != key || m->pd_id != pd_id) return -1;
  if (addr < m->addr || addr + len > m->addr + m->length || addr + len < addr) return -1;
  if ((m->access & access) != access) return -1;
  return 0;
}

/* Host memory, not checked for a dma-buf MR (its addresses are the device's
 * and its alias stays mapped until deregistration). */
static int emu_mr_unmapped(const emu_region *r, uint32_t key) {
  const emu_mr_sh *m = &r->mr[key & 1023];
  if (m->dmabuf) return 0;
  uintptr_t start = (uintptr_t)m->addr & ~(uintptr_t)4095;
  return msync((void *)start, m->addr + m->length - start, MS_ASYNC) != 0 && errno == ENOMEM;
}

/* With `r` locked: pending bytes [off, off+len) of dma-buf MR `m` (of r's
 * process) copied into its alias, where the GPU sees them. A peer's bytes go
 * through a bounce buffer here: process_vm_* copy between two processes
 * only. 0, or -1 with errno (ESRCH: the owner is gone). */
static int emu_mr_apply(const emu_region *r, const emu_mr_sh *m, uint64_t off, uint64_t len) {
  if (r->pid == (uint32_t)getpid()) {
    memcpy((void *)(uintptr_t)(m->alias + off), (void *)(uintptr_t)(m->pending + off), len);
  } else {
    size_t cap = len < (1u << 20) ? (size_t)len : (1u << 20);
    char *bounce = malloc(cap ? cap : 1);
    if (!bounce) return -1;
    for (uint64_t done = 0; done < len;) {
      size_t take = len - done < cap ? (size_t)(len - done) : cap;
      struct iovec b = {bounce, take};
      struct iovec from = {(void *)(uintptr_t)(m->pending + off + done), take};
      struct iovec to = {(void *)(uintptr_t)(m->alias + off + done), take};
      if (process_vm_readv((pid_t)r->pid, &b, 1, &from, 1, 0) != (ssize_t)take ||
          process_vm_writev((pid_t)r->pid, &b, 1, &to, 1, 0) != (ssize_t)take) {
        int e = errno;
        free(bounce);
        errno = e;
        return -1;
      }
      done += take;
    }
    free(bounce);
  }
  EMU_COUNT(pending_applied_bytes, len);
  return 0;
}

/* With `r` locked: every pending range of `m` applied, oldest first; the
 * bytes applied, or -1 with errno. */
static int64_t emu_mr_flush(const emu_region *r, emu_mr_sh *m) {
  int64_t total = 0;
  while (m->ndirty) {
    emu_range d = m->dirty[0];
    if (emu_mr_apply(r, m, d.off, d.len)) return -1;
    m->ndirty--;
    memmove(m->dirty, m->dirty + 1, m->ndirty * sizeof d);
    total += (int64_t)d.len;
  }
  return total;
}

/* With `r` locked: the NIC wrote [off, off+len) of `m` into its pending
 * buffer. One range for what overlaps or touches, kept as the newest; with
 * the list full the oldest is applied now (early is allowed; if the owner
 * is gone, so is the memory). */
static void emu_mr_dirty(const emu_region *r, emu_mr_sh *m, uint64_t off, uint64_t len) {
  if (!len) return;
  uint64_t end = off + len;
  for (uint32_t k = 0; k < m->ndirty;) {
    emu_range *d = &m->dirty[k];
    if (end >= d->off && off <= d->off + d->len) {
      if (d->off < off) off = d->off;
      if (d->off + d->len > end) end = d->off + d->len;
      m->ndirty--;
      memmove(d, d + 1, (m->ndirty - k) * sizeof *d);
    } else {
      k++;
    }
  }
  if (m->ndirty == EMU_MAX_DIRTY) {
    emu_mr_apply(r, m, m->dirty[0].off, m->dirty[0].len);
    m->ndirty--;
    memmove(m->dirty, m->dirty + 1, m->ndirty * sizeof m->dirty[0]);
  }
  m->dirty[m->ndirty++] = (emu_range){off, end - off};
}

/* ---- completion queues --------------------------------------------------------------- */

EMU_EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *ctx, int cqe, void *user,
                                        struct ibv_comp_channel *ch, int vec) {
  (void)vec;
  if (ch || cqe < 1 || cqe > EMU_MAX_CQE) {
    errno = EINVAL;
    return NULL;
  }
  emu_region *r = emu.region;
  emu_cq *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  emu_lock(r);
  int i = 0;
  while (i < EMU_MAX_CQ && r->cq[i].in_use) i++;
  if (i == EMU_MAX_CQ) {
    emu_unlock(r);
    free(c);
    errno = ENOMEM;
    return NULL;
  }
  emu_cq_sh *s = &r->cq[i];
  s->in_use = 1;
  s->cqe = cqe;
  s->head = s->tail = 0;
  s->overrun = 0;
  emu_unlock(r);
  c->idx = i;
  c->cq.context = ctx;
  c->cq.cq_context = user;
  c->cq.cqe = cqe;
  pthread_mutex_lock(&emu_local_lock);
  emu.cqs[i] = c;
  pthread_mutex_unlock(&emu_local_lock);
  return &c->cq;
}

EMU_EXPORT int ibv_destroy_cq(struct ibv_cq *cq) {
  emu_cq *c = (emu_cq *)cq;
  pthread_mutex_lock(&emu_local_lock);
  emu_lock(emu.region);
  emu.region->cq[c->idx].in_use = 0;
  emu_unlock(emu.region);
  emu.cqs[c->idx] = NULL;
  pthread_mutex_unlock(&emu_local_lock);
  free(c);
  return 0;
}

static void emu_event_push(emu_region *r, enum ibv_event_type type, int qp, int cq) {
  if (r->ev_tail - r->ev_head >= EMU_MAX_EVENTS) return;
  r->ev[r->ev_tail % EMU_MAX_EVENTS] = (emu_event){type, qp, cq};
  r->ev_tail++;
}

/* With `r` locked. An overrun CQ is an error for every QP feeding it. */
static int emu_cq_push(emu_region *r, int cq, const struct ibv_wc *wc) {
  emu_cq_sh *s = &r->cq[cq];
  if (!s->in_use) return -1;
  if (s->overrun || s->tail - s->head >= (uint32_t)s->cqe) {
    if (!s->overrun) emu_event_push(r, IBV_EVENT_CQ_ERR, -1, cq);
    s->overrun = 1;
    return -1;
  }
  s->wc[s->tail % EMU_MAX_CQE] = *wc;
  s->tail++;
  return 0;
}

/* ---- queue pairs ------------------------------------------------------------------ */

EMU_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *ia) {
  if (ia->qp_type != IBV_QPT_RC || ia->srq || !ia->send_cq || !ia->recv_cq ||
      ia->cap.max_send_wr < 1 || ia->cap.max_send_wr > EMU_MAX_SQ ||
      ia->cap.max_recv_wr > EMU_MAX_RQ || ia->cap.max_send_sge > EMU_MAX_SGE ||
      ia->cap.max_recv_sge > EMU_MAX_SGE ||
      ia->cap.max_inline_data > (uint32_t)emu.cfg.max_inline) {
    errno = EINVAL;
    return NULL;
  }
  emu_region *r = emu.region;
  emu_qp *q = calloc(1, sizeof *q);
  if (!q) return NULL;
  q->sq = calloc(ia->cap.max_send_wr, sizeof *q->sq);
  q->batches = calloc(ia->cap.max_send_wr + 1, sizeof *q->batches);
  if (!q->sq || !q->batches) {
    free(q->sq);
    free(q->batches);
    free(q);
    errno = ENOMEM;
    return NULL;
  }
  emu_lock(r);
  int i = 0;
  while (i < EMU_MAX_QP && r->qp[i].in_use) i++;
  if (i == EMU_MAX_QP) {
    emu_unlock(r);
    free(q->sq);
    free(q->batches);
    free(q);
    errno = ENOMEM;
    return NULL;
  }
  emu_qp_sh *s = &r->qp[i];
  memset(s, 0, sizeof *s);
  s->in_use = 1;
  s->qpn = ((++r->generation & 0xffff) << 8) | (uint32_t)i;
  s->state = IBV_QPS_RESET;
  s->pd_id = ((emu_pd *)pd)->id;
  s->send_cq = ((emu_cq *)ia->send_cq)->idx;
  s->recv_cq = ((emu_cq *)ia->recv_cq)->idx;
  s->max_send_wr = ia->cap.max_send_wr;
  s->max_recv_wr = ia->cap.max_recv_wr;
  s->max_send_sge = ia->cap.max_send_sge;
  s->max_recv_sge = ia->cap.max_recv_sge;
  s->max_inline = ia->cap.max_inline_data;
  emu_unlock(r);
  q->idx = i;
  q->sq_cap = ia->cap.max_send_wr;
  q->qp.context = pd->context;
  q->qp.qp_context = ia->qp_context;
  q->qp.pd = pd;
  q->qp.send_cq = ia->send_cq;
  q->qp.recv_cq = ia->recv_cq;
  q->qp.qp_num = s->qpn;
  q->qp.state = IBV_QPS_RESET;
  q->qp.qp_type = IBV_QPT_RC;
  pthread_mutex_init(&q->qp.mutex, NULL);
  pthread_cond_init(&q->qp.cond, NULL);
  pthread_mutex_init(&q->sq_lock, NULL);
  pthread_mutex_lock(&emu_local_lock);
  emu.qps[i] = q;
  pthread_mutex_unlock(&emu_local_lock);
  return &q->qp;
}

EMU_EXPORT int ibv_destroy_qp(struct ibv_qp *qp) {
  emu_qp *q = (emu_qp *)qp;
  pthread_mutex_lock(&emu_local_lock);
  emu_lock(emu.region);
  emu.region->qp[q->idx].in_use = 0;
  emu_unlock(emu.region);
  emu.qps[q->idx] = NULL;
  pthread_mutex_unlock(&emu_local_lock);
  /* a thread that found it in qps[] before holds its lock: wait for it */
  pthread_mutex_lock(&q->sq_lock);
  pthread_mutex_unlock(&q->sq_lock);
  pthread_mutex_destroy(&q->sq_lock);
  for (uint32_t i = 0; i < q->sq_count; i++) free(q->sq[(q->sq_head + i) % q->sq_cap].inline_data);
  free(q->sq);
  free(q->batches);
  free(q);
  return 0;
}

/* ibv_modify_qp(3): the attributes each RC transition requires and allows. */
static int emu_transition(enum ibv_qp_state from, enum ibv_qp_state to, int *required,
                          int *optional) {
  *required = IBV_QP_STATE;
  *optional = 0;
  if (to == IBV_QPS_RESET || to == IBV_QPS_ERR) return 0;
  if (from == IBV_QPS_RESET && to == IBV_QPS_INIT) {
    *required |= IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    return 0;
  }
  if (from == IBV_QPS_INIT && to == IBV_QPS_INIT) {
    *optional = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    return 0;
  }
  if (from == IBV_QPS_INIT && to == IBV_QPS_RTR) {
    *required |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    *optional = IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX;
    return 0;
  }
  if (from == IBV_QPS_RTR && to == IBV_QPS_RTS) {
    *required |= IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                 IBV_QP_MAX_QP_RD_ATOMIC;
    *optional = IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
                IBV_QP_PATH_MIG_STATE;
    return 0;
  }
  if (from == IBV_QPS_RTS && to == IBV_QPS_RTS) {
    *optional = IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE |
                IBV_QP_MIN_RNR_TIMER;
    return 0;
  }
  return -1;
}

static void emu_qp_flush_rq(emu_region *r, emu_qp_sh *s);

/* The address vector names a process: LID (InfiniBand) or GID (RoCE). */
static int emu_av_pid(const struct ibv_ah_attr *ah, uint32_t *pid) {
  if (ah->port_num != 1) return EINVAL;
  if (emu.cfg.link_ib) {
    if (ah->dlid == 0) return EINVAL;
    *pid = ah->dlid;
    return 0;
  }
  if (!ah->is_global || ah->grh.sgid_index >= EMU_GIDS_ETH) return EINVAL; /* RoCE needs a GRH */
  const uint8_t *g = ah->grh.dgid.raw;
  *pid = ((uint32_t)g[13] << 16) | ((uint32_t)g[14] << 8) | g[15];
  /* a GID of another type than ours reaches nothing (RoCE v1 vs v2) */
  union ibv_gid want;
  emu_gid(*pid, ah->grh.sgid_index, &want);
  if (memcmp(want.raw, g, 16)) *pid = 0;
  return 0;
}

EMU_EXPORT int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask) {
  emu_qp *q = (emu_qp *)qp;
  emu_region *r = emu.region;
  emu_lock(r);
  emu_qp_sh *s = &r->qp[q->idx];
  int req, opt, rc = 0;
  enum ibv_qp_state to = (mask & IBV_QP_STATE) ? a->qp_state : s->state;
  if (emu_transition(s->state, to, &req, &opt) || (mask & req) != req || (mask & ~(req | opt))) {
    rc = EINVAL;
    goto out;
  }
  if ((mask & IBV_QP_PORT) && a->port_num != 1) rc = EINVAL;
  if ((mask & IBV_QP_PATH_MTU) && a->path_mtu > emu_mtu_enum(emu.cfg.mtu)) rc = EINVAL;
  if ((mask & IBV_QP_RNR_RETRY) && a->rnr_retry > 7) rc = EINVAL;
  if ((mask & IBV_QP_RETRY_CNT) && a->retry_cnt > 7) rc = EINVAL;
  uint32_t pid = 0;
  if (!rc && (mask & IBV_QP_AV)) rc = emu_av_pid(&a->ah_attr, &pid);
  if (rc) goto out;
  if (mask & IBV_QP_ACCESS_FLAGS) s->access = (int)a->qp_access_flags;
  if (mask & IBV_QP_PORT) s->port = a->port_num;
  if (mask & IBV_QP_AV) s->dest_pid = pid;
  if (mask & IBV_QP_DEST_QPN) s->dest_qpn = a->dest_qp_num;
  if (mask & IBV_QP_PATH_MTU) s->mtu = a->path_mtu;
  if (mask & IBV_QP_TIMEOUT) s->timeout = a->timeout;
  if (mask & IBV_QP_RETRY_CNT) s->retry_cnt = a->retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) s->rnr_retry = a->rnr_retry;
  if (mask & IBV_QP_MIN_RNR_TIMER) s->min_rnr_timer = a->min_rnr_timer;
  if (mask & IBV_QP_SQ_PSN) s->sq_psn = a->sq_psn;
  if (mask & IBV_QP_RQ_PSN) s->rq_psn = a->rq_psn;
  if (to == IBV_QPS_RESET) s->rq_head = s->rq_tail = 0;
  if (to == IBV_QPS_ERR && s->state != IBV_QPS_ERR) emu_qp_flush_rq(r, s);
  s->state = to;
  qp->state = to;
out:
  emu_unlock(r);
  if (rc) errno = rc;
  return rc;
}

/* ---- receive side --------------------------------------------------------------- */

/* With `r` locked: every posted receive completes with a flush error. */
static void emu_qp_flush_rq(emu_region *r, emu_qp_sh *s) {
  for (; s->rq_head != s->rq_tail; s->rq_head++) {
    struct ibv_wc wc = {.wr_id = s->rq[s->rq_head % EMU_MAX_RQ].wr_id,
                        .status = IBV_WC_WR_FLUSH_ERR,
                        .opcode = IBV_WC_RECV,
                        .qp_num = s->qpn};
    emu_cq_push(r, s->recv_cq, &wc);
  }
}

static int emu_data_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad) {
  uint64_t t0 = emu_ns();
  emu_qp *q = (emu_qp *)qp;
  emu_region *r = emu.region;
  int rc = 0;
  emu_lock(r);
  emu_qp_sh *s = &r->qp[q->idx];
  for (; wr; wr = wr->next) {
    if (s->state == IBV_QPS_RESET)
      rc = EINVAL;
    else if (wr->num_sge < 0 || (uint32_t)wr->num_sge > s->max_recv_sge)
      rc = EINVAL;
    else if (s->rq_tail - s->rq_head >= s->max_recv_wr)
      rc = ENOMEM;
    if (rc) break;
    emu_rwqe *w = &s->rq[s->rq_tail % EMU_MAX_RQ];
    w->wr_id = wr->wr_id;
    w->num_sge = wr->num_sge;
    for (int i = 0; i < wr->num_sge; i++)
      w->sge[i] = (emu_sge){wr->sg_list[i].addr, wr->sg_list[i].length, wr->sg_list[i].lkey};
    s->rq_tail++;
    if (s->rq_tail - s->rq_head > s->rq_high) s->rq_high = s->rq_tail - s->rq_head;
    if (s->state == IBV_QPS_ERR) emu_qp_flush_rq(r, s);
  }
  emu_unlock(r);
  if (rc) *bad = wr;
  EMU_COUNT(data_calls, 1);
  EMU_COUNT(emu_ns, emu_ns() - t0);
  return rc;
}

/* ---- send side: the emulated NIC ----------------------------------------------------- */

enum emu_outcome { EMU_DONE, EMU_RNR, EMU_UNREACHABLE, EMU_FAILED };

/* Same process: the bytes of `src` into `dst` in order, as process_vm_writev
 * would move them; how many. */
static ssize_t emu_copy(const struct iovec *dst, int nd, const struct iovec *src, int ns) {
  ssize_t n = 0;
  size_t doff = 0, soff = 0;
  for (int i = 0, j = 0; i < ns && j < nd;) {
    size_t a = src[i].iov_len - soff, room = dst[j].iov_len - doff;
    size_t take = a < room ? a : room;
    if (take) memcpy((char *)dst[j].iov_base + doff, (char *)src[i].iov_base + soff, take);
    n += (ssize_t)take;
    soff += take;
    doff += take;
    if (soff == src[i].iov_len) i++, soff = 0;
    if (doff == dst[j].iov_len) j++, doff = 0;
  }
  return n;
}

/* Bytes [off, off+len) of a dma-buf MR written into its pending buffer. */
typedef struct emu_landing {
  emu_mr_sh *m;
  uint64_t off, len;
} emu_landing;

/* Executes one work request against its target. */
static enum emu_outcome emu_execute(emu_qp *q, emu_swqe *w, enum ibv_wc_status *status) {
  emu_region *me = emu.region;
  /* the path, read under the lock: other threads post receives into (and
   * may fail) this QP's shared part while we execute its send */
  struct {
    uint32_t pd_id, dest_pid, dest_qpn, qpn;
  } s;
  emu_lock(me);
  const emu_qp_sh *sh = &me->qp[q->idx];
  s.pd_id = sh->pd_id;
  s.dest_pid = sh->dest_pid;
  s.dest_qpn = sh->dest_qpn;
  s.qpn = sh->qpn;
  emu_unlock(me);
  bool read = w->opcode == IBV_WR_RDMA_READ;
  struct iovec local[EMU_MAX_SGE];
  int nl = 0;
  uint64_t len = 0;
  if (w->inline_data) {
    local[nl++] = (struct iovec){w->inline_data, w->inline_len};
    len = w->inline_len;
  } else {
    emu_lock(me);
    for (int i = 0; i < w->num_sge; i++) {
      uint64_t at = w->sge[i].addr;
      if (w->sge[i].length) {
        /* a registration whose pages were unmapped since would read stale
         * pinned pages on a NIC: refuse it; a read's data lands locally */
        emu_mr_sh *m = &me->mr[w->sge[i].lkey & 1023];
        if (emu_mr_check(me, w->sge[i].lkey, s.pd_id, at, w->sge[i].length,
                         read ? IBV_ACCESS_LOCAL_WRITE : 0) ||
            emu_mr_unmapped(me, w->sge[i].lkey)) {
          emu_unlock(me);
          *status = IBV_WC_LOC_PROT_ERR;
          return EMU_FAILED;
        }
        if (m->dmabuf) { /* the NIC's reads and writes see its own earlier writes */
          emu_mr_flush(me, m);
          at = m->alias + (at - m->addr);
        }
      }
      local[nl++] = (struct iovec){(void *)(uintptr_t)at, w->sge[i].length};
      len += w->sge[i].length;
    }
    emu_unlock(me);
  }
  if (emu.cfg.fail_wr &&
      __atomic_add_fetch(&emu.executed, 1, __ATOMIC_RELAXED) == (uint64_t)emu.cfg.fail_wr) {
    *status = (enum ibv_wc_status)emu.cfg.fail_status;
    return EMU_FAILED;
  }
  emu_region *r = s.dest_pid ? emu_remote(s.dest_pid) : NULL;
  if (!r) return EMU_UNREACHABLE;
  bool write = w->opcode == IBV_WR_RDMA_WRITE || w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
  bool consumes = !read && w->opcode != IBV_WR_RDMA_WRITE;
  bool imm = w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM || w->opcode == IBV_WR_SEND_WITH_IMM;
  emu_lock(r);
  uint32_t ri = s.dest_qpn & 0xff;
  emu_qp_sh *t = &r->qp[ri];
  if (!t->in_use || t->qpn != s.dest_qpn || (t->state != IBV_QPS_RTR && t->state != IBV_QPS_RTS) ||
      t->dest_pid != me->pid || t->dest_qpn != s.qpn) {
    emu_unlock(r);
    return EMU_UNREACHABLE; /* nobody answers: the requester times out and retries */
  }
  struct iovec remote[EMU_MAX_SGE];
  int nr = 0;
  /* what lands in dma-buf MRs' pending buffers, recorded once it is there */
  emu_landing defer[EMU_MAX_SGE];
  int nd = 0;
  if (write || read) {
    int need = read ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
    if (!(t->access & need) || emu_mr_check(r, w->rkey, t->pd_id, w->raddr, len, need)) {
      /* a responder-side protection error: both ends go to ERR */
      emu_qp_flush_rq(r, t);
      t->state = IBV_QPS_ERR;
      emu_event_push(r, IBV_EVENT_QP_ACCESS_ERR, (int)ri, -1);
      emu_unlock(r);
      *status = IBV_WC_REM_ACCESS_ERR;
      return EMU_FAILED;
    }
    emu_mr_sh *m = &r->mr[w->rkey & 1023];
    uint64_t at = w->raddr;
    if (m->dmabuf && read) {
      /* the flush: a read of GPU memory through the NIC comes after the
       * NIC's earlier writes to it, which the GPU then sees */
      int64_t applied = emu_mr_flush(r, m);
      if (applied < 0) {
        int e = errno;
        emu_unlock(r);
        if (e == ESRCH) return EMU_UNREACHABLE;
        *status = IBV_WC_REM_OP_ERR;
        return EMU_FAILED;
      }
      if (applied) EMU_COUNT(flushes, 1);
      at = m->alias + (at - m->addr);
    } else if (m->dmabuf) {
      at = m->pending + (at - m->addr);
      if (len) defer[nd++] = (emu_landing){m, w->raddr - m->addr, len};
    }
    remote[nr++] = (struct iovec){(void *)(uintptr_t)at, len};
  }
  emu_rwqe *rw = NULL;
  if (consumes) {
    if (t->rq_head == t->rq_tail) {
      emu_unlock(r);
      return EMU_RNR;
    }
    rw = &t->rq[t->rq_head % EMU_MAX_RQ];
    if (!write) { /* a send scatters into the receive's buffers */
      uint64_t room = 0;
      for (int i = 0; i < rw->num_sge; i++) {
        if (emu_mr_check(r, rw->sge[i].lkey, t->pd_id, rw->sge[i].addr, rw->sge[i].length,
                         IBV_ACCESS_LOCAL_WRITE)) {
          emu_unlock(r);
          *status = IBV_WC_REM_OP_ERR;
          return EMU_FAILED;
        }
        emu_mr_sh *m = &r->mr[rw->sge[i].lkey & 1023];
        uint64_t at = rw->sge[i].addr;
        if (m->dmabuf) { /* a send into GPU memory is a NIC write like any other */
          uint64_t lands = len > room ? len - room : 0;
          if (lands > rw->sge[i].length) lands = rw->sge[i].length;
          if (lands) defer[nd++] = (emu_landing){m, at - m->addr, lands};
          at = m->pending + (at - m->addr);
        }
        remote[nr++] = (struct iovec){(void *)(uintptr_t)at, rw->sge[i].length};
        room += rw->sge[i].length;
      }
      if (room < len) {
        emu_unlock(r);
        *status = IBV_WC_REM_INV_REQ_ERR;
        return EMU_FAILED;
      }
    }
    emu_cq_sh *rcq = &r->cq[t->recv_cq];
    if (rcq->overrun || rcq->tail - rcq->head >= (uint32_t)rcq->cqe) {
      emu_cq_push(r, t->recv_cq, &(struct ibv_wc){0}); /* marks the overrun, raises CQ_ERR */
      t->state = IBV_QPS_ERR;
      emu_event_push(r, IBV_EVENT_QP_FATAL, (int)ri, -1);
      emu_unlock(r);
      *status = IBV_WC_REM_OP_ERR;
      return EMU_FAILED;
    }
  }
  if (len) {
    ssize_t n;
    if (r == me) /* same process: plain copies */
      n = read ? emu_copy(local, nl, remote, nr) : emu_copy(remote, nr, local, nl);
    else if (read)
      n = process_vm_readv((pid_t)r->pid, local, (unsigned long)nl, remote, (unsigned long)nr, 0);
    else
      n = process_vm_writev((pid_t)r->pid, local, (unsigned long)nl, remote, (unsigned long)nr, 0);
    if (n != (ssize_t)len) {
      int e = errno;
      emu_unlock(r);
      if (n < 0 && e == ESRCH) return EMU_UNREACHABLE;
      *status = IBV_WC_REM_ACCESS_ERR;
      return EMU_FAILED;
    }
  }
  for (int i = 0; i < nd; i++) emu_mr_dirty(r, defer[i].m, defer[i].off, defer[i].len);
  if (consumes) {
    struct ibv_wc wc = {.wr_id = rw->wr_id,
                        .status = IBV_WC_SUCCESS,
                        .opcode = write ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV,
                        .byte_len = (uint32_t)len,
                        .qp_num = t->qpn,
                        .src_qp = s.qpn,
                        .wc_flags = imm ? IBV_WC_WITH_IMM : 0};
    wc.imm_data = w->imm; /* already in network order, as the sender gave it */
    t->rq_head++;
    uint32_t deficit = t->rq_high - (t->rq_tail - t->rq_head);
    if (deficit > r->max_rq_deficit) r->max_rq_deficit = deficit;
    r->recv_landed++;
    emu_cq_push(r, t->recv_cq, &wc);
  }
  emu_unlock(r);
  return EMU_DONE;
}

/* With our region locked: a completion for the send at the head, and how
 * many send-queue slots it frees once polled. */
static void emu_complete_send(emu_qp *q, const emu_swqe *w, enum ibv_wc_status st, bool force) {
  emu_region *me = emu.region;
  emu_qp_sh *s = &me->qp[q->idx];
  q->unsignaled++;
  if (!(w->flags & IBV_SEND_SIGNALED) && !force) return;
  static const enum ibv_wc_opcode op[] = {[IBV_WR_RDMA_WRITE] = IBV_WC_RDMA_WRITE,
                                          [IBV_WR_RDMA_WRITE_WITH_IMM] = IBV_WC_RDMA_WRITE,
                                          [IBV_WR_SEND] = IBV_WC_SEND,
                                          [IBV_WR_SEND_WITH_IMM] = IBV_WC_SEND,
                                          [IBV_WR_RDMA_READ] = IBV_WC_RDMA_READ};
  struct ibv_wc wc = {.wr_id = w->wr_id, .status = st, .opcode = op[w->opcode], .qp_num = s->qpn};
  if (emu_cq_push(me, s->send_cq, &wc) == 0) {
    q->batches[(q->b_head + q->b_count) % (q->sq_cap + 1)] = q->unsignaled;
    q->b_count++;
  }
  q->unsignaled = 0;
}

static void emu_sq_pop(emu_qp *q) {
  emu_swqe *w = &q->sq[q->sq_head];
  free(w->inline_data);
  w->inline_data = NULL;
  q->sq_head = (q->sq_head + 1) % q->sq_cap;
  q->sq_count--;
}

/* Moves one QP's send queue forward, at most `max` work requests. */
static void emu_qp_progress(emu_qp *q, int max) {
  emu_region *me = emu.region;
  double now = emu_now();
  for (int done = 0; q->sq_count && done < max; done++) {
    emu_swqe *w = &q->sq[q->sq_head];
    emu_lock(me); /* set to ERR by other threads and by peers */
    enum ibv_qp_state state = me->qp[q->idx].state;
    emu_unlock(me);
    if (state == IBV_QPS_ERR) { /* everything after an error is flushed */
      emu_lock(me);
      emu_complete_send(q, w, IBV_WC_WR_FLUSH_ERR, true);
      emu_unlock(me);
      emu_sq_pop(q);
      continue;
    }
    if (now < w->ready_at || now < q->next_try) return;
    enum ibv_wc_status st = IBV_WC_SUCCESS;
    enum emu_outcome out = emu_execute(q, w, &st);
    emu_qp_sh *s = &me->qp[q->idx];
    double pause = emu.cfg.retry_ms * 1e-3;
    if (out == EMU_RNR) {
      EMU_COUNT(rnr_naks, 1);
      if (s->rnr_retry == 7 || ++q->rnr_retries <= s->rnr_retry) {
        q->next_try = now + pause;
        return;
      }
      out = EMU_FAILED;
      st = IBV_WC_RNR_RETRY_EXC_ERR;
    } else if (out == EMU_UNREACHABLE) {
      if (++q->retries <= s->retry_cnt) {
        q->next_try = now + pause;
        return;
      }
      out = EMU_FAILED;
      st = IBV_WC_RETRY_EXC_ERR;
    }
    q->retries = q->rnr_retries = 0;
    q->next_try = 0;
    EMU_COUNT(send_wrs, 1);
    emu_lock(me);
    if (out == EMU_FAILED) {
      emu_complete_send(q, w, st, true); /* errors complete even when unsignaled */
      s->state = IBV_QPS_ERR;
      emu_qp_flush_rq(me, s);
    } else {
      emu_complete_send(q, w, IBV_WC_SUCCESS, false);
    }
    emu_unlock(me);
    emu_sq_pop(q);
  }
}

/* QP `i` of this process with its send-queue lock held, or NULL when there
 * is none or another thread is in it (then that thread moves it forward).
 * The lock is taken while qps[] is locked: see emu_local_lock. */
static emu_qp *emu_qp_grab(int i) {
  pthread_mutex_lock(&emu_local_lock);
  emu_qp *q = emu.qps[i];
  if (q && pthread_mutex_trylock(&q->sq_lock)) q = NULL;
  pthread_mutex_unlock(&emu_local_lock);
  if (q && !q->sq_count) {
    pthread_mutex_unlock(&q->sq_lock);
    q = NULL;
  }
  return q;
}

/* Serves the queue pairs of every context of this process, as a NIC would,
 * whichever thread polls; with `reorder`, one request at a time from a
 * randomly chosen QP, so QPs overtake each other (never within one). */
static void emu_progress_all(void) {
  if (!emu.cfg.reorder) {
    for (int i = 0; i < EMU_MAX_QP; i++) {
      emu_qp *q = emu_qp_grab(i);
      if (!q) continue;
      emu_qp_progress(q, 1 << 30);
      pthread_mutex_unlock(&q->sq_lock);
    }
    return;
  }
  for (int round = 0; round < 4 * EMU_MAX_SQ; round++) {
    int order[EMU_MAX_QP], n = 0;
    pthread_mutex_lock(&emu_local_lock);
    for (int i = 0; i < EMU_MAX_QP; i++)
      if (emu.qps[i]) order[n++] = i;
    pthread_mutex_unlock(&emu_local_lock);
    if (n == 0) return;
    /* the chosen one first, then any other ready QP */
    int first = rand() % n;
    bool moved = false, any = false;
    for (int k = 0; k < n && !moved; k++) {
      emu_qp *q = emu_qp_grab(order[(first + k) % n]);
      if (!q) continue;
      any = true;
      uint32_t before = q->sq_count;
      emu_qp_progress(q, 1);
      moved = q->sq_count != before;
      pthread_mutex_unlock(&q->sq_lock);
    }
    if (!any || !moved) return;
  }
}

static int emu_data_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
  uint64_t t0 = emu_ns();
  emu_qp *q = (emu_qp *)qp;
  emu_qp_sh *s = &emu.region->qp[q->idx];
  int rc = 0;
  pthread_mutex_lock(&q->sq_lock);
  emu_lock(emu.region); /* the state is set to ERR by other threads and by peers */
  enum ibv_qp_state state = s->state;
  emu_unlock(emu.region);
  for (; wr; wr = wr->next) {
    uint32_t total = 0;
    for (int i = 0; i < wr->num_sge && i < EMU_MAX_SGE; i++) total += wr->sg_list[i].length;
    if (state != IBV_QPS_RTS && state != IBV_QPS_ERR)
      rc = EINVAL;
    else if (wr->num_sge < 0 || (uint32_t)wr->num_sge > s->max_send_sge)
      rc = EINVAL;
    else if (wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM &&
             wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_SEND_WITH_IMM &&
             wr->opcode != IBV_WR_RDMA_READ)
      rc = EINVAL;
    else if (wr->opcode == IBV_WR_RDMA_READ && (wr->send_flags & IBV_SEND_INLINE))
      rc = EINVAL; /* a read's data comes back: nothing to inline */
    else if ((wr->send_flags & IBV_SEND_INLINE) && total > s->max_inline)
      rc = EINVAL;
    else if (q->outstanding >= s->max_send_wr)
      rc = ENOMEM; /* unsignaled ones still count */
    if (rc) break;
    emu_swqe *w = &q->sq[(q->sq_head + q->sq_count) % q->sq_cap];
    *w = (emu_swqe){
        .wr_id = wr->wr_id,
        .opcode = wr->opcode,
        .flags = wr->send_flags,
        .imm = wr->imm_data,
        .raddr = wr->wr.rdma.remote_addr,
        .rkey = wr->wr.rdma.rkey,
        .num_sge = wr->num_sge,
        .ready_at = emu.cfg.delay_us
                        ? emu_now() + emu.cfg.delay_us * 1e-6 *
                                          (emu.cfg.reorder ? rand() / (double)RAND_MAX : 1)
                        : 0};
    if (wr->send_flags & IBV_SEND_INLINE) { /* the data is copied now: the buffer is free */
      w->inline_data = malloc(total ? total : 1);
      if (!w->inline_data) {
        rc = ENOMEM;
        break;
      }
      for (int i = 0, off = 0; i < wr->num_sge; off += (int)wr->sg_list[i].length, i++)
        memcpy(w->inline_data + off, (void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
      w->inline_len = total;
    } else {
      for (int i = 0; i < wr->num_sge; i++)
        w->sge[i] = (emu_sge){wr->sg_list[i].addr, wr->sg_list[i].length, wr->sg_list[i].lkey};
    }
    q->sq_count++;
    q->outstanding++;
  }
  if (rc) *bad = wr;
  if (!emu.cfg.delay_us && !emu.cfg.reorder) emu_qp_progress(q, 1 << 30);
  pthread_mutex_unlock(&q->sq_lock);
  EMU_COUNT(data_calls, 1);
  EMU_COUNT(emu_ns, emu_ns() - t0);
  return rc;
}

/* The region's event queue is the process's, but an async event belongs to
 * the context of the QP or CQ it names (ibv_get_async_event(3)): another
 * context must neither take it nor be woken by it. With emu_local_lock and
 * the region locked: the position after ev_head of the oldest event for `c`
 * (one whose QP or CQ is gone goes to whoever asks), or -1. */
static int emu_event_for(const emu_region *r, const emu_ctx *c) {
  for (uint32_t k = r->ev_head; k != r->ev_tail; k++) {
    const emu_event *e = &r->ev[k % EMU_MAX_EVENTS];
    const struct ibv_context *owner = NULL;
    if (e->qp >= 0 && emu.qps[e->qp])
      owner = emu.qps[e->qp]->qp.context;
    else if (e->cq >= 0 && emu.cqs[e->cq])
      owner = emu.cqs[e->cq]->cq.context;
    if (!owner || owner == &c->ctx) return (int)(k - r->ev_head);
  }
  return -1;
}

static bool emu_events_pending(emu_ctx *c) {
  emu_region *r = emu.region;
  pthread_mutex_lock(&emu_local_lock);
  emu_lock(r);
  bool any = emu_event_for(r, c) >= 0;
  emu_unlock(r);
  pthread_mutex_unlock(&emu_local_lock);
  return any;
}

static void emu_signal_events(emu_ctx *c) {
  if (c->event_signaled) return;
  emu_region *r = emu.region;
  emu_lock(r); /* the cheap test first: the table lock is the process's */
  bool none = r->ev_head == r->ev_tail;
  emu_unlock(r);
  if (none || !emu_events_pending(c)) return;
  uint64_t one = 1;
  if (write(c->ctx.async_fd, &one, sizeof one) == sizeof one) c->event_signaled = 1;
}

static void emu_unsignal_events(emu_ctx *c) {
  uint64_t v;
  if (c->event_signaled && read(c->ctx.async_fd, &v, sizeof v) == sizeof v) c->event_signaled = 0;
}

static int emu_data_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) {
  uint64_t t0 = emu_ns();
  emu_cq *c = (emu_cq *)cq;
  emu_region *r = emu.region;
  emu_progress_all();
  emu_signal_events((emu_ctx *)cq->context);
  int got = 0;
  emu_lock(r);
  emu_cq_sh *s = &r->cq[c->idx];
  if (s->overrun) {
    emu_unlock(r);
    errno = EOVERFLOW;
    return -1;
  }
  for (; got < n && s->head != s->tail; got++, s->head++) wc[got] = s->wc[s->head % EMU_MAX_CQE];
  emu_unlock(r);
  /* The send-queue slots each send completion frees, under the QP's lock
   * (the region lock is dropped first: the QP lock is always taken before
   * it). Its batch was queued with the completion, so it is there. */
  for (int i = 0; i < got; i++) {
    if (wc[i].opcode & IBV_WC_RECV) continue;
    pthread_mutex_lock(&emu_local_lock);
    emu_qp *q = emu.qps[wc[i].qp_num & 0xff];
    if (q && q->qp.qp_num != wc[i].qp_num) q = NULL; /* destroyed since */
    if (q) pthread_mutex_lock(&q->sq_lock);
    pthread_mutex_unlock(&emu_local_lock);
    if (!q) continue;
    if (q->b_count) {
      q->outstanding -= q->batches[q->b_head];
      q->b_head = (q->b_head + 1) % (q->sq_cap + 1);
      q->b_count--;
    }
    pthread_mutex_unlock(&q->sq_lock);
  }
  EMU_COUNT(data_calls, 1);
  EMU_COUNT(emu_ns, emu_ns() - t0);
  return got;
}

/* ---- async events, fork, strings ---------------------------------------------------- */

EMU_EXPORT int ibv_get_async_event(struct ibv_context *ctx, struct ibv_async_event *ev) {
  emu_ctx *c = (emu_ctx *)ctx;
  emu_region *r = emu.region;
  for (;;) {
    emu_progress_all();
    pthread_mutex_lock(&emu_local_lock);
    emu_lock(r);
    int at = emu_event_for(r, c);
    if (at >= 0) {
      emu_event e = r->ev[(r->ev_head + (uint32_t)at) % EMU_MAX_EVENTS];
      for (uint32_t k = r->ev_head + (uint32_t)at; k + 1 != r->ev_tail; k++) /* close the gap */
        r->ev[k % EMU_MAX_EVENTS] = r->ev[(k + 1) % EMU_MAX_EVENTS];
      r->ev_tail--;
      bool more = emu_event_for(r, c) >= 0;
      memset(ev, 0, sizeof *ev);
      ev->event_type = e.type;
      if (e.qp >= 0 && emu.qps[e.qp])
        ev->element.qp = &emu.qps[e.qp]->qp;
      else if (e.cq >= 0 && emu.cqs[e.cq])
        ev->element.cq = &emu.cqs[e.cq]->cq;
      else
        ev->element.port_num = 1;
      emu_unlock(r);
      pthread_mutex_unlock(&emu_local_lock);
      if (!more) emu_unsignal_events(c);
      return 0;
    }
    emu_unlock(r);
    pthread_mutex_unlock(&emu_local_lock);
    emu_unsignal_events(c); /* woken for an event another context took */
    if (fcntl(ctx->async_fd, F_GETFL) & O_NONBLOCK) {
      errno = EAGAIN;
      return -1;
    }
    struct timespec pause = {0, 1000000};
    nanosleep(&pause, NULL);
  }
}

EMU_EXPORT void ibv_ack_async_event(struct ibv_async_event *ev) {
  (void)ev;
}
EMU_EXPORT int ibv_fork_init(void) {
  return 0;
}
EMU_EXPORT enum ibv_fork_status ibv_is_fork_initialized(void) {
  return IBV_FORK_UNNEEDED;
}

EMU_EXPORT const char *ibv_wc_status_str(enum ibv_wc_status st) {
  switch (st) {
    case IBV_WC_SUCCESS: return "success";
    case IBV_WC_LOC_PROT_ERR: return "local protection error";
    case IBV_WC_WR_FLUSH_ERR: return "Work Request Flushed Error";
    case IBV_WC_REM_ACCESS_ERR: return "remote access error";
    case IBV_WC_REM_OP_ERR: return "remote operation error";
    case IBV_WC_REM_INV_REQ_ERR: return "remote invalid request error";
    case IBV_WC_RETRY_EXC_ERR: return "transport retry counter exceeded";
    case IBV_WC_RNR_RETRY_EXC_ERR: return "RNR retry counter exceeded";
    default: return "unknown";
  }
}

EMU_EXPORT const char *ibv_event_type_str(enum ibv_event_type t) {
  switch (t) {
    case IBV_EVENT_CQ_ERR: return "CQ error";
    case IBV_EVENT_QP_FATAL: return "local work queue catastrophic error";
    case IBV_EVENT_QP_ACCESS_ERR: return "local access violation work queue error";
    case IBV_EVENT_PORT_ERR: return "port error";
    default: return "unknown";
  }
}

EMU_EXPORT void ibv_emu_stats(ibv_emu_counters *out) {
  *out = emu.stats;
  if (emu.region && emu.pid == getpid()) {
    out->recv_landed = emu.region->recv_landed;
    out->max_rq_deficit = emu.region->max_rq_deficit;
  }
}

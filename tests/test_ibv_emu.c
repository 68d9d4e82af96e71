/* test_ibv_emu.c - the verbs emulator (tests/ibv_emu) keeps the RC rules the
 * transport relies on, so a transport bug cannot hide behind a lenient
 * emulator: the QP state machine and its attribute masks, keys, ranges and
 * access flags, write with immediate, receiver-not-ready, retries, unsignaled
 * sends, CQ overrun, flushing after an error, inline limits, order within a
 * QP under delay and reordering, and a write that crosses processes. Then
 * what GPUDirect RDMA needs: RDMA READ (within a process, on a QP connected
 * to itself, across processes, refused without read access), and dma-buf
 * MRs (ibv_reg_dmabuf_mr over a memfd playing the GPU's memory, at device
 * addresses the host cannot touch), whose incoming writes the "GPU" sees
 * only after a flush. Loads the emulator the way weft does (WEFT_IB_LIBRARY,
 * dlvsym by version). */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include <infiniband/verbs.h>

#include "ibv_emu/ibv_emu.h"

static struct {
  struct ibv_device **(*get_device_list)(int *);
  struct ibv_context *(*open_device)(struct ibv_device *);
  int (*close_device)(struct ibv_context *);
  int (*query_port)(struct ibv_context *, uint8_t, struct ibv_port_attr *);
  int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
  struct ibv_pd *(*alloc_pd)(struct ibv_context *);
  struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
  struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *, uint64_t, size_t, uint64_t, int, int);
  int (*dereg_mr)(struct ibv_mr *);
  struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
  struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
  int (*destroy_qp)(struct ibv_qp *);
  int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
  int (*get_async_event)(struct ibv_context *, struct ibv_async_event *);
  ibv_emu_stats_fn stats;
} V;

static struct ibv_context *ctx;
static struct ibv_pd *pd;

static int setup(void **state) {
  (void)state;
  const char *lib = getenv("WEFT_IB_LIBRARY");
  void *h = lib ? dlopen(lib, RTLD_NOW) : NULL;
  if (!h) {
    fprintf(stderr, "WEFT_IB_LIBRARY must name the emulator: %s\n", lib ? dlerror() : "unset");
    return -1;
  }
#define LOAD(m, name, ver) *(void **)&V.m = dlvsym(h, name, ver)
  LOAD(get_device_list, "ibv_get_device_list", "IBVERBS_1.1");
  LOAD(open_device, "ibv_open_device", "IBVERBS_1.1");
  LOAD(close_device, "ibv_close_device", "IBVERBS_1.1");
  LOAD(query_port, "ibv_query_port", "IBVERBS_1.1");
  LOAD(query_gid, "ibv_query_gid", "IBVERBS_1.1");
  LOAD(alloc_pd, "ibv_alloc_pd", "IBVERBS_1.1");
  LOAD(reg_mr, "ibv_reg_mr", "IBVERBS_1.1");
  LOAD(reg_dmabuf_mr, "ibv_reg_dmabuf_mr", "IBVERBS_1.12");
  LOAD(dereg_mr, "ibv_dereg_mr", "IBVERBS_1.1");
  LOAD(create_cq, "ibv_create_cq", "IBVERBS_1.1");
  LOAD(create_qp, "ibv_create_qp", "IBVERBS_1.1");
  LOAD(destroy_qp, "ibv_destroy_qp", "IBVERBS_1.1");
  LOAD(modify_qp, "ibv_modify_qp", "IBVERBS_1.1");
  LOAD(get_async_event, "ibv_get_async_event", "IBVERBS_1.1");
  *(void **)&V.stats = dlsym(h, "ibv_emu_stats");
  if (!V.get_device_list || !V.modify_qp || !V.stats || !V.reg_dmabuf_mr || !V.dereg_mr) return -1;
  int n = 0;
  struct ibv_device **list = V.get_device_list(&n);
  if (!list || n < 1) return -1;
  ctx = V.open_device(list[0]);
  pd = ctx ? V.alloc_pd(ctx) : NULL;
  return pd ? 0 : -1;
}

/* ---- helpers ---------------------------------------------------------------------- */

typedef struct end {
  struct ibv_cq *cq;
  struct ibv_qp *qp;
} end;

static end make_end(int sq, int rq, int cqe, int max_inline) {
  end e;
  e.cq = V.create_cq(ctx, cqe, NULL, NULL, 0);
  assert_non_null(e.cq);
  struct ibv_qp_init_attr ia = {.send_cq = e.cq,
                                .recv_cq = e.cq,
                                .qp_type = IBV_QPT_RC,
                                .cap = {.max_send_wr = (uint32_t)sq,
                                        .max_recv_wr = (uint32_t)rq,
                                        .max_send_sge = 2,
                                        .max_recv_sge = 1,
                                        .max_inline_data = (uint32_t)max_inline}};
  e.qp = V.create_qp(pd, &ia);
  assert_non_null(e.qp);
  return e;
}

static int to_init(struct ibv_qp *qp, int access) {
  struct ibv_qp_attr a = {
      .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = (unsigned)access};
  return V.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static int to_rtr(struct ibv_qp *qp, uint32_t dest_qpn, uint32_t dest_pid) {
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR,
                          .path_mtu = IBV_MTU_1024,
                          .dest_qp_num = dest_qpn,
                          .max_dest_rd_atomic = 1,
                          .min_rnr_timer = 12};
  a.ah_attr.port_num = 1;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.sgid_index = 3;
  /* the emulator's GIDs carry the pid: ask the device of that process */
  if (dest_pid == (uint32_t)getpid()) {
    V.query_gid(ctx, 1, 3, &a.ah_attr.grh.dgid);
  } else {
    V.query_gid(ctx, 1, 3, &a.ah_attr.grh.dgid);
    a.ah_attr.grh.dgid.raw[13] = (uint8_t)(dest_pid >> 16);
    a.ah_attr.grh.dgid.raw[14] = (uint8_t)(dest_pid >> 8);
    a.ah_attr.grh.dgid.raw[15] = (uint8_t)dest_pid;
  }
  return V.modify_qp(qp, &a,
                     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

static int to_rts(struct ibv_qp *qp, int retry, int rnr_retry) {
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTS,
                          .timeout = 14,
                          .retry_cnt = (uint8_t)retry,
                          .rnr_retry = (uint8_t)rnr_retry,
                          .max_rd_atomic = 1};
  return V.modify_qp(qp, &a,
                     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                         IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static void connect_pair_access(end *a, end *b, int rnr_retry, int access) {
  assert_int_equal(to_init(a->qp, access), 0);
  assert_int_equal(to_init(b->qp, access), 0);
  assert_int_equal(to_rtr(a->qp, b->qp->qp_num, (uint32_t)getpid()), 0);
  assert_int_equal(to_rtr(b->qp, a->qp->qp_num, (uint32_t)getpid()), 0);
  assert_int_equal(to_rts(a->qp, 1, rnr_retry), 0);
  assert_int_equal(to_rts(b->qp, 1, rnr_retry), 0);
}

static void connect_pair(end *a, end *b, int rnr_retry) {
  connect_pair_access(a, b, rnr_retry, IBV_ACCESS_REMOTE_WRITE);
}

/* A QP whose peer is itself, as NCCL's GPUDirect flush QP is. */
static void connect_self(end *e, int access) {
  assert_int_equal(to_init(e->qp, access), 0);
  assert_int_equal(to_rtr(e->qp, e->qp->qp_num, (uint32_t)getpid()), 0);
  assert_int_equal(to_rts(e->qp, 1, 7), 0);
}

static int post_write(struct ibv_qp *qp, struct ibv_mr *lmr, void *src, uint32_t len,
                      uint64_t raddr, uint32_t rkey, int imm, uint32_t imm_value, int flags) {
  struct ibv_sge sge = {.addr = (uintptr_t)src, .length = len, .lkey = lmr ? lmr->lkey : 0};
  struct ibv_send_wr wr = {.wr_id = imm_value,
                           .sg_list = &sge,
                           .num_sge = 1,
                           .opcode = imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE,
                           .send_flags = (unsigned)flags,
                           .imm_data = htonl(imm_value)},
                     *bad;
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  return qp->context->ops.post_send(qp, &wr, &bad);
}

static int post_read(struct ibv_qp *qp, uint32_t lkey, void *dst, uint32_t len, uint64_t raddr,
                     uint32_t rkey, uint64_t id, int flags) {
  struct ibv_sge sge = {.addr = (uintptr_t)dst, .length = len, .lkey = lkey};
  struct ibv_send_wr wr = {.wr_id = id,
                           .sg_list = &sge,
                           .num_sge = 1,
                           .opcode = IBV_WR_RDMA_READ,
                           .send_flags = (unsigned)flags},
                     *bad;
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  return qp->context->ops.post_send(qp, &wr, &bad);
}

static int post_recv(struct ibv_qp *qp, uint64_t id) {
  struct ibv_recv_wr wr = {.wr_id = id, .num_sge = 0}, *bad;
  return qp->context->ops.post_recv(qp, &wr, &bad);
}

/* Polls until `want` completions arrived or 2 s passed; returns how many. */
static int poll_n(struct ibv_cq *cq, struct ibv_wc *wc, int want) {
  int got = 0;
  for (int spins = 0; got < want && spins < 2000; spins++) {
    int n = cq->context->ops.poll_cq(cq, want - got, wc + got);
    if (n < 0) return n;
    got += n;
    if (got < want) usleep(1000);
  }
  return got;
}

/* ---- cases -------------------------------------------------------------------------- */

static void state_machine_masks(void **state) {
  (void)state;
  end e = make_end(4, 4, 16, 0);
  struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR};
  assert_int_equal(V.modify_qp(e.qp, &a, IBV_QP_STATE), EINVAL); /* RESET -> RTR skips INIT */
  struct ibv_qp_attr i = {.qp_state = IBV_QPS_INIT, .port_num = 1};
  assert_int_equal(V.modify_qp(e.qp, &i, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT), EINVAL);
  i.port_num = 2;
  assert_int_equal(
      V.modify_qp(e.qp, &i, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
      EINVAL); /* no port 2 */
  assert_int_equal(to_init(e.qp, IBV_ACCESS_REMOTE_WRITE), 0);
  /* sending before RTS is refused */
  char buf[8];
  assert_int_equal(post_write(e.qp, NULL, buf, 0, 0, 0, 0, 0, 0), EINVAL);
  struct ibv_qp_attr r = {.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = 1};
  r.ah_attr.port_num = 1;
  r.ah_attr.is_global = 1;
  r.ah_attr.grh.sgid_index = 3;
  int need = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  assert_int_equal(V.modify_qp(e.qp, &r, need & ~IBV_QP_MIN_RNR_TIMER), EINVAL);
  assert_int_equal(V.modify_qp(e.qp, &r, need | IBV_QP_SQ_PSN), EINVAL); /* RTS's attribute */
  r.ah_attr.is_global = 0; /* RoCE without a GRH reaches nothing */
  assert_int_equal(V.modify_qp(e.qp, &r, need), EINVAL);
  r.ah_attr.is_global = 1;
  assert_int_equal(V.modify_qp(e.qp, &r, need), 0);
  struct ibv_qp_attr s = {.qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7};
  int rts = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
            IBV_QP_MAX_QP_RD_ATOMIC;
  assert_int_equal(V.modify_qp(e.qp, &s, rts & ~IBV_QP_RETRY_CNT), EINVAL);
  assert_int_equal(V.modify_qp(e.qp, &s, rts), 0);
  struct ibv_qp_attr back = {.qp_state = IBV_QPS_INIT};
  assert_int_equal(V.modify_qp(e.qp, &back, IBV_QP_STATE), EINVAL); /* RTS -> INIT */
  struct ibv_qp_attr reset = {.qp_state = IBV_QPS_RESET};
  assert_int_equal(V.modify_qp(e.qp, &reset, IBV_QP_STATE), 0);
  V.destroy_qp(e.qp);
}

static void write_with_immediate(void **state) {
  (void)state;
  end a = make_end(8, 8, 32, 0), b = make_end(8, 8, 32, 0);
  connect_pair(&a, &b, 7);
  char src[100], dst[128];
  for (int i = 0; i < 100; i++) src[i] = (char)(rand() & 0xff);
  memset(dst, 0, sizeof dst);
  struct ibv_mr *smr = V.reg_mr(pd, src, sizeof src, IBV_ACCESS_LOCAL_WRITE);
  struct ibv_mr *dmr =
      V.reg_mr(pd, dst, sizeof dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  assert_int_equal(post_recv(b.qp, 77), 0);
  assert_int_equal(
      post_write(a.qp, smr, src, 100, (uintptr_t)dst + 8, dmr->rkey, 1, 0x1234, IBV_SEND_SIGNALED),
      0);
  struct ibv_wc wc[2];
  assert_int_equal(poll_n(a.cq, wc, 1), 1);
  assert_int_equal(wc[0].status, IBV_WC_SUCCESS);
  assert_int_equal(wc[0].opcode, IBV_WC_RDMA_WRITE);
  assert_int_equal(poll_n(b.cq, wc, 1), 1);
  assert_int_equal(wc[0].status, IBV_WC_SUCCESS);
  assert_int_equal(wc[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  assert_true(wc[0].wc_flags & IBV_WC_WITH_IMM);
  assert_int_equal(wc[0].imm_data, htonl(0x1234)); /* network order, as posted */
  assert_int_equal(wc[0].byte_len, 100);
  assert_int_equal(wc[0].wr_id, 77);
  assert_memory_equal(dst + 8, src, 100);
  assert_int_equal(dst[0], 0);
}

static void keys_ranges_and_access(void **state) {
  (void)state;
  char src[64], dst[64];
  struct ibv_mr *smr = V.reg_mr(pd, src, sizeof src, IBV_ACCESS_LOCAL_WRITE);
  struct ibv_mr *ro = V.reg_mr(pd, dst, sizeof dst, IBV_ACCESS_LOCAL_WRITE); /* no remote write */
  struct ibv_mr *rw =
      V.reg_mr(pd, dst, sizeof dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  assert_null(V.reg_mr(pd, dst, sizeof dst, IBV_ACCESS_REMOTE_WRITE)); /* needs LOCAL_WRITE */
  struct {
    struct ibv_mr *lmr;
    uint32_t rkey;
    uint64_t raddr;
    uint32_t len;
    enum ibv_wc_status want;
  } cases[] = {
      {smr, ro->rkey, (uintptr_t)dst, 8, IBV_WC_REM_ACCESS_ERR},        /* access flags */
      {smr, rw->rkey + 1024, (uintptr_t)dst, 8, IBV_WC_REM_ACCESS_ERR}, /* unknown rkey */
      {smr, rw->rkey, (uintptr_t)dst + 60, 8, IBV_WC_REM_ACCESS_ERR},   /* past the end */
      {ro, rw->rkey, (uintptr_t)dst, 8, IBV_WC_LOC_PROT_ERR},           /* lkey of another range */
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    end a = make_end(8, 8, 32, 0), b = make_end(8, 8, 32, 0);
    connect_pair(&a, &b, 7);
    assert_int_equal(post_recv(b.qp, 1), 0);
    /* unsignaled, yet an error completes; the one after it is flushed */
    assert_int_equal(
        post_write(a.qp, cases[c].lmr, src, cases[c].len, cases[c].raddr, cases[c].rkey, 0, 1, 0),
        0);
    assert_int_equal(post_write(a.qp, smr, src, 8, (uintptr_t)dst, rw->rkey, 0, 2, 0), 0);
    struct ibv_wc wc[2];
    assert_int_equal(poll_n(a.cq, wc, 2), 2);
    assert_int_equal(wc[0].status, cases[c].want);
    assert_int_equal(wc[1].status, IBV_WC_WR_FLUSH_ERR);
  }
}

static void receiver_not_ready_then_retry_exceeded(void **state) {
  (void)state;
  ibv_emu_counters before, after;
  V.stats(&before);
  end a = make_end(8, 8, 32, 0), b = make_end(8, 8, 32, 0);
  connect_pair(&a, &b, 2); /* three tries */
  char src[16], dst[16];
  struct ibv_mr *smr = V.reg_mr(pd, src, sizeof src, IBV_ACCESS_LOCAL_WRITE);
  struct ibv_mr *dmr =
      V.reg_mr(pd, dst, sizeof dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  assert_int_equal(post_write(a.qp, smr, src, 16, (uintptr_t)dst, dmr->rkey, 1, 5, 0), 0);
  struct ibv_wc wc;
  assert_int_equal(poll_n(a.cq, &wc, 1), 1);
  assert_int_equal(wc.status, IBV_WC_RNR_RETRY_EXC_ERR);
  V.stats(&after);
  assert_int_equal(after.rnr_naks - before.rnr_naks, 3);
  /* a plain write needs no receive */
  end c = make_end(8, 8, 32, 0), d = make_end(8, 8, 32, 0);
  connect_pair(&c, &d, 0);
  assert_int_equal(
      post_write(c.qp, smr, src, 16, (uintptr_t)dst, dmr->rkey, 0, 5, IBV_SEND_SIGNALED), 0);
  assert_int_equal(poll_n(c.cq, &wc, 1), 1);
  assert_int_equal(wc.status, IBV_WC_SUCCESS);
  /* a destroyed target answers nothing: transport retries, then the error */
  V.destroy_qp(d.qp);
  assert_int_equal(post_write(c.qp, smr, src, 16, (uintptr_t)dst, dmr->rkey, 0, 6, 0), 0);
  assert_int_equal(poll_n(c.cq, &wc, 1), 1);
  assert_int_equal(wc.status, IBV_WC_RETRY_EXC_ERR);
}

static void unsignaled_sends_hold_queue_slots(void **state) {
  (void)state;
  end a = make_end(3, 8, 32, 0), b = make_end(8, 8, 32, 0);
  connect_pair(&a, &b, 7);
  char src[16], dst[16];
  struct ibv_mr *smr = V.reg_mr(pd, src, sizeof src, IBV_ACCESS_LOCAL_WRITE);
  struct ibv_mr *dmr =
      V.reg_mr(pd, dst, sizeof dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  for (int i = 0; i < 2; i++)
    assert_int_equal(post_write(a.qp, smr, src, 16, (uintptr_t)dst, dmr->rkey, 0, 1, 0), 0);
  struct ibv_wc wc[4];
  usleep(5000);
  assert_int_equal(a.cq->context->ops.poll_cq(a.cq, 4, wc), 0); /* no completion for them */
  assert_int_equal(
      post_write(a.qp, smr, src, 16, (uintptr_t)dst, dmr->rkey, 0, 9, IBV_SEND_SIGNALED), 0);
  /* the queue holds 3: the fourth waits until the signaled completion is polled */
  assert_int_equal(post_write(a.qp, smr, src, 16, (uintptr_t)dst, dmr->rkey, 0, 1, 0), ENOMEM);
  assert_int_equal(poll_n(a.cq, wc, 1), 1);
  assert_int_equal(wc[0].wr_id, 9);
  assert_int_equal(post_write(a.qp, smr, src, 16, (uintptr_t)dst, dmr->rkey, 0, 1, 0), 0);
}

static void inline_limit_and_copy(void **state) {
  (void)state;
  end a = make_end(8, 8, 32, 16), b = make_end(8, 8, 32, 0);
  connect_pair(&a, &b, 7);
  char src[32] = "inline payload!", dst[32] = {0};
  struct ibv_mr *dmr =
      V.reg_mr(pd, dst, sizeof dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  assert_int_equal(
      post_write(a.qp, NULL, src, 32, (uintptr_t)dst, dmr->rkey, 0, 1, IBV_SEND_INLINE),
      EINVAL); /* over max_inline_data */
  assert_int_equal(post_write(a.qp, NULL, src, 16, (uintptr_t)dst, dmr->rkey, 0, 1,
                              IBV_SEND_INLINE | IBV_SEND_SIGNALED),
                   0);
  memset(src, 'x', sizeof src); /* inline data was taken at post time */
  struct ibv_wc wc;
  assert_int_equal(poll_n(a.cq, &wc, 1), 1);
  assert_int_equal(wc.status, IBV_WC_SUCCESS);
  assert_string_equal(dst, "inline payload!");
}

static void cq_overrun_detected(void **state) {
  (void)state;
  end a = make_end(8, 8, 32, 0), b = make_end(8, 8, 2, 0); /* b's CQ holds 2 */
  connect_pair(&a, &b, 7);
  char src[8], dst[8];
  struct ibv_mr *smr = V.reg_mr(pd, src, sizeof src, IBV_ACCESS_LOCAL_WRITE);
  struct ibv_mr *dmr =
      V.reg_mr(pd, dst, sizeof dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(post_recv(b.qp, (uint64_t)i), 0);
    assert_int_equal(post_write(a.qp, smr, src, 8, (uintptr_t)dst, dmr->rkey, 1, (uint32_t)i, 0),
                     0);
  }
  struct ibv_wc wc[4];
  assert_int_equal(poll_n(a.cq, wc, 1), 1); /* the third write failed at the responder */
  assert_int_equal(wc[0].status, IBV_WC_REM_OP_ERR);
  assert_int_equal(b.cq->context->ops.poll_cq(b.cq, 4, wc), -1);
  /* earlier cases left access-error events: the CQ error is among them */
  fcntl(ctx->async_fd, F_SETFL, fcntl(ctx->async_fd, F_GETFL) | O_NONBLOCK);
  struct ibv_async_event ev;
  int cq_err = 0;
  while (V.get_async_event(ctx, &ev) == 0)
    if (ev.event_type == IBV_EVENT_CQ_ERR && ev.element.cq == b.cq) cq_err++;
  assert_int_equal(cq_err, 1);
}

static void order_within_a_qp_only(void **state) {
  (void)state;
  /* reordering across queue pairs is the config's business (a child
   * process with IBV_EMU_CONFIG); here: one QP keeps the order it was given */
  end a = make_end(64, 64, 256, 0), b = make_end(64, 64, 256, 0);
  connect_pair(&a, &b, 7);
  char src[8], dst[8];
  struct ibv_mr *smr = V.reg_mr(pd, src, sizeof src, IBV_ACCESS_LOCAL_WRITE);
  struct ibv_mr *dmr =
      V.reg_mr(pd, dst, sizeof dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  for (uint32_t i = 0; i < 50; i++) {
    assert_int_equal(post_recv(b.qp, i), 0);
    assert_int_equal(post_write(a.qp, smr, src, 8, (uintptr_t)dst, dmr->rkey, 1, i,
                                i % 8 == 7 ? IBV_SEND_SIGNALED : 0),
                     0);
    if (i % 8 == 7) {
      struct ibv_wc w;
      assert_int_equal(poll_n(a.cq, &w, 1), 1);
    }
  }
  struct ibv_wc wc[50];
  assert_int_equal(poll_n(b.cq, wc, 50), 50);
  for (uint32_t i = 0; i < 50; i++) assert_int_equal(ntohl(wc[i].imm_data), i);
}

/* Writes from another process (process_vm_writev), with delays and random
 * service order across two QPs in the sender: each QP's immediates arrive in
 * the order posted, and the bytes land where the rkey allows. */
static void across_processes_with_reordering(void **state) {
  (void)state;
  int to_child[2], to_parent[2];
  assert_int_equal(pipe(to_child), 0);
  assert_int_equal(pipe(to_parent), 0);
  struct msg {
    uint32_t pid, qpn[2], rkey;
    uint64_t addr;
  } mine, theirs;
  static char buf[4096];
  memset(buf, 0, sizeof buf);
  pid_t child = fork();
  if (child == 0) { /* the sender */
    setenv("IBV_EMU_CONFIG", "delay_us=300,reorder", 1);
    int n;
    ctx = V.open_device(V.get_device_list(&n)[0]); /* a fresh region for this process */
    pd = V.alloc_pd(ctx);
    end q[2] = {make_end(64, 8, 256, 0), make_end(64, 8, 256, 0)};
    mine = (struct msg){(uint32_t)getpid(), {q[0].qp->qp_num, q[1].qp->qp_num}, 0, 0};
    if (write(to_parent[1], &mine, sizeof mine) != sizeof mine ||
        read(to_child[0], &theirs, sizeof theirs) != sizeof theirs)
      _exit(2);
    for (int i = 0; i < 2; i++)
      if (to_init(q[i].qp, IBV_ACCESS_REMOTE_WRITE) || to_rtr(q[i].qp, theirs.qpn[i], theirs.pid) ||
          to_rts(q[i].qp, 7, 7))
        _exit(3);
    static char src[4096];
    for (int i = 0; i < 4096; i++) src[i] = (char)(i * 7);
    struct ibv_mr *smr = V.reg_mr(pd, src, sizeof src, IBV_ACCESS_LOCAL_WRITE);
    /* everything first, plain, on QP 0: in order before QP 0's immediates */
    if (post_write(q[0].qp, smr, src, 4096, theirs.addr, theirs.rkey, 0, 0, IBV_SEND_SIGNALED))
      _exit(4);
    for (uint32_t i = 0; i < 40; i++)
      for (int k = 0; k < 2; k++)
        if (post_write(q[k].qp, smr, src, 64, theirs.addr, theirs.rkey, 1, i, IBV_SEND_SIGNALED))
          _exit(4);
    struct ibv_wc wc[48];
    if (poll_n(q[0].cq, wc, 41) != 41 || poll_n(q[1].cq, wc, 40) != 40) _exit(5);
    _exit(0);
  }
  if (read(to_parent[0], &theirs, sizeof theirs) != sizeof theirs) fail();
  struct ibv_cq *cq = V.create_cq(ctx, 256, NULL, NULL, 0);
  struct ibv_mr *mr =
      V.reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  struct ibv_qp *qp[2];
  for (int q = 0; q < 2; q++) {
    struct ibv_qp_init_attr ia = {
        .send_cq = cq,
        .recv_cq = cq,
        .qp_type = IBV_QPT_RC,
        .cap = {.max_send_wr = 8, .max_recv_wr = 64, .max_send_sge = 1, .max_recv_sge = 1}};
    qp[q] = V.create_qp(pd, &ia);
    assert_non_null(qp[q]);
    assert_int_equal(post_recv(qp[q], 0), EINVAL); /* not in RESET */
    assert_int_equal(to_init(qp[q], IBV_ACCESS_REMOTE_WRITE), 0);
    for (int i = 0; i < 40; i++) assert_int_equal(post_recv(qp[q], (uint64_t)i), 0);
    assert_int_equal(to_rtr(qp[q], theirs.qpn[q], theirs.pid), 0);
    assert_int_equal(to_rts(qp[q], 7, 7), 0);
  }
  mine = (struct msg){(uint32_t)getpid(), {qp[0]->qp_num, qp[1]->qp_num}, mr->rkey, (uintptr_t)buf};
  assert_int_equal(write(to_child[1], &mine, sizeof mine), sizeof mine);
  struct ibv_wc wc[80];
  assert_int_equal(poll_n(cq, wc, 80), 80);
  uint32_t next[2] = {0, 0};
  int interleaved = 0;
  for (int i = 0; i < 80; i++) {
    int q = wc[i].qp_num == qp[1]->qp_num;
    assert_int_equal(wc[i].status, IBV_WC_SUCCESS);
    assert_int_equal(ntohl(wc[i].imm_data), next[q]);
    next[q]++;
    if (i && (wc[i].qp_num != wc[i - 1].qp_num)) interleaved++;
  }
  for (int i = 0; i < 4096; i++) assert_int_equal(buf[i], (char)(i * 7));
  assert_true(interleaved > 4); /* the QPs did overtake each other */
  int st;
  assert_int_equal(waitpid(child, &st, 0), child);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  printf("# 80 writes from pid %u: %d switches between the two QPs\n", theirs.pid, interleaved);
}

/* ---- RDMA READ and GPUDirect (dma-buf MRs) ------------------------------------------ */

#define RD_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static uint8_t pat(int seed, size_t i) {
  return (uint8_t)(seed * 31 + i * 7 + (i >> 8));
}

/* A memfd playing a GPU's dma-buf: `view` is the host's window on what the
 * GPU sees (for the checks only); `iova` a PROT_NONE reservation standing
 * for the device addresses, which the emulator must never touch (it would
 * crash this test). */
typedef struct gpu_buf {
  int fd;
  uint8_t *view;
  size_t size;
  uint64_t iova;
} gpu_buf;

static gpu_buf make_gpu_buf(size_t size, uint8_t fill) {
  gpu_buf g = {.size = size};
  g.fd = memfd_create("fake-dmabuf", MFD_CLOEXEC);
  assert_true(g.fd >= 0);
  assert_int_equal(ftruncate(g.fd, (off_t)size), 0);
  g.view = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, g.fd, 0);
  assert_true(g.view != MAP_FAILED);
  memset(g.view, fill, size);
  void *dev = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  assert_true(dev != MAP_FAILED);
  g.iova = (uintptr_t)dev;
  return g;
}

static void free_gpu_buf(gpu_buf *g) {
  munmap(g->view, g->size);
  munmap((void *)(uintptr_t)g->iova, g->size);
  close(g->fd);
}

/* NCCL's flush: a one-byte read of the MR through a QP connected to itself. */
static void flush_read(end *f, struct ibv_mr *fmr, uint64_t raddr, uint32_t rkey) {
  assert_int_equal(post_read(f->qp, fmr->lkey, fmr->addr, 1, raddr, rkey, 99, IBV_SEND_SIGNALED),
                   0);
  struct ibv_wc wc;
  assert_int_equal(poll_n(f->cq, &wc, 1), 1);
  assert_int_equal(wc.status, IBV_WC_SUCCESS);
  assert_int_equal(wc.opcode, IBV_WC_RDMA_READ);
}

static end make_flusher(struct ibv_mr **fmr) {
  static uint8_t flushbuf[64];
  end f = make_end(4, 1, 8, 0);
  connect_self(&f, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  *fmr = V.reg_mr(pd, flushbuf, sizeof flushbuf, IBV_ACCESS_LOCAL_WRITE);
  assert_non_null(*fmr);
  return f;
}

static void rdma_read_rules(void **state) {
  (void)state;
  static uint8_t src[4096], dst[4096];
  for (size_t i = 0; i < sizeof src; i++) src[i] = pat(1, i);
  memset(dst, 0, sizeof dst);
  struct ibv_mr *smr = V.reg_mr(pd, src, sizeof src, IBV_ACCESS_REMOTE_READ);
  struct ibv_mr *dmr = V.reg_mr(pd, dst, sizeof dst, IBV_ACCESS_LOCAL_WRITE);
  assert_non_null(smr);
  assert_non_null(dmr);
  end a = make_end(8, 8, 32, 0), b = make_end(8, 8, 32, 0);
  connect_pair_access(&a, &b, 7, RD_ACCESS);
  assert_int_equal(post_recv(b.qp, 5), 0);
  /* remote bytes scattered into two local pieces */
  struct ibv_sge sge[2] = {{(uintptr_t)dst, 1000, dmr->lkey},
                           {(uintptr_t)dst + 2000, 2000, dmr->lkey}};
  struct ibv_send_wr wr = {.wr_id = 42,
                           .sg_list = sge,
                           .num_sge = 2,
                           .opcode = IBV_WR_RDMA_READ,
                           .send_flags = IBV_SEND_SIGNALED},
                     *bad;
  wr.wr.rdma.remote_addr = (uintptr_t)src + 96;
  wr.wr.rdma.rkey = smr->rkey;
  assert_int_equal(a.qp->context->ops.post_send(a.qp, &wr, &bad), 0);
  struct ibv_wc wc[2];
  assert_int_equal(poll_n(a.cq, wc, 1), 1);
  assert_int_equal(wc[0].status, IBV_WC_SUCCESS);
  assert_int_equal(wc[0].opcode, IBV_WC_RDMA_READ);
  assert_int_equal(wc[0].wr_id, 42);
  assert_memory_equal(dst, src + 96, 1000);
  assert_memory_equal(dst + 2000, src + 1096, 2000);
  assert_int_equal(dst[1000], 0);
  assert_int_equal(dst[1999], 0);
  usleep(2000);
  assert_int_equal(b.cq->context->ops.poll_cq(b.cq, 2, wc), 0); /* no receive consumed */
  /* nothing to inline in a read */
  assert_int_equal(post_read(a.qp, dmr->lkey, dst, 8, (uintptr_t)src, smr->rkey, 1,
                             IBV_SEND_INLINE | IBV_SEND_SIGNALED),
                   EINVAL);

  /* a QP connected to itself writes and reads its own process */
  static uint8_t mine[256], back[128];
  for (int i = 0; i < 128; i++) mine[i] = pat(2, (size_t)i);
  memset(mine + 128, 0, 128);
  memset(back, 0, sizeof back);
  struct ibv_mr *mmr = V.reg_mr(pd, mine, sizeof mine, RD_ACCESS);
  struct ibv_mr *bmr = V.reg_mr(pd, back, sizeof back, IBV_ACCESS_LOCAL_WRITE);
  end self = make_end(8, 8, 32, 0);
  connect_self(&self, RD_ACCESS);
  assert_int_equal(post_write(self.qp, mmr, mine, 128, (uintptr_t)mine + 128, mmr->rkey, 0, 0,
                              IBV_SEND_SIGNALED),
                   0);
  assert_int_equal(post_read(self.qp, bmr->lkey, back, 128, (uintptr_t)mine + 128, mmr->rkey, 2,
                             IBV_SEND_SIGNALED),
                   0);
  assert_int_equal(poll_n(self.cq, wc, 2), 2);
  assert_int_equal(wc[0].status, IBV_WC_SUCCESS);
  assert_int_equal(wc[0].opcode, IBV_WC_RDMA_WRITE);
  assert_int_equal(wc[1].status, IBV_WC_SUCCESS);
  assert_int_equal(wc[1].opcode, IBV_WC_RDMA_READ);
  assert_memory_equal(back, mine, 128);

  /* refused: responder QP or MR without read access (both ends to ERR), a
   * local MR that may not be written */
  struct ibv_mr *wonly =
      V.reg_mr(pd, src, sizeof src, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  struct ibv_mr *ronly = V.reg_mr(pd, dst, sizeof dst, IBV_ACCESS_REMOTE_READ);
  struct {
    int qp_access;
    uint32_t lkey, rkey;
    enum ibv_wc_status want;
  } cases[] = {
      {IBV_ACCESS_REMOTE_WRITE, dmr->lkey, smr->rkey, IBV_WC_REM_ACCESS_ERR},
      {RD_ACCESS, dmr->lkey, wonly->rkey, IBV_WC_REM_ACCESS_ERR},
      {RD_ACCESS, ronly->lkey, smr->rkey, IBV_WC_LOC_PROT_ERR},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    end x = make_end(8, 8, 32, 0), y = make_end(8, 8, 32, 0);
    connect_pair_access(&x, &y, 7, cases[c].qp_access);
    assert_int_equal(post_recv(y.qp, 7), 0);
    assert_int_equal(post_read(x.qp, cases[c].lkey, dst, 64, (uintptr_t)src, cases[c].rkey, 1, 0),
                     0);
    assert_int_equal(post_read(x.qp, dmr->lkey, dst, 64, (uintptr_t)src, smr->rkey, 2, 0), 0);
    assert_int_equal(poll_n(x.cq, wc, 2), 2);
    assert_int_equal(wc[0].status, cases[c].want);
    assert_int_equal(wc[1].status, IBV_WC_WR_FLUSH_ERR);
    if (cases[c].want == IBV_WC_REM_ACCESS_ERR) { /* the responder's receive is flushed */
      assert_int_equal(poll_n(y.cq, wc, 1), 1);
      assert_int_equal(wc[0].status, IBV_WC_WR_FLUSH_ERR);
    } else { /* a local error leaves the responder alone */
      assert_int_equal(y.cq->context->ops.poll_cq(y.cq, 1, wc), 0);
    }
  }
}

/* The receiving process owns GPU memory (a dma-buf MR at an offset off the
 * page grid); another process writes into it with immediates and reads
 * host memory. The completion comes at once, the bytes reach the "GPU" only
 * after a flush: first the receiver's own (loopback QP, same process), then
 * the writer's read of the MR (executed in the writer, applied in the
 * receiver's memory from outside). */
static void gpudirect_write_visible_after_flush_across_processes(void **state) {
  (void)state;
  enum { LEN = 4096, OFF = 100 };
  int to_child[2], to_parent[2];
  assert_int_equal(pipe(to_child), 0);
  assert_int_equal(pipe(to_parent), 0);
  struct msg {
    uint32_t pid, qpn, gpu_rkey, host_rkey;
    uint64_t iova, host;
  } mine, theirs;
  static uint8_t host[LEN];
  for (size_t i = 0; i < LEN; i++) host[i] = pat(3, i);
  gpu_buf g = make_gpu_buf(OFF + 2 * LEN, 0xee);
  pid_t child = fork();
  if (child == 0) { /* the writer */
    alarm(20);      /* never outlive a parent that failed before telling us to go on */
    int n;
    ctx = V.open_device(V.get_device_list(&n)[0]); /* a fresh region for this process */
    pd = V.alloc_pd(ctx);
    end q = make_end(16, 4, 64, 0);
    mine = (struct msg){.pid = (uint32_t)getpid(), .qpn = q.qp->qp_num};
    if (write(to_parent[1], &mine, sizeof mine) != sizeof mine ||
        read(to_child[0], &theirs, sizeof theirs) != sizeof theirs)
      _exit(2);
    if (to_init(q.qp, RD_ACCESS) || to_rtr(q.qp, theirs.qpn, theirs.pid) || to_rts(q.qp, 7, 7))
      _exit(3);
    static uint8_t src[2 * LEN], got[LEN];
    for (size_t i = 0; i < LEN; i++) src[i] = pat(4, i), src[LEN + i] = pat(5, i);
    struct ibv_mr *smr = V.reg_mr(pd, src, sizeof src, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_mr *gmr = V.reg_mr(pd, got, sizeof got, IBV_ACCESS_LOCAL_WRITE);
    struct ibv_wc wc;
    /* a read of another process's host memory */
    if (post_read(q.qp, gmr->lkey, got, LEN, theirs.host, theirs.host_rkey, 1, IBV_SEND_SIGNALED) ||
        poll_n(q.cq, &wc, 1) != 1 || wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RDMA_READ)
      _exit(4);
    for (size_t i = 0; i < LEN; i++)
      if (got[i] != pat(3, i)) _exit(5);
    /* round 1: A into the GPU's memory; the receiver flushes */
    if (post_write(q.qp, smr, src, LEN, theirs.iova, theirs.gpu_rkey, 1, 1, IBV_SEND_SIGNALED) ||
        poll_n(q.cq, &wc, 1) != 1 || wc.status != IBV_WC_SUCCESS)
      _exit(6);
    char go;
    if (read(to_child[0], &go, 1) != 1) _exit(7);
    /* round 2: B over A's second half and beyond; this process's read is the flush */
    ibv_emu_counters before, after;
    V.stats(&before);
    if (post_write(q.qp, smr, src + LEN, LEN, theirs.iova + LEN / 2, theirs.gpu_rkey, 1, 2,
                   IBV_SEND_SIGNALED) ||
        poll_n(q.cq, &wc, 1) != 1 || wc.status != IBV_WC_SUCCESS)
      _exit(8);
    memset(got, 0, sizeof got);
    if (post_read(q.qp, gmr->lkey, got, LEN, theirs.iova + LEN / 2, theirs.gpu_rkey, 3,
                  IBV_SEND_SIGNALED) ||
        poll_n(q.cq, &wc, 1) != 1 || wc.status != IBV_WC_SUCCESS)
      _exit(9);
    for (size_t i = 0; i < LEN; i++)
      if (got[i] != pat(5, i)) _exit(10);
    V.stats(&after);
    if (after.flushes - before.flushes != 1 ||
        after.pending_applied_bytes - before.pending_applied_bytes != LEN)
      _exit(11);
    _exit(0);
  }
  if (read(to_parent[0], &theirs, sizeof theirs) != sizeof theirs) fail();
  struct ibv_mr *gmr = V.reg_dmabuf_mr(pd, OFF, 2 * LEN, g.iova, g.fd, RD_ACCESS);
  assert_non_null(gmr);
  struct ibv_mr *hmr = V.reg_mr(pd, host, LEN, IBV_ACCESS_REMOTE_READ);
  end p = make_end(8, 8, 32, 0);
  assert_int_equal(to_init(p.qp, RD_ACCESS), 0);
  assert_int_equal(post_recv(p.qp, 1), 0);
  assert_int_equal(post_recv(p.qp, 2), 0);
  assert_int_equal(to_rtr(p.qp, theirs.qpn, theirs.pid), 0);
  assert_int_equal(to_rts(p.qp, 7, 7), 0);
  struct ibv_mr *fmr;
  end f = make_flusher(&fmr);
  mine =
      (struct msg){(uint32_t)getpid(), p.qp->qp_num, gmr->rkey, hmr->rkey, g.iova, (uintptr_t)host};
  assert_int_equal(write(to_child[1], &mine, sizeof mine), sizeof mine);
  struct ibv_wc wc;
  assert_int_equal(poll_n(p.cq, &wc, 1), 1);
  assert_int_equal(wc.status, IBV_WC_SUCCESS);
  assert_int_equal(wc.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  assert_int_equal(ntohl(wc.imm_data), 1);
  /* the CPU has the completion; the GPU does not have the bytes */
  static uint8_t want[OFF + 2 * LEN];
  memset(want, 0xee, sizeof want);
  assert_memory_equal(g.view, want, sizeof want);
  ibv_emu_counters before, after;
  V.stats(&before);
  flush_read(&f, fmr, g.iova, gmr->rkey);
  for (size_t i = 0; i < LEN; i++) want[OFF + i] = pat(4, i);
  assert_memory_equal(g.view, want, sizeof want);
  assert_int_equal(((uint8_t *)fmr->addr)[0], pat(4, 0));
  V.stats(&after);
  assert_int_equal(after.flushes - before.flushes, 1);
  assert_int_equal(after.pending_applied_bytes - before.pending_applied_bytes, LEN);
  /* a read of a dma-buf MR with nothing pending is no flush */
  flush_read(&f, fmr, g.iova, gmr->rkey);
  V.stats(&before);
  assert_int_equal(before.flushes, after.flushes);

  assert_int_equal(write(to_child[1], "g", 1), 1);
  assert_int_equal(poll_n(p.cq, &wc, 1), 1);
  assert_int_equal(wc.status, IBV_WC_SUCCESS);
  assert_int_equal(ntohl(wc.imm_data), 2);
  int st;
  assert_int_equal(waitpid(child, &st, 0), child);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  /* the writer's read was the flush, applied in this process's memory */
  for (size_t i = 0; i < LEN; i++) want[OFF + LEN / 2 + i] = pat(5, i);
  assert_memory_equal(g.view, want, sizeof want);
  V.stats(&after);
  assert_int_equal(after.flushes, before.flushes); /* counted where it was executed */
  assert_int_equal(V.dereg_mr(gmr), 0);
  free_gpu_buf(&g);
  for (int i = 0; i < 2; i++) close(to_child[i]), close(to_parent[i]);
}

/* The GPU's memory as a write's source and as a read's destination (through
 * the dma-buf, never the device addresses), and the NIC reading what it wrote. */
static void gpudirect_source_and_read_destination(void **state) {
  (void)state;
  enum { OFF = 4000, LEN = 6000 }; /* off the page grid, across pages */
  gpu_buf g = make_gpu_buf(3 * 4096, 0);
  for (size_t i = 0; i < g.size; i++) g.view[i] = pat(6, i);
  struct ibv_mr *gmr = V.reg_dmabuf_mr(pd, OFF, LEN, g.iova, g.fd, RD_ACCESS);
  assert_non_null(gmr);
  end a = make_end(8, 8, 32, 0), b = make_end(8, 8, 32, 0);
  connect_pair_access(&a, &b, 7, RD_ACCESS);
  static uint8_t dst[LEN], src[512];
  memset(dst, 0, sizeof dst);
  for (size_t i = 0; i < sizeof src; i++) src[i] = pat(7, i);
  struct ibv_mr *dmr = V.reg_mr(pd, dst, sizeof dst, RD_ACCESS);
  struct ibv_mr *smr = V.reg_mr(pd, src, sizeof src, RD_ACCESS);
  struct ibv_wc wc;
  /* a write from the GPU's memory sends the dma-buf's bytes */
  assert_int_equal(post_write(a.qp, gmr, (void *)(uintptr_t)(g.iova + 10), 5000, (uintptr_t)dst,
                              dmr->rkey, 0, 0, IBV_SEND_SIGNALED),
                   0);
  assert_int_equal(poll_n(a.cq, &wc, 1), 1);
  assert_int_equal(wc.status, IBV_WC_SUCCESS);
  assert_memory_equal(dst, g.view + OFF + 10, 5000);
  /* a read into the GPU's memory lands in the dma-buf */
  assert_int_equal(post_read(a.qp, gmr->lkey, (void *)(uintptr_t)(g.iova + 100), 512,
                             (uintptr_t)src, smr->rkey, 1, IBV_SEND_SIGNALED),
                   0);
  assert_int_equal(poll_n(a.cq, &wc, 1), 1);
  assert_int_equal(wc.status, IBV_WC_SUCCESS);
  assert_memory_equal(g.view + OFF + 100, src, 512);
  /* a write into it is not seen by the GPU, but the NIC's own read of it
   * as a source sees it */
  assert_int_equal(
      post_write(a.qp, smr, src, 64, g.iova + 2000, gmr->rkey, 0, 0, IBV_SEND_SIGNALED), 0);
  assert_int_equal(poll_n(a.cq, &wc, 1), 1);
  assert_int_equal(wc.status, IBV_WC_SUCCESS);
  assert_int_equal(g.view[OFF + 2000], pat(6, OFF + 2000));
  assert_int_equal(post_write(a.qp, gmr, (void *)(uintptr_t)(g.iova + 2000), 64, (uintptr_t)dst,
                              dmr->rkey, 0, 0, IBV_SEND_SIGNALED),
                   0);
  assert_int_equal(poll_n(a.cq, &wc, 1), 1);
  assert_int_equal(wc.status, IBV_WC_SUCCESS);
  assert_memory_equal(dst, src, 64);
  /* past the MR's end is a local protection error, as for host memory */
  assert_int_equal(post_write(b.qp, gmr, (void *)(uintptr_t)(g.iova + LEN - 8), 16, (uintptr_t)dst,
                              dmr->rkey, 0, 0, 0),
                   0);
  assert_int_equal(poll_n(b.cq, &wc, 1), 1);
  assert_int_equal(wc.status, IBV_WC_LOC_PROT_ERR);
  assert_int_equal(V.dereg_mr(gmr), 0);
  free_gpu_buf(&g);
}

static void dmabuf_registration_failures(void **state) {
  (void)state;
  ibv_emu_counters before, after;
  V.stats(&before);
  gpu_buf g = make_gpu_buf(4096, 0);
  errno = 0;
  assert_null(V.reg_dmabuf_mr(pd, 0, 4096, g.iova, -1, IBV_ACCESS_LOCAL_WRITE));
  assert_int_equal(errno, EBADF);
  errno = 0; /* past the buffer's end */
  assert_null(V.reg_dmabuf_mr(pd, 100, 4096, g.iova, g.fd, IBV_ACCESS_LOCAL_WRITE));
  assert_int_equal(errno, EINVAL);
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", g.fd);
  int ro = open(path, O_RDONLY | O_CLOEXEC); /* mmap says no to a writable shared mapping */
  assert_true(ro >= 0);
  errno = 0;
  assert_null(V.reg_dmabuf_mr(pd, 0, 4096, g.iova, ro, IBV_ACCESS_LOCAL_WRITE));
  assert_int_equal(errno, EACCES);
  close(ro);
  V.stats(&after);
  assert_int_equal(after.mrs_live, before.mrs_live);
  assert_int_equal(after.dmabuf_registered, before.dmabuf_registered);
  /* a NIC or kernel without dma-buf support, in a process configured so */
  pid_t child = fork();
  if (child == 0) {
    setenv("IBV_EMU_CONFIG", "no_dmabuf", 1);
    int n;
    ctx = V.open_device(V.get_device_list(&n)[0]);
    pd = V.alloc_pd(ctx);
    errno = 0;
    if (V.reg_dmabuf_mr(pd, 0, 4096, g.iova, g.fd, IBV_ACCESS_LOCAL_WRITE) || errno != EOPNOTSUPP)
      _exit(2);
    static char buf[64];
    if (!V.reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE)) _exit(3); /* host memory still */
    _exit(0);
  }
  int st;
  assert_int_equal(waitpid(child, &st, 0), child);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  struct ibv_mr *mr = V.reg_dmabuf_mr(pd, 0, 4096, g.iova, g.fd, IBV_ACCESS_LOCAL_WRITE);
  assert_non_null(mr); /* here, the same succeeds */
  assert_int_equal(V.dereg_mr(mr), 0);
  free_gpu_buf(&g);
}

static void mr_counters_and_dereg(void **state) {
  (void)state;
  ibv_emu_counters before, mid, after;
  V.stats(&before);
  static uint8_t buf[64];
  memset(buf, 'x', sizeof buf);
  gpu_buf g = make_gpu_buf(8192, 0);
  struct ibv_mr *hmr = V.reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
  struct ibv_mr *gmr = V.reg_dmabuf_mr(pd, 0, 8192, g.iova, g.fd, RD_ACCESS);
  assert_non_null(hmr);
  assert_non_null(gmr);
  V.stats(&mid);
  assert_int_equal(mid.mrs_live - before.mrs_live, 2);
  assert_int_equal(mid.dmabuf_mrs_live - before.dmabuf_mrs_live, 1);
  assert_int_equal(mid.dmabuf_registered - before.dmabuf_registered, 1);
  /* what the NIC wrote and nobody flushed still reaches the GPU in the end */
  end a = make_end(8, 8, 32, 0), b = make_end(8, 8, 32, 0);
  connect_pair_access(&a, &b, 7, RD_ACCESS);
  assert_int_equal(post_write(a.qp, hmr, buf, 64, g.iova + 8, gmr->rkey, 0, 0, IBV_SEND_SIGNALED),
                   0);
  struct ibv_wc wc;
  assert_int_equal(poll_n(a.cq, &wc, 1), 1);
  assert_int_equal(wc.status, IBV_WC_SUCCESS);
  assert_int_equal(g.view[8], 0);
  assert_int_equal(V.dereg_mr(gmr), 0);
  assert_memory_equal(g.view + 8, buf, 64);
  assert_int_equal(V.dereg_mr(hmr), 0);
  V.stats(&after);
  assert_int_equal(after.mrs_live, before.mrs_live);
  assert_int_equal(after.dmabuf_mrs_live, before.dmabuf_mrs_live);
  assert_int_equal(after.dmabuf_registered - before.dmabuf_registered, 1);
  assert_int_equal(after.pending_applied_bytes - before.pending_applied_bytes, 64);
  assert_int_equal(after.flushes, before.flushes);
  free_gpu_buf(&g);
}

/* Adjacent writes make one pending range; writes to many distinct places
 * overflow the list (the oldest become visible early); after a flush every
 * byte is right and nothing else changed. */
static void pending_overflow_keeps_bytes_right(void **state) {
  (void)state;
  enum { SIZE = 16384 };
  gpu_buf g = make_gpu_buf(SIZE, 0xee);
  struct ibv_mr *gmr = V.reg_dmabuf_mr(pd, 0, SIZE, g.iova, g.fd, RD_ACCESS);
  assert_non_null(gmr);
  static uint8_t src[SIZE], want[SIZE];
  for (size_t i = 0; i < SIZE; i++) src[i] = pat(8, i);
  memset(want, 0xee, sizeof want);
  struct ibv_mr *smr = V.reg_mr(pd, src, sizeof src, IBV_ACCESS_LOCAL_WRITE);
  end a = make_end(8, 8, 32, 0), b = make_end(8, 8, 32, 0);
  connect_pair_access(&a, &b, 7, RD_ACCESS);
  struct ibv_mr *fmr;
  end f = make_flusher(&fmr);
  ibv_emu_counters before, mid;
  V.stats(&before);
  struct ibv_wc wc;
  for (size_t k = 0; k < 64; k++) {
    assert_int_equal(post_write(a.qp, smr, src + 16 * k, 16, g.iova + 16 * k, gmr->rkey, 0, 0,
                                IBV_SEND_SIGNALED),
                     0);
    assert_int_equal(poll_n(a.cq, &wc, 1), 1);
    assert_int_equal(wc.status, IBV_WC_SUCCESS);
    memcpy(want + 16 * k, src + 16 * k, 16);
  }
  V.stats(&mid);
  assert_int_equal(mid.pending_applied_bytes, before.pending_applied_bytes);
  assert_memory_equal(g.view, want + 1024, 1024); /* 0xee there, as everywhere unwritten */
  size_t last = 0;
  for (size_t k = 0; k < 40; k++) {
    size_t at = 2048 + 256 * k + (k % 5);
    assert_int_equal(
        post_write(a.qp, smr, src + at, 8, g.iova + at, gmr->rkey, 0, 0, IBV_SEND_SIGNALED), 0);
    assert_int_equal(poll_n(a.cq, &wc, 1), 1);
    assert_int_equal(wc.status, IBV_WC_SUCCESS);
    memcpy(want + at, src + at, 8);
    last = at;
  }
  V.stats(&mid);
  assert_true(mid.pending_applied_bytes > before.pending_applied_bytes);
  assert_memory_equal(g.view, src, 1024);            /* the oldest range went early */
  assert_int_equal(g.view[last], 0xee);              /* the newest waits for the flush */
  flush_read(&f, fmr, g.iova + SIZE - 1, gmr->rkey); /* any byte of the MR flushes all of it */
  assert_memory_equal(g.view, want, SIZE);
  V.stats(&mid);
  assert_int_equal(mid.pending_applied_bytes - before.pending_applied_bytes, 1024 + 40 * 8);
  assert_int_equal(mid.flushes - before.flushes, 1);
  assert_int_equal(V.dereg_mr(gmr), 0);
  free_gpu_buf(&g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(state_machine_masks),
      cmocka_unit_test(write_with_immediate),
      cmocka_unit_test(keys_ranges_and_access),
      cmocka_unit_test(receiver_not_ready_then_retry_exceeded),
      cmocka_unit_test(unsignaled_sends_hold_queue_slots),
      cmocka_unit_test(inline_limit_and_copy),
      cmocka_unit_test(cq_overrun_detected),
      cmocka_unit_test(order_within_a_qp_only),
      cmocka_unit_test(across_processes_with_reordering),
      cmocka_unit_test(rdma_read_rules),
      cmocka_unit_test(gpudirect_write_visible_after_flush_across_processes),
      cmocka_unit_test(gpudirect_source_and_read_destination),
      cmocka_unit_test(dmabuf_registration_failures),
      cmocka_unit_test(mr_counters_and_dereg),
      cmocka_unit_test(pending_overflow_keeps_bytes_right),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}

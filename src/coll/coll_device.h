/* coll_device.h - a collective on device buffers (coll_device.c), staged
 * through pinned host memory: the call's device spans are copied to pinned
 * host buffers on the communicator's stream (after the work queued on the
 * user's stream), the algorithm runs on those with the host table, and the
 * result is copied back, with the user's stream waiting for it. This is the
 * first device path: correct for every collective, transport and dtype;
 * the chunk pipeline, the kernels and CUDA IPC replace it where they pay. */
#ifndef WEFT_COLL_DEVICE_H
#define WEFT_COLL_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "src/coll/coll.h"
#include "src/mem/mem.h"

/* What the buffers are, once the call's checks passed, which decides the
 * call's route (task->route, coll.h) once: host buffers leave the call as
 * it is (WEFT_ROUTE_HOST; one flag test where the driver is absent).
 * Device buffers: refused (WEFT_ERR_INVALID, sentence written) when the two
 * are of different kinds or devices; else staged: the call's sendbuf and
 * recvbuf become pinned host buffers, the copy of the send span is queued,
 * and its memory table is the host's. With `now` (a call that completes in
 * its setup: one rank, count 0) the copy is waited for here. */
weft_status weft_coll_stage_in(weft_coll_task *task, const weft_coll_span *span, bool now);

/* Puts the wait for the staged input in front of the call's algorithm
 * (its first step answers WEFT_AGAIN until the copy is done); nothing for
 * host buffers. */
void weft_coll_stage_wrap(weft_coll_task *task);

/* Once the algorithm is done: queues the copy of the result back to the
 * user's buffer (once), then the signal the user's stream waits on, and answers
 * WEFT_AGAIN until it is complete. OK at once for host buffers. */
weft_status weft_coll_stage_out(weft_coll_task *task);

/* The same, waited for here (a call that completes in its setup). */
weft_status weft_coll_stage_out_now(weft_coll_task *task);

/* Staged in slices (route WEFT_ROUTE_SLICED: an allreduce, broadcast or
 * reduce of at least twice WEFT_DEVICE_SLICE_BYTES whose setup set
 * task->slice_start: each buffer a rank has holds count elements):
 * stage_in queued one copy per slice, and the call's advance becomes the
 * slices' (slices_start), which starts the algorithm on each slice with
 * task->slice_start once its copy is done and copies each slice's result
 * back as soon as it is done. */
weft_status weft_coll_stage_slices_start(weft_coll_task *task);

/* A non-blocking call on device buffers, set up and about to be handed to
 * the engine: the user's stream waits from here on, at the point of issue,
 * for the call's result (weft.h: work queued on the stream later waits for
 * it), through a signal word the call's end writes on the communicator's
 * stream (weft_coll_stage_release at the latest, failed or not). A blocking
 * call needs none: it returns once the result is in place. Nothing for
 * host buffers; an error (the driver refused) has its sentence written. */
weft_status weft_coll_device_issue(weft_coll_task *task);

/* A deferred link's other half (task->defer_user_link, a gradient set's
 * buckets): work queued on `stream` later waits until the calls issued up
 * to the one whose value is `signal` (task->device_signal at issue) have
 * ended; signals are written in issue order, so one wait covers all of
 * them. Never blocks. 0, or no device call yet: nothing to wait for. */
weft_status weft_coll_device_stream_wait(weft_core *core, void *stream, uint32_t signal);

/* A message's device buffer (weft_send / weft_recv, src/engine/p2p.c),
 * staged through a block of the communicator's pinned pool: begin orders it
 * after the work queued on the communicator's stream (a send's copy to the
 * host is queued then; with `now`, waited for); the lane sends from, or
 * receives into, weft_coll_device_msg_host; a send's data may leave once
 * msg_ready answers WEFT_OK (WEFT_AGAIN before); a receive's finish copies
 * the data back and waits for it, bounded by the timeout, so the message
 * completes with its result in place (the stream is not made to wait: the
 * host's weft_wait says it is there). end gives the block back, failed or
 * not (once begin set *msg). */
typedef struct weft_device_msg weft_device_msg;
weft_status weft_coll_device_msg_begin(weft_core *core, const char *call, const void *buf, size_t bytes,
                                       bool is_send, bool now, bool lend, weft_device_msg **msg);
/* Within a host a large send lends its device buffer instead (`lend` to
 * msg_begin: nothing staged): the lane sends its descriptor, the peer maps
 * it over CUDA IPC, copies out of it (msg_take) and only then releases the
 * descriptor's chunk, which the sender waits for (the transport's
 * send_released). lendable: CUDA IPC on (WEFT_CUDA_IPC), the peer's
 * transport maps device memory and says when a chunk is released (shm),
 * the buffer has a legacy IPC handle, and the message is at least
 * WEFT_DEVICE_MSG_LEND_CHUNKS chunks: a smaller one stays staged, so that
 * it still completes before its receive is posted where the slots hold
 * it (a lent one completes once received, as NCCL's sends do). */
#define WEFT_DEVICE_MSG_LEND_CHUNKS 16
bool weft_coll_device_msg_lendable(const weft_core *core, int peer, const void *buf, size_t bytes);
bool weft_coll_device_msg_describe(const weft_device_msg *msg, weft_mem_desc *desc);
/* The receiving side: `bytes` out of a peer's mapped device buffer into a
 * receive's device buffer (`msg`, after the stream's earlier work on it;
 * its finish then copies nothing more) or, msg NULL, into host memory `dst`
 * (an unexpected message, a receive into host memory). Waited for, bounded
 * by the timeout. */
weft_status weft_coll_device_msg_take(weft_core *core, const char *call, weft_device_msg *msg, void *dst,
                                      const void *peer_buf, size_t bytes);
void *weft_coll_device_msg_host(const weft_device_msg *msg);
weft_status weft_coll_device_msg_ready(weft_core *core, weft_device_msg *msg);
weft_status weft_coll_device_msg_finish(weft_core *core, const char *call, weft_device_msg *msg);
void weft_coll_device_msg_end(weft_core *core, weft_device_msg *msg);

/* Gives the staging buffers back and lets the user's stream go on past
 * the call (the call ended, however). */
void weft_coll_stage_release(weft_coll_task *task);
/* Its copy alone (the pinned or bounce block, back to its pool once the
 * copies queued on it are done): a bounced call that falls back to staging
 * lets it go before it stages the user's buffers. */
void weft_coll_stage_release_copy(weft_coll_task *task);

/* For a call in place over IPC (coll.c's direct_guard acts on the rounds'
 * answers, algo.h): the communicator's device scratch, right before the
 * call's kernels are queued (coll->device_scratch; grown, waiting for what
 * is queued, where the call needs more), its error worded in the link's
 * sink; and, where a rank cannot map a buffer, this rank's buffers staged
 * through host memory after all (a bounced call's copy given back first),
 * waited for here. */
weft_status weft_coll_device_scratch(weft_coll_task *task);
weft_status weft_coll_device_restage(weft_coll_task *task);

/* The communicator's device state (its stream, its pool of pinned staging
 * buffers): freed at weft_comm_destroy, after every call ended. */
void weft_coll_device_free(weft_core *core);

#endif

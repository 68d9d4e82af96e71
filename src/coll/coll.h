/* coll.h - one collective call, set up and checked (coll.c): the public
 * entry points (src/api) call a setup here, then hand the call to the engine
 * (src/engine), which advances it and asks the rest of this file's calls
 * when it is done or failed. Nothing here calls the engine. */
#ifndef WEFT_COLL_H
#define WEFT_COLL_H

#include <stddef.h>

#include "src/algo/algo.h"
#include "src/coll/core.h"
#include "weft.h"

/* A setup's answer besides OK (give the call to the engine) and errors (the
 * sentence is written): the call is already complete on this rank (count 0,
 * one rank). */
#define WEFT_COLL_DONE ((weft_status)2)

/* Each checks its arguments against `comm` (the core of a communicator the
 * caller found live), takes the call's sequence number and starts its
 * algorithm in `coll`; `call` is the name the user called ("weft_iallreduce"). */
weft_status weft_coll_allreduce_setup(weft_coll *coll, const char *call, weft_core *comm,
                                      const void *sendbuf, void *recvbuf, size_t count,
                                      weft_dtype dtype, weft_op op);
weft_status weft_coll_broadcast_setup(weft_coll *coll, const char *call, weft_core *comm,
                                      const void *sendbuf, void *recvbuf, size_t count,
                                      weft_dtype dtype, int root);
weft_status weft_coll_reduce_setup(weft_coll *coll, const char *call, weft_core *comm,
                                   const void *sendbuf, void *recvbuf, size_t count,
                                   weft_dtype dtype, weft_op op, int root);
weft_status weft_coll_allgather_setup(weft_coll *coll, const char *call, weft_core *comm,
                                      const void *sendbuf, void *recvbuf, size_t sendcount,
                                      weft_dtype dtype);
weft_status weft_coll_reduce_scatter_setup(weft_coll *coll, const char *call, weft_core *comm,
                                           const void *sendbuf, void *recvbuf, size_t recvcount,
                                           weft_dtype dtype, weft_op op);
weft_status weft_coll_gather_setup(weft_coll *coll, const char *call, weft_core *comm,
                                   const void *sendbuf, void *recvbuf, size_t sendcount,
                                   weft_dtype dtype, int root);
weft_status weft_coll_scatter_setup(weft_coll *coll, const char *call, weft_core *comm,
                                    const void *sendbuf, void *recvbuf, size_t recvcount,
                                    weft_dtype dtype, int root);
weft_status weft_coll_alltoall_setup(weft_coll *coll, const char *call, weft_core *comm,
                                     const void *sendbuf, void *recvbuf, size_t count,
                                     weft_dtype dtype);
weft_status weft_coll_barrier_setup(weft_coll *coll, const char *call, weft_core *comm);

/* What the engine asks of a running call. */
/* WEFT_OK once every chunk the call sent is out (its buffers may be reused). */
weft_status weft_coll_flush(weft_coll *coll);
/* The call is over: the peers it touched are no longer its. */
void weft_coll_end(weft_coll *coll);
/* The sentence for a failure the engine saw while driving it; fails the
 * communicator and tells the peers. Returns the status to report. */
weft_status weft_coll_failed(weft_coll *coll, weft_status st);
/* A timeout, worded with `verdict`: what the ranks found out together about
 * whom they waited on (the engine's culprit exchange). */
weft_status weft_coll_timed_out(weft_coll *coll, const char *verdict);
/* Frees what the call's setup held besides the algorithm (WEFT_CHECK's phase,
 * an integer avg's 64-bit buffer; weft_coll.check holds both). */
void weft_coll_release(weft_coll *coll);

#endif

/* tcp_wire.c - the bytes on the wire, apart from who drives them: parsing a
 * handshake and a frame header, writing a stream's queued frames and reading
 * one frame's header and payload. The connection (tcp_conn.c) and the helper
 * threads (tcp_pool.c) both call down into it; it calls neither. */
#include <arpa/inet.h>
#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "src/base/auth.h"
#include "tcp.h"

_Static_assert(TCP_HANDSHAKE_BYTES == sizeof(tcp_handshake) + WEFT_AUTH_MAC_BYTES,
               "tcp.h's handshake length");

static uint32_t tcp_get32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return ntohl(v);
}

weft_status tcp_handshake_parse(const uint8_t *buf, size_t len, tcp_handshake_info *out) {
  if (len < TCP_HANDSHAKE_BYTES) return WEFT_ERR_PROTOCOL;
  out->magic = tcp_get32(buf + offsetof(tcp_handshake, magic));
  out->from = tcp_get32(buf + offsetof(tcp_handshake, from));
  out->to = tcp_get32(buf + offsetof(tcp_handshake, to));
  uint32_t word = tcp_get32(buf + offsetof(tcp_handshake, channel));
  out->channel = word & 0xffffu;
  out->stream = (word >> 16) & 0xffu;
  out->nstreams = word >> 24 ? word >> 24 : 1;
  out->comm_id = ((uint64_t)tcp_get32(buf + offsetof(tcp_handshake, comm_hi)) << 32) |
                 tcp_get32(buf + offsetof(tcp_handshake, comm_lo));
  out->signed_part = buf;
  out->mac = buf + sizeof(tcp_handshake);
  return WEFT_OK;
}

const char *tcp_handshake_check(const tcp_handshake_info *hs, uint32_t my_rank, uint64_t comm_id) {
  if (hs->magic != TCP_HANDSHAKE_MAGIC) return "not a weft handshake";
  if (hs->comm_id != comm_id) return "handshake for another communicator";
  if (hs->channel == TCP_NOTICE_CHANNEL || hs->channel == TCP_PROBE_CHANNEL) /* any other rank */
    return hs->to != my_rank || hs->from == my_rank ? "notice or probe with wrong ranks" : NULL;
  /* the lower rank dials: a dialer claims a rank below ours */
  if (hs->to != my_rank || hs->from >= my_rank) return "handshake with wrong ranks";
  if (hs->channel >= WEFT_TP_CHANNELS) return "handshake for an unknown channel";
  if (hs->nstreams > TCP_MAX_STREAMS || hs->stream >= hs->nstreams)
    return "handshake for an unknown stream";
  return NULL;
}

weft_status tcp_frame_parse(const uint8_t *buf, size_t len, tcp_frame_info *out) {
  if (len < sizeof(tcp_frame_hdr)) return WEFT_ERR_PROTOCOL;
  uint32_t mt = tcp_get32(buf + offsetof(tcp_frame_hdr, magic_type));
  if ((mt & 0xffff0000u) != TCP_FRAME_MAGIC) return WEFT_ERR_PROTOCOL;
  out->type = mt & 0xffffu;
  out->tag = weft_tag_make(tcp_get32(buf + offsetof(tcp_frame_hdr, seq)),
                           tcp_get32(buf + offsetof(tcp_frame_hdr, sig)));
  out->len = tcp_get32(buf + offsetof(tcp_frame_hdr, len));
  out->total = tcp_get32(buf + offsetof(tcp_frame_hdr, total));
  if (!out->total) out->total = out->len;
  return WEFT_OK;
}

ssize_t tcp_stream_write(tcp_stream *s) {
  struct iovec iov[2 * TCP_SEND_DEPTH];
  int n = 0;
  for (int i = 0; i < s->sq_count; i++) {
    tcp_send_entry *e = &s->sq[(s->sq_head + i) % TCP_SEND_DEPTH];
    size_t off = e->sent;
    if (off < sizeof e->hdr) {
      iov[n++] = (struct iovec){(char *)&e->hdr + off, sizeof e->hdr - off};
      off = sizeof e->hdr;
    }
    if (e->len > off - sizeof e->hdr)
      iov[n++] = (struct iovec){(char *)e->src + (off - sizeof e->hdr),
                                e->len - (off - sizeof e->hdr)};
  }
  struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n};
  ssize_t w = sendmsg(s->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  if (w < 0) return -errno;
  size_t left = (size_t)w;
  while (left && s->sq_count) {
    tcp_send_entry *e = &s->sq[s->sq_head];
    size_t need = sizeof e->hdr + e->len - e->sent;
    size_t take = left < need ? left : need;
    e->sent += take;
    left -= take;
    if (e->sent == sizeof e->hdr + e->len) {
      s->sq_head = (s->sq_head + 1) % TCP_SEND_DEPTH;
      s->sq_count--;
    }
  }
  return w;
}

ssize_t tcp_stream_read(tcp_stream *s, char *target, size_t len) {
  struct iovec iov[2];
  int n = 0;
  if (s->rhdr_got < sizeof s->rhdr)
    iov[n++] = (struct iovec){(char *)&s->rhdr + s->rhdr_got, sizeof s->rhdr - s->rhdr_got};
  if (s->rpay_got < len) iov[n++] = (struct iovec){target + s->rpay_got, len - s->rpay_got};
  ssize_t r = readv(s->fd, iov, n);
  if (r < 0) return -errno;
  size_t got = (size_t)r;
  if (s->rhdr_got < sizeof s->rhdr) {
    size_t h = sizeof s->rhdr - s->rhdr_got;
    size_t take = got < h ? got : h;
    s->rhdr_got += take;
    got -= take;
  }
  s->rpay_got += got;
  return r;
}

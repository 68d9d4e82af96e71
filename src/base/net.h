/* net.h - socket helpers shared by the rendezvous and the TCP transport:
 * address parsing and printing, interface selection (WEFT_SOCKET_IFNAME
 * rules), and connect/send/recv bounded by a deadline. */
#ifndef WEFT_NET_H
#define WEFT_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "src/base/error_sink.h"
#include "weft.h"

/* Monotonic clock in seconds. */
double weft_now(void);

/* "host:port", "[v6]:port" or "v6addr" with port -> host, port.
 * WEFT_ERR_INVALID with a sentence in `err` when malformed. */
weft_status net_split_hostport(const char *text, char *host, size_t host_len, int *port,
                               weft_error_sink *err);
/* Resolves host (name or literal) and port; IPv4 first unless family says 6. */
weft_status net_resolve(const char *host, int port, int family, struct sockaddr_storage *out,
                        socklen_t *out_len, weft_error_sink *err);
/* "1.2.3.4:5" or "[::1]:5" into buf (at least 64 bytes). Returns buf. */
const char *net_addr_str(const struct sockaddr *addr, char *buf, size_t len);
int net_addr_port(const struct sockaddr *addr);
void net_addr_set_port(struct sockaddr_storage *addr, int port);
bool net_addr_is_loopback(const struct sockaddr *addr);
/* A socket address as 20 portable bytes (family 4 or 6, 0, big-endian port,
 * 16 address bytes), for the transport's published address and the unique id. */
#define NET_ADDR_PACKED 20
void net_addr_pack(const struct sockaddr_storage *addr, uint8_t out[NET_ADDR_PACKED]);
bool net_addr_unpack(const uint8_t in[NET_ADDR_PACKED], struct sockaddr_storage *addr,
                     socklen_t *len);

/* Does `ifname` pass the WEFT_SOCKET_IFNAME rules? Rules: comma-separated
 * prefixes; "=name" matches exactly; a leading '^' turns the list into
 * exclusions. Empty rules match everything. */
bool net_ifname_match(const char *rules, const char *ifname);
/* Picks a local address by rules and family (0, 4 or 6). Without rules:
 * `hint` if given, else the first up, non-loopback interface that is not a
 * docker/veth bridge, else loopback. Writes the chosen interface's name. */
weft_status net_pick_local_addr(const char *rules, int family, const struct sockaddr *hint,
                                socklen_t hint_len, struct sockaddr_storage *out,
                                socklen_t *out_len, char *ifname, size_t ifname_len,
                                weft_error_sink *err);

/* A listening, non-blocking, close-on-exec socket bound to addr (port 0 =
 * any). *bound gets the actual address. */
weft_status net_listen(const struct sockaddr_storage *addr, socklen_t len, int backlog, int *fd,
                       struct sockaddr_storage *bound, socklen_t *bound_len, weft_error_sink *err);
/* Connects; the returned fd is non-blocking. With retry_refused, refusals
 * are retried until the deadline (a rendezvous listener may not be up yet);
 * without, a refusal fails at once (a peer's listener that existed is gone). */
weft_status net_connect(const struct sockaddr_storage *addr, socklen_t len, double deadline,
                        bool retry_refused, int *fd, weft_error_sink *err);
/* Whole-buffer send/recv on a non-blocking fd, waiting in poll() until the
 * deadline. recv: EOF before `len` bytes is WEFT_ERR_PEER_LOST. */
weft_status net_send_all(int fd, const void *buf, size_t len, double deadline, weft_error_sink *err);
weft_status net_recv_all(int fd, void *buf, size_t len, double deadline, weft_error_sink *err);
void net_set_nodelay(int fd);
void net_set_nonblock(int fd);

/* Whether `addr` is an address of this host in this network namespace, so
 * a connection to it runs through loopback: the kernel is asked by binding
 * a datagram socket to it. (With net.ipv4.ip_nonlocal_bind set every
 * address binds, and every peer counts as local.) */
bool net_addr_is_local(const struct sockaddr_storage *addr, socklen_t len);
/* A TCP socket's congestion control (TCP_CONGESTION): the name into `name`
 * (NET_CC_NAME bytes; "" where the kernel does not say), or set: 0 or an errno. */
#define NET_CC_NAME 16
void net_get_congestion(int fd, char name[NET_CC_NAME]);
int net_set_congestion(int fd, const char *name);

#endif

/* net.c - socket helpers. Everything that can wait takes a deadline, so no
 * caller can block forever on a peer that never answers. */
#include "src/base/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "src/base/status.h"

double weft_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

weft_status net_split_hostport(const char *text, char *host, size_t host_len, int *port,
                               weft_error_sink *err) {
  if (!text || !*text) {
    weft_error_sink_set(err, "empty rendezvous address (want host:port)");
    return WEFT_ERR_INVALID;
  }
  const char *colon, *whole = text; /* the message quotes what the user wrote */
  size_t hlen;
  if (text[0] == '[') {
    const char *close = strchr(text, ']');
    if (!close || close[1] != ':') goto bad;
    hlen = (size_t)(close - text - 1);
    text++;
    colon = close + 1;
  } else {
    colon = strrchr(text, ':');
    if (!colon || strchr(text, ':') != colon) goto bad; /* bare v6 needs brackets */
    hlen = (size_t)(colon - text);
  }
  if (hlen == 0 || hlen >= host_len) goto bad;
  char *end;
  long p = strtol(colon + 1, &end, 10);
  if (*end || end == colon + 1 || p < 0 || p > 65535) goto bad;
  memcpy(host, text, hlen);
  host[hlen] = 0;
  *port = (int)p;
  return WEFT_OK;
bad:
  weft_error_sink_set(err, "malformed address \"%s\" (want host:port or [v6addr]:port)", whole);
  return WEFT_ERR_INVALID;
}

weft_status net_resolve(const char *host, int port, int family, struct sockaddr_storage *out,
                        socklen_t *out_len, weft_error_sink *err) {
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = family == 6 ? AF_INET6 : family == 4 ? AF_INET : AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  char portstr[16];
  snprintf(portstr, sizeof portstr, "%d", port);
  int rc = getaddrinfo(host, portstr, &hints, &res);
  if (rc) {
    weft_error_sink_set(err, "cannot resolve \"%s\": %s", host, gai_strerror(rc));
    return WEFT_ERR_INVALID;
  }
  struct addrinfo *pick = res;
  for (struct addrinfo *a = res; a; a = a->ai_next)
    if (a->ai_family == AF_INET && family != 6) { pick = a; break; }
  memcpy(out, pick->ai_addr, pick->ai_addrlen);
  *out_len = pick->ai_addrlen;
  freeaddrinfo(res);
  return WEFT_OK;
}

const char *net_addr_str(const struct sockaddr *addr, char *buf, size_t len) {
  char ip[INET6_ADDRSTRLEN] = "?";
  if (addr->sa_family == AF_INET) {
    const struct sockaddr_in *a = (const struct sockaddr_in *)addr;
    inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
    snprintf(buf, len, "%s:%d", ip, ntohs(a->sin_port));
  } else if (addr->sa_family == AF_INET6) {
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)addr;
    inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
    snprintf(buf, len, "[%s]:%d", ip, ntohs(a->sin6_port));
  } else {
    snprintf(buf, len, "(family %d)", addr->sa_family);
  }
  return buf;
}

int net_addr_port(const struct sockaddr *addr) {
  if (addr->sa_family == AF_INET) return ntohs(((const struct sockaddr_in *)addr)->sin_port);
  if (addr->sa_family == AF_INET6) return ntohs(((const struct sockaddr_in6 *)addr)->sin6_port);
  return -1;
}

void net_addr_set_port(struct sockaddr_storage *addr, int port) {
  if (addr->ss_family == AF_INET) ((struct sockaddr_in *)addr)->sin_port = htons((uint16_t)port);
  if (addr->ss_family == AF_INET6)
    ((struct sockaddr_in6 *)addr)->sin6_port = htons((uint16_t)port);
}

bool net_addr_is_loopback(const struct sockaddr *addr) {
  if (addr->sa_family == AF_INET)
    return (ntohl(((const struct sockaddr_in *)addr)->sin_addr.s_addr) >> 24) == 127;
  if (addr->sa_family == AF_INET6)
    return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)addr)->sin6_addr);
  return false;
}

void net_addr_pack(const struct sockaddr_storage *a, uint8_t out[NET_ADDR_PACKED]) {
  memset(out, 0, NET_ADDR_PACKED);
  uint16_t port = htons((uint16_t)net_addr_port((const struct sockaddr *)a));
  memcpy(out + 2, &port, 2);
  if (a->ss_family == AF_INET) {
    out[0] = 4;
    memcpy(out + 4, &((const struct sockaddr_in *)a)->sin_addr, 4);
  } else {
    out[0] = 6;
    memcpy(out + 4, &((const struct sockaddr_in6 *)a)->sin6_addr, 16);
  }
}

bool net_addr_unpack(const uint8_t in[NET_ADDR_PACKED], struct sockaddr_storage *a,
                     socklen_t *alen) {
  if (in[0] != 4 && in[0] != 6) return false;
  memset(a, 0, sizeof *a);
  uint16_t port;
  memcpy(&port, in + 2, 2);
  if (in[0] == 4) {
    struct sockaddr_in *v4 = (struct sockaddr_in *)a;
    v4->sin_family = AF_INET;
    v4->sin_port = port;
    memcpy(&v4->sin_addr, in + 4, 4);
    *alen = sizeof *v4;
  } else {
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)a;
    v6->sin6_family = AF_INET6;
    v6->sin6_port = port;
    memcpy(&v6->sin6_addr, in + 4, 16);
    *alen = sizeof *v6;
  }
  return true;
}

bool net_ifname_match(const char *rules, const char *ifname) {
  if (!rules || !*rules) return true;
  bool exclude = rules[0] == '^';
  char buf[256];
  snprintf(buf, sizeof buf, "%s", rules + exclude);
  bool hit = false;
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok && !hit; tok = strtok_r(NULL, ",", &save)) {
    if (tok[0] == '=')
      hit = strcmp(tok + 1, ifname) == 0;
    else
      hit = strncmp(tok, ifname, strlen(tok)) == 0;
  }
  return exclude ? !hit : hit;
}

/* Bridges that usually carry no traffic between hosts. */
static bool ifname_is_virtual_bridge(const char *name) {
  return !strncmp(name, "docker", 6) || !strncmp(name, "veth", 4) || !strncmp(name, "virbr", 5) ||
         !strncmp(name, "br-", 3);
}

weft_status net_pick_local_addr(const char *rules, int family, const struct sockaddr *hint,
                                socklen_t hint_len, struct sockaddr_storage *out,
                                socklen_t *out_len, char *ifname, size_t ifname_len,
                                weft_error_sink *err) {
  struct ifaddrs *ifs = NULL;
  if (getifaddrs(&ifs)) {
    weft_error_sink_set(err, "getifaddrs: %s", strerror(errno));
    return WEFT_ERR_SYSTEM;
  }
  bool have_rules = rules && *rules;
  struct ifaddrs *best = NULL;
  int best_score = -1;
  char seen[256] = "";
  for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || !(i->ifa_flags & IFF_UP)) continue;
    int fam = i->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    if ((family == 4 && fam != AF_INET) || (family == 6 && fam != AF_INET6)) continue;
    if (fam == AF_INET6 &&
        IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr))
      continue; /* link-local needs a scope id peers cannot use */
    if (!strstr(seen, i->ifa_name) && strlen(seen) + strlen(i->ifa_name) + 2 < sizeof seen) {
      strcat(seen, seen[0] ? "," : "");
      strcat(seen, i->ifa_name);
    }
    int score;
    if (have_rules) {
      if (!net_ifname_match(rules, i->ifa_name)) continue;
      score = fam == AF_INET ? 2 : 1;
    } else if (hint && hint->sa_family == fam &&
               ((fam == AF_INET &&
                 ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr ==
                     ((const struct sockaddr_in *)hint)->sin_addr.s_addr) ||
                (fam == AF_INET6 &&
                 !memcmp(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr,
                         &((const struct sockaddr_in6 *)hint)->sin6_addr, 16)))) {
      score = 10; /* the interface we reached the rendezvous through */
    } else {
      bool lo = (i->ifa_flags & IFF_LOOPBACK) != 0;
      score = lo ? 0 : ifname_is_virtual_bridge(i->ifa_name) ? 1 : fam == AF_INET ? 4 : 3;
    }
    if (score > best_score) {
      best_score = score;
      best = i;
    }
  }
  weft_status st = WEFT_OK;
  if (!best) {
    weft_error_sink_set(err, "no usable interface matches WEFT_SOCKET_IFNAME=\"%s\"%s (have: %s)",
                        rules ? rules : "", family ? " and WEFT_SOCKET_FAMILY" : "", seen);
    st = WEFT_ERR_INVALID;
  } else {
    socklen_t len = best->ifa_addr->sa_family == AF_INET ? sizeof(struct sockaddr_in)
                                                         : sizeof(struct sockaddr_in6);
    memset(out, 0, sizeof *out);
    memcpy(out, best->ifa_addr, len);
    net_addr_set_port(out, 0);
    *out_len = len;
    snprintf(ifname, ifname_len, "%s", best->ifa_name);
  }
  (void)hint_len;
  freeifaddrs(ifs);
  return st;
}

void net_set_nonblock(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

bool net_addr_is_local(const struct sockaddr_storage *addr, socklen_t len) {
  int s = socket(addr->ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return false;
  struct sockaddr_storage a = *addr;
  net_addr_set_port(&a, 0);
  bool local = bind(s, (const struct sockaddr *)&a, len) == 0;
  close(s);
  return local;
}

void net_get_congestion(int fd, char name[NET_CC_NAME]) {
  socklen_t len = NET_CC_NAME;
  if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len)) len = 0;
  name[len < NET_CC_NAME ? len : NET_CC_NAME - 1] = 0;
}

int net_set_congestion(int fd, const char *name) {
  return setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, (socklen_t)strlen(name)) ? errno : 0;
}

void net_set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

weft_status net_listen(const struct sockaddr_storage *addr, socklen_t len, int backlog, int *fd,
                       struct sockaddr_storage *bound, socklen_t *bound_len, weft_error_sink *err) {
  char where[80];
  int s = socket(addr->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s < 0) {
    weft_error_sink_set(err, "socket: %s", strerror(errno));
    return WEFT_ERR_SYSTEM;
  }
  int one = 1;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(s, (const struct sockaddr *)addr, len) || listen(s, backlog)) {
    int e = errno;
    weft_error_sink_set(err, "cannot listen on %s: %s",
                        net_addr_str((const struct sockaddr *)addr, where, sizeof where),
                        strerror(e));
    close(s);
    return e == EADDRINUSE ? WEFT_ERR_BOOTSTRAP : WEFT_ERR_SYSTEM;
  }
  *bound_len = sizeof *bound;
  getsockname(s, (struct sockaddr *)bound, bound_len);
  *fd = s;
  return WEFT_OK;
}

static int remaining_ms(double deadline) {
  double left = deadline - weft_now();
  if (left <= 0) return 0;
  return left > 1e6 ? 1000000000 : (int)(left * 1000) + 1;
}

weft_status net_connect(const struct sockaddr_storage *addr, socklen_t len, double deadline,
                        bool retry_refused, int *fd, weft_error_sink *err) {
  char where[80];
  net_addr_str((const struct sockaddr *)addr, where, sizeof where);
  int last = 0;
  int tries = 0;
  do {
    int s = socket(addr->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0) {
      weft_error_sink_set(err, "socket: %s", strerror(errno));
      return WEFT_ERR_SYSTEM;
    }
    int rc = connect(s, (const struct sockaddr *)addr, len);
    if (rc && errno == EINPROGRESS) {
      struct pollfd p = {.fd = s, .events = POLLOUT};
      int n = poll(&p, 1, remaining_ms(deadline));
      if (n == 1) {
        socklen_t el = sizeof last;
        getsockopt(s, SOL_SOCKET, SO_ERROR, &last, &el);
        rc = last ? -1 : 0;
      } else {
        last = ETIMEDOUT;
        rc = -1;
      }
    } else if (rc) {
      last = errno;
    }
    if (rc == 0) {
      net_set_nodelay(s);
      *fd = s;
      return WEFT_OK;
    }
    close(s);
    /* refused/unreachable: the listener may not be up yet; back off a little */
    if (!retry_refused || (last != ECONNREFUSED && last != ETIMEDOUT && last != EHOSTUNREACH &&
        last != ENETUNREACH && last != ECONNRESET))
      break;
    struct timespec pause = {0, (tries < 20 ? 10 : 100) * 1000000L};
    tries++;
    if (weft_now() + 0.01 < deadline) nanosleep(&pause, NULL);
  } while (weft_now() < deadline);
  weft_error_sink_set(err, "cannot connect to %s: %s%s", where, strerror(last),
                      weft_now() >= deadline ? " (until the timeout)" : "");
  return weft_now() >= deadline ? WEFT_ERR_TIMEOUT : WEFT_ERR_PEER_LOST;
}

static weft_status wait_fd(int fd, short events, double deadline, const char *what,
                           weft_error_sink *err) {
  struct pollfd p = {.fd = fd, .events = events};
  for (;;) {
    int ms = remaining_ms(deadline);
    if (ms == 0) {
      weft_error_sink_set(err, "timed out while %s", what);
      return WEFT_ERR_TIMEOUT;
    }
    int n = poll(&p, 1, ms);
    if (n > 0) return WEFT_OK;
    if (n < 0 && errno != EINTR) {
      weft_error_sink_set(err, "poll: %s", strerror(errno));
      return WEFT_ERR_SYSTEM;
    }
  }
}

weft_status net_send_all(int fd, const void *buf, size_t len, double deadline,
                         weft_error_sink *err) {
  const char *p = buf;
  while (len) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      WEFT_CHECK(wait_fd(fd, POLLOUT, deadline, "sending", err));
    } else {
      weft_error_sink_set(err, "send: %s", strerror(errno));
      return weft_status_from_errno(errno);
    }
  }
  return WEFT_OK;
}

weft_status net_recv_all(int fd, void *buf, size_t len, double deadline, weft_error_sink *err) {
  char *p = buf;
  while (len) {
    ssize_t n = recv(fd, p, len, 0);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
    } else if (n == 0) {
      weft_error_sink_set(err, "connection closed by the other side");
      return WEFT_ERR_PEER_LOST;
    } else if (errno == EAGAIN || errno == EINTR) {
      WEFT_CHECK(wait_fd(fd, POLLIN, deadline, "receiving", err));
    } else {
      weft_error_sink_set(err, "recv: %s", strerror(errno));
      return weft_status_from_errno(errno);
    }
  }
  return WEFT_OK;
}

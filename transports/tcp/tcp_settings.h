/* tcp_settings.h - the TCP transport's own settings, as a list that the one
 * settings table (src/base/settings.h, which includes this file; include that
 * one) puts under "tcp". Read as weft_settings()->tcp.<field>. Declarations
 * only: this file calls nothing, so the table below the transports may hold it. */
#ifndef WEFT_TCP_SETTINGS_H
#define WEFT_TCP_SETTINGS_H

/* WEFT_SOCKET_FAMILY's words; the rendezvous and the unique id use it too. */
#define WEFT_FAMILY_WORDS(W) \
  W(WEFT_FAMILY_ANY, "any") W(WEFT_FAMILY_IPV4, "4") W(WEFT_FAMILY_IPV6, "6")
/* The family number net.h takes (0 = either). */
#define WEFT_FAMILY_NUMBER(choice) \
  ((choice) == WEFT_FAMILY_IPV4 ? 4 : (choice) == WEFT_FAMILY_IPV6 ? 6 : 0)

/* Below 4 KiB a socket buffer makes a collective crawl (issue 14: 1 byte gave
 * 15 KB/s) while bytes still trickle, so the timeout never fires. */
#define WEFT_TCP_SETTINGS(X)                                                                     \
  X(SOCKET_IFNAME, socket_ifname, STRING, "", 0, 0, WEFT_NO_WORDS,                               \
    "interfaces for data sockets: eth0 (prefix), =eth0 (exact), ^docker (exclude)")              \
  X(SOCKET_FAMILY, socket_family, ENUM, "any", 0, 0, WEFT_FAMILY_WORDS,                          \
    "address family for data sockets and the rendezvous: 4, 6, or any")                          \
  X(TCP_BUF_BYTES, buf_bytes, BYTES_OR_0, "0", 4096, 1 << 30, WEFT_NO_WORDS,                     \
    "SO_SNDBUF/SO_RCVBUF of data sockets; 0 keeps the kernel's autotuning")

#endif

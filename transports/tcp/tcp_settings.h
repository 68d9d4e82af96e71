/* tcp_settings.h - the TCP transport's own settings: the list, the values it
 * makes (read as tcp_settings()-><field>) and the table tcp_settings.c
 * defines, which the transports hand to the registry in src/base/settings.h
 * (transports/transport_settings.c); weft-info lists it under "tcp". */
#ifndef WEFT_TCP_SETTINGS_H
#define WEFT_TCP_SETTINGS_H

#include "src/base/settings.h"

/* WEFT_SOCKET_FAMILY's words; the rendezvous and the unique id use it too. */
#define WEFT_FAMILY_WORDS(W) \
  W(WEFT_FAMILY_ANY, "any") W(WEFT_FAMILY_IPV4, "4") W(WEFT_FAMILY_IPV6, "6")
/* The family number net.h takes (0 = either). */
#define WEFT_FAMILY_NUMBER(choice) \
  ((choice) == WEFT_FAMILY_IPV4 ? 4 : (choice) == WEFT_FAMILY_IPV6 ? 6 : 0)

/* Below 4 KiB a socket buffer makes a collective crawl (issue 14: 1 byte gave
 * 15 KB/s) while bytes still trickle, so the timeout never fires. */
#define WEFT_TCP_SETTINGS(X)                                                                    \
  X(SOCKET_IFNAME, socket_ifname, STRING, "", 0, 0, WEFT_NO_WORDS,                              \
    "interfaces for data sockets: eth0 (prefix), =eth0 (exact), ^docker (exclude); a list "     \
    "(eth0,eth1) of interfaces that reach the peers stripes the streams over them, rail i to "  \
    "rail i")                                                                                   \
  X(SOCKET_FAMILY, socket_family, ENUM, "any", 0, 0, WEFT_FAMILY_WORDS,                         \
    "address family for data sockets and the rendezvous: 4, 6, or any")                         \
  X(TCP_BUF_BYTES, buf_bytes, BYTES_OR_0, "0", 4096, 1 << 30, WEFT_NO_WORDS,                    \
    "SO_SNDBUF/SO_RCVBUF of data sockets; 0 keeps the kernel's autotuning")                     \
  X(TCP_CONGESTION, congestion, STRING, "auto", 0, 0, WEFT_NO_WORDS,                            \
    "congestion control of data sockets: auto (connections to this host's own addresses use "   \
    "cubic, or reno, where the system's default paces bursts as bbr does; others keep the "     \
    "default), system (the default everywhere), or a name the kernel allows "                   \
    "(net.ipv4.tcp_allowed_congestion_control) for every data connection")                      \
  X(TCP_STREAMS, streams, INT_OR_AUTO, "auto", 1, 16, WEFT_NO_WORDS,                            \
    "sockets per peer for collectives, each chunk cut over them in order (the pair takes the "  \
    "smaller number of both ranks); auto: one per rail, 2 from 4 CPUs, 4 from 8")               \
  X(TCP_THREADS, threads, INT_OR_AUTO, "auto", 0, 16, WEFT_NO_WORDS,                            \
    "helper threads that drive the streams past the first (the caller drives stream 0); auto: " \
    "one per two CPUs a rank has, from 4 CPUs per rank, at most streams - 1")

enum weft_family_choice { WEFT_FAMILY_WORDS(WEFT_SETTING_WORD_ENUM) };

typedef struct tcp_settings_values {
  WEFT_TCP_SETTINGS(WEFT_SETTING_FIELD)
} tcp_settings_values;

/* The values, parsed and checked (a refused one holds its default). Valid
 * until the next reload (weft_settings_reload). */
const tcp_settings_values *tcp_settings(void);
/* The table, for the registry (weft_settings_register). */
extern weft_settings_table tcp_settings_table;

#endif

/* topo.h - what hwloc tells about this machine (host, NUMA nodes, cores,
 * network and RDMA devices, GPUs), loadable from a saved XML so selection
 * rules can be tested on topologies this machine does not have. */
#ifndef WEFT_TOPO_H
#define WEFT_TOPO_H

#include <stddef.h>

#include "src/base/error_sink.h"
#include "weft.h"

#define WEFT_TOPO_MAX_DEVICES 16
#define WEFT_TOPO_NAME 48

typedef struct weft_topo_device {
  char name[WEFT_TOPO_NAME];   /* "eth0", "mlx5_0", "cuda0" */
  int numa_node;               /* nearest NUMA node, -1 unknown */
  char pci_bus_id[16];         /* "0000:3b:00.0" or "" */
} weft_topo_device;

typedef struct weft_topo {
  char hostname[64];           /* hwloc's HostName info, else gethostname */
  int numa_nodes, packages, cores, pus;
  int n_net, n_rdma, n_gpu;
  weft_topo_device net[WEFT_TOPO_MAX_DEVICES];   /* OS devices of type network */
  weft_topo_device rdma[WEFT_TOPO_MAX_DEVICES];  /* OS devices of type OpenFabrics */
  weft_topo_device gpu[WEFT_TOPO_MAX_DEVICES];   /* GPU / CoProc OS devices */
  const char *source;          /* "hwloc", "hwloc XML", or "fallback (no hwloc)" */
  char xml_path[256];          /* the saved topology's file when source is "hwloc XML", else "" */
} weft_topo;

/* Loads this machine's topology (xml_path NULL) or a saved hwloc XML file.
 * Without hwloc at build time, fills what the OS says (hostname, online CPUs)
 * and says so in `source` (a saved XML file is then WEFT_ERR_UNSUPPORTED).
 * I/O devices are included (network, OpenFabrics, GPU). Never blocks on
 * anything but hwloc's own discovery. Lists hold at most WEFT_TOPO_MAX_DEVICES
 * each (the counts stop there too); a GPU that several backends report on one
 * PCI device (cuda0, nvml0, card0) is listed once. A missing, unreadable or
 * malformed XML file is WEFT_ERR_INVALID with a sentence naming the file. */
weft_status weft_topo_load(const char *xml_path, weft_topo *out, weft_error_sink *err);

/* One or a few lines for weft-info and the INIT log:
 * "host vm: 1 package, 1 NUMA node, 2 cores, 2 PUs; net: eth0; rdma: none; gpu: none". */
void weft_topo_describe(const weft_topo *topo, char *buf, size_t len);

/* A string naming this host, the same for every process on it: hostname
 * plus the kernel's boot id. */
void weft_host_identity(char *out, size_t len);

#endif

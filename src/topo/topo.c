/* topo.c - this machine's topology from hwloc, or a saved hwloc XML file:
 * packages, NUMA nodes, cores, PUs, and the network, RDMA and GPU devices
 * with the NUMA node and PCI address each hangs off. Without hwloc at build
 * time, only what the OS says (hostname, online CPUs). */
#include "src/topo/topo.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef WEFT_HAVE_HWLOC
#include <hwloc.h>
#endif

static void topo_hostname_from_os(weft_topo *topo) {
  if (gethostname(topo->hostname, sizeof topo->hostname - 1) != 0)
    snprintf(topo->hostname, sizeof topo->hostname, "localhost");
  topo->hostname[sizeof topo->hostname - 1] = 0;
}

#ifdef WEFT_HAVE_HWLOC

static int topo_count(hwloc_topology_t h, hwloc_obj_type_t type) {
  int n = hwloc_get_nbobjs_by_type(h, type);
  return n > 0 ? n : 0;
}

/* The NUMA node whose CPUs the device sits next to: the node set of its first
 * non-I/O ancestor, when that is exactly one node (a device hanging off the
 * whole machine of a multi-node host has no nearest node). */
static int topo_numa_of(hwloc_topology_t h, hwloc_obj_t osdev) {
  hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(h, osdev);
  if (!anc || !anc->nodeset || hwloc_bitmap_weight(anc->nodeset) != 1) return -1;
  return hwloc_bitmap_first(anc->nodeset);
}

static void topo_pci_bus_id_of(hwloc_obj_t osdev, char *out, size_t len) {
  out[0] = 0;
  for (hwloc_obj_t o = osdev->parent; o; o = o->parent) {
    if (o->type != HWLOC_OBJ_PCI_DEVICE) continue;
    snprintf(out, len, "%04x:%02x:%02x.%x", (unsigned)o->attr->pcidev.domain,
             (unsigned)o->attr->pcidev.bus, (unsigned)o->attr->pcidev.dev,
             (unsigned)o->attr->pcidev.func);
    return;
  }
}

static void topo_fill_device(hwloc_topology_t h, hwloc_obj_t osdev, weft_topo_device *dev) {
  snprintf(dev->name, sizeof dev->name, "%s", osdev->name ? osdev->name : "?");
  dev->numa_node = topo_numa_of(h, osdev);
  topo_pci_bus_id_of(osdev, dev->pci_bus_id, sizeof dev->pci_bus_id);
}

static void topo_add_device(hwloc_topology_t h, hwloc_obj_t osdev, weft_topo_device *list, int *n) {
  if (*n >= WEFT_TOPO_MAX_DEVICES) return;
  topo_fill_device(h, osdev, &list[(*n)++]);
}

/* CUDA, NVML, OpenCL and DRM each report the same GPU; one per PCI device is
 * enough to count GPUs, and the CUDA name is the one users know. */
static void topo_add_gpu(hwloc_topology_t h, hwloc_obj_t osdev, weft_topo *topo) {
  weft_topo_device dev;
  topo_fill_device(h, osdev, &dev);
  bool is_cuda = osdev->subtype && !strcmp(osdev->subtype, "CUDA");
  for (int i = 0; dev.pci_bus_id[0] && i < topo->n_gpu; i++) {
    if (strcmp(topo->gpu[i].pci_bus_id, dev.pci_bus_id)) continue;
    if (is_cuda) topo->gpu[i] = dev;
    return;
  }
  if (topo->n_gpu < WEFT_TOPO_MAX_DEVICES) topo->gpu[topo->n_gpu++] = dev;
}

static void topo_collect_devices(hwloc_topology_t h, weft_topo *topo) {
  for (hwloc_obj_t o = hwloc_get_next_osdev(h, NULL); o; o = hwloc_get_next_osdev(h, o)) {
    switch (o->attr->osdev.type) {
      case HWLOC_OBJ_OSDEV_NETWORK: topo_add_device(h, o, topo->net, &topo->n_net); break;
      case HWLOC_OBJ_OSDEV_OPENFABRICS: topo_add_device(h, o, topo->rdma, &topo->n_rdma); break;
      case HWLOC_OBJ_OSDEV_GPU:
      case HWLOC_OBJ_OSDEV_COPROC: topo_add_gpu(h, o, topo); break;
      default: break; /* block devices, DMA engines */
    }
  }
}

static void topo_collect(hwloc_topology_t h, weft_topo *topo) {
  const char *host = hwloc_obj_get_info_by_name(hwloc_get_root_obj(h), "HostName");
  if (host && *host)
    snprintf(topo->hostname, sizeof topo->hostname, "%s", host);
  else
    topo_hostname_from_os(topo);
  topo->packages = topo_count(h, HWLOC_OBJ_PACKAGE);
  topo->numa_nodes = topo_count(h, HWLOC_OBJ_NUMANODE);
  topo->pus = topo_count(h, HWLOC_OBJ_PU);
  topo->cores = topo_count(h, HWLOC_OBJ_CORE);
  if (topo->cores == 0) topo->cores = topo->pus; /* some platforms report no cores */
  topo_collect_devices(h, topo);
}

/* Discovery components weft has no use for, skipped because each rank pays
 * for them at init: "pci" (libpciaccess) repeats what the Linux component
 * reads from sysfs and leaks on every load (LeakSanitizer fails the tests),
 * "gl" dials X displays, "opencl" starts the GPU drivers to name a GPU the
 * Linux component already lists. */
static void topo_skip_components(hwloc_topology_t h) {
#ifdef __linux__
  hwloc_topology_set_components(h, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "pci");
#endif
  hwloc_topology_set_components(h, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "gl");
  hwloc_topology_set_components(h, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "opencl");
}

/* hwloc says only "failed" on a bad file: check readability first so the
 * sentence can say why (no such file, permission denied). */
static weft_status topo_check_readable(const char *path, weft_error_sink *err) {
  FILE *f = fopen(path, "r");
  if (!f) {
    weft_error_sink_set(err, "cannot read topology XML file %s: %s", path, strerror(errno));
    return WEFT_ERR_INVALID;
  }
  struct stat st;
  bool is_dir = fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode);
  fclose(f);
  if (is_dir) {
    weft_error_sink_set(err, "cannot read topology XML file %s: it is a directory", path);
    return WEFT_ERR_INVALID;
  }
  return WEFT_OK;
}

static weft_status topo_load_hwloc(const char *xml_path, weft_topo *topo, weft_error_sink *err) {
  if (xml_path) {
    weft_status st = topo_check_readable(xml_path, err);
    if (st != WEFT_OK) return st;
  }
  hwloc_topology_t h;
  if (hwloc_topology_init(&h) != 0) {
    weft_error_sink_set(err, "hwloc_topology_init failed: %s", strerror(errno));
    return WEFT_ERR_SYSTEM;
  }
  weft_status st = WEFT_OK;
  hwloc_topology_set_io_types_filter(h, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  topo_skip_components(h);
  /* hwloc parses the file in set_xml (malformed XML fails there) and checks
   * the objects in load (a well-formed file that is no topology fails there). */
  if (xml_path && (hwloc_topology_set_xml(h, xml_path) != 0 || hwloc_topology_load(h) != 0)) {
    weft_error_sink_set(err,
                        "hwloc could not load topology XML file %s: not a valid hwloc XML "
                        "topology (HWLOC_XML_VERBOSE=1 shows why)",
                        xml_path);
    st = WEFT_ERR_INVALID;
    goto done;
  }
  if (!xml_path && hwloc_topology_load(h) != 0) {
    weft_error_sink_set(err, "hwloc could not discover this machine's topology: %s",
                        strerror(errno));
    st = WEFT_ERR_SYSTEM;
    goto done;
  }
  topo_collect(h, topo);
  topo->source = xml_path ? "hwloc XML" : "hwloc";
  if (xml_path) snprintf(topo->xml_path, sizeof topo->xml_path, "%s", xml_path);
done:
  hwloc_topology_destroy(h);
  return st;
}

#else /* no hwloc */

static weft_status topo_load_fallback(const char *xml_path, weft_topo *topo, weft_error_sink *err) {
  if (xml_path) {
    weft_error_sink_set(err, "cannot read topology XML file %s: this build of weft has no hwloc",
                        xml_path);
    return WEFT_ERR_UNSUPPORTED;
  }
  topo_hostname_from_os(topo);
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  topo->pus = topo->cores = cpus > 0 ? (int)cpus : 1;
  topo->packages = topo->numa_nodes = 1; /* unknown; one is the honest minimum */
  topo->source = "fallback (no hwloc)";
  return WEFT_OK;
}

#endif /* WEFT_HAVE_HWLOC */

weft_status weft_topo_load(const char *xml_path, weft_topo *out, weft_error_sink *err) {
  if (!out) {
    weft_error_sink_set(err, "weft_topo_load: no place to put the topology (out is NULL)");
    return WEFT_ERR_INVALID;
  }
  memset(out, 0, sizeof *out);
  out->source = "";
#ifdef WEFT_HAVE_HWLOC
  return topo_load_hwloc(xml_path, out, err);
#else
  return topo_load_fallback(xml_path, out, err);
#endif
}

/* ---- describe ------------------------------------------------------------ */

static void topo_append_count(char *buf, size_t len, size_t *used, int n, const char *what,
                              const char *sep) {
  weft_appendf(buf, len, used, "%d %s%s%s", n, what, n == 1 ? "" : "s", sep);
}

static void topo_append_devices(char *buf, size_t len, size_t *used, const char *label,
                                const weft_topo_device *devs, int n) {
  weft_appendf(buf, len, used, "%s: ", label);
  if (n == 0) weft_appendf(buf, len, used, "none");
  for (int i = 0; i < n; i++) weft_appendf(buf, len, used, "%s%s", i ? ", " : "", devs[i].name);
}

void weft_topo_describe(const weft_topo *topo, char *buf, size_t len) {
  if (!buf || len == 0) return;
  buf[0] = 0;
  if (!topo) return;
  size_t used = 0;
  weft_appendf(buf, len, &used, "host %s: ", topo->hostname);
  topo_append_count(buf, len, &used, topo->packages, "package", ", ");
  topo_append_count(buf, len, &used, topo->numa_nodes, "NUMA node", ", ");
  topo_append_count(buf, len, &used, topo->cores, "core", ", ");
  topo_append_count(buf, len, &used, topo->pus, "PU", "; ");
  topo_append_devices(buf, len, &used, "net", topo->net, topo->n_net);
  weft_appendf(buf, len, &used, "; ");
  topo_append_devices(buf, len, &used, "rdma", topo->rdma, topo->n_rdma);
  weft_appendf(buf, len, &used, "; ");
  topo_append_devices(buf, len, &used, "gpu", topo->gpu, topo->n_gpu);
}

void weft_host_identity(char *out, size_t len) {
  char host[64] = "localhost";
  gethostname(host, sizeof host - 1);
  char boot_id[40] = "";
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f) {
    if (!fgets(boot_id, sizeof boot_id, f)) boot_id[0] = 0;
    fclose(f);
    boot_id[strcspn(boot_id, "\n")] = 0;
  }
  /* 8 hex digits of the boot id tell reinstalled or cloned machines with one name apart */
  snprintf(out, len, "%.40s/%.8s", host, boot_id);
}

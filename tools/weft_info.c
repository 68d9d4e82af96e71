/* weft-info - what this build of weft has and how it is set: version,
 * transports, this machine's topology (or a saved hwloc XML file's), and
 * every WEFT_* setting with its type, default, current value, what it
 * accepts and its help. */
#include <stdio.h>
#include <string.h>

#include "weft.h"
/* Internal headers: the topology is no part of the public API. */
#include "src/base/settings.h"
#include "src/coll/choose.h"
#include "src/comm/comm.h"
#include "src/topo/select.h"
#include "src/topo/topo.h"
#include "transports/transport_settings.h"
#ifdef WEFT_HAVE_CUDA
#include <cuda.h>

#include "src/cuda/cuda_api.h"
#include "src/cuda/cuda_mem.h"
#endif
#ifdef WEFT_HAVE_IBV
#include "transports/ibv/ibv.h"
#endif

/* What CUDA support this build has and whether it runs here. */
static void print_cuda(void) {
#ifdef WEFT_HAVE_CUDA
  char why[512];
  bool usable = weft_cuda_usable(why, sizeof why);
#ifdef WEFT_HAVE_CUDA_KERNELS
  const char *kernels = "with kernels (nvcc)";
#else
  const char *kernels = "without kernels (no nvcc at build time: device buffers are always "
                        "staged through host memory; install the CUDA toolkit and build again)";
#endif
  printf("cuda: built (CUDA %d.%d headers; the driver loaded at run time) %s, %s: %s; device "
         "buffers: every collective within a host through CUDA IPC (WEFT_CUDA_IPC), across hosts over "
         "verbs with GPUDirect RDMA where it registers them (the gdr line), else staged "
         "through pinned host memory\n",
         CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10, kernels,
         usable ? "usable here" : "not usable here", why);
#else
  printf("cuda: not built (no cuda.h at build time, or -Dcuda=disabled): host buffers only\n");
#endif
}

/* GPUDirect RDMA: per GPU, how verbs would register its memory here
 * (transports/ibv/ibv_gdr.c: dma-buf, nvidia-peermem, or staged) and why. */
static void print_gdr(void) {
#if defined(WEFT_HAVE_CUDA) && defined(WEFT_HAVE_IBV)
  weft_error_sink err = {{0}, {0}};
  const ibv_api *api = ibv_api_load(&err);
  if (!api) {
    printf("gdr: no verbs library here (%s): device buffers across hosts go over tcp, staged\n",
           err.msg);
    return;
  }
  const weft_cuda_api *cu = weft_cuda_usable(NULL, 0) ? weft_cuda_api_load(&err) : NULL;
  int n = 0;
  if (!cu || cu->device_get_count(&n) != CUDA_SUCCESS || n == 0) {
    char why[300];
    ibv_gdr_choose(api, 0, why, sizeof why);
    printf("gdr: no GPU here: %s\n", why);
    return;
  }
  for (int d = 0; d < n; d++) {
    char why[300];
    ibv_gdr_choose(api, d, why, sizeof why);
    printf("gdr: device %d: %s (WEFT_IB_GDR)\n", d, why);
  }
#elif defined(WEFT_HAVE_CUDA)
  printf("gdr: not built (no rdma-core headers at build time): device buffers across hosts are "
         "staged\n");
#endif
}

static void print_devices(const char *kind, const weft_topo_device *devs, int n) {
  for (int i = 0; i < n; i++) {
    char numa[16] = "?";
    if (devs[i].numa_node >= 0) snprintf(numa, sizeof numa, "%d", devs[i].numa_node);
    printf("  %-5s %-12s NUMA node %-3s PCI %s\n", kind, devs[i].name, numa,
           devs[i].pci_bus_id[0] ? devs[i].pci_bus_id : "-");
  }
}

/* Prints the topology section; xml_path NULL is this machine. */
static int print_topology(const char *xml_path) {
  weft_topo topo;
  weft_error_sink err = {0};
  weft_status st = weft_topo_load(xml_path, &topo, &err);
  if (st != WEFT_OK) {
    fprintf(stderr, "weft-info: %s\n", err.msg);
    return 1;
  }
  char line[1024];
  weft_topo_describe(&topo, line, sizeof line);
  printf("topology (%s%s%s):\n  %s\n", topo.source, xml_path ? " " : "", xml_path ? xml_path : "",
         line);
  print_devices("net", topo.net, topo.n_net);
  print_devices("rdma", topo.rdma, topo.n_rdma);
  print_devices("gpu", topo.gpu, topo.n_gpu);
  if (!xml_path) { /* what this rank would publish for transport choice */
    weft_place here;
    weft_place_here(&topo, &here);
    printf("  place: host id %s, /dev/shm id %#llx, pid namespace %llu\n", here.host_id,
           (unsigned long long)here.shm_ns, (unsigned long long)here.pid_ns);
  }
  return 0;
}

/* Writes `text` in lines of at most `width` columns, each after `indent` spaces. */
static void print_wrapped(const char *text, int indent, int width) {
  while (*text) {
    int len = (int)strlen(text), cut = len;
    if (len > width) { /* break at the last space that fits */
      cut = width;
      while (cut > 0 && text[cut] != ' ') cut--;
      if (cut == 0) cut = width;
    }
    printf("%*s%.*s\n", indent, "", cut, text);
    text += cut;
    while (*text == ' ') text++;
  }
}

/* Every setting, grouped as declared (weft, then each transport's own): its
 * type, default, current value and what it accepts, then its help; a value
 * that communicator creation would refuse is said under it. */
static void print_settings(void) {
  weft_transport_settings_register(); /* their tables, listed after the core's */
  printf("settings (environment variables; unset or empty is the default):\n");
  printf("  %-24s %-8s %-9s %-9s %s\n", "setting", "type", "default", "value", "accepts");
  weft_setting_info info;
  const char *group = "";
  for (int i = 0; weft_setting_get_info(i, &info) == WEFT_OK; i++) {
    if (strcmp(group, info.group)) {
      group = info.group;
      printf("%s:\n", group);
    }
    const char *value = *info.value ? info.value : "-";
    if (!strcmp(info.name, "WEFT_AUTH_TOKEN") && *info.value) value = "(set)"; /* a secret */
    printf("  %-24s %-8s %-9s %-9s %s\n", info.name, info.type_name,
           *info.deflt ? info.deflt : "-", value, info.rule);
    print_wrapped(info.help, 6, 94);
    if (info.refused[0]) {
      char line[300];
      snprintf(line, sizeof line, "REFUSED (communicators will not start): %s", info.refused);
      print_wrapped(line, 6, 94);
    }
  }
}

/* Which algorithm each collective takes by size, from the settings above. */
static void print_choices(void) {
  weft_choice_state c;
  weft_choice_init(&c, 0, 0);
  char text[2048];
  weft_choice_describe(&c, weft_settings()->chunk_bytes, text, sizeof text);
  weft_choice_free(&c);
  printf("\nalgorithms by size (docs/tuning.md; WEFT_ALGO and WEFT_BCAST_FANOUT force them):\n");
  for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) print_wrapped(line, 2, 94);
}

static int usage(void) {
  fprintf(stderr,
          "usage: weft-info [-s | --topo-xml FILE]\n"
          "  -s               settings only\n"
          "  --topo-xml FILE  describe a saved hwloc topology (lstopo --of xml) instead\n");
  return 2;
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "--topo-xml")) return print_topology(argv[2]);
  int settings_only = argc == 2 && !strcmp(argv[1], "-s");
  if (argc > 1 && !settings_only) return usage();
  if (!settings_only) {
    printf("weft %s\n", weft_version_string());
    char transports[512];
    weft_transports_describe(transports, sizeof transports);
    printf("transports: %s\n", transports);
    print_cuda();
    print_gdr();
    printf("dtypes: f32 f64 f16 bf16 i8 u8 i32 i64; ops: sum prod min max avg\n\n");
    print_topology(NULL); /* a failure is said on stderr; the settings still help */
    printf("\n");
  }
  print_settings();
  if (!settings_only) print_choices();
  return 0;
}

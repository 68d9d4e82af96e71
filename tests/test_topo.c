/* test_topo.c - the topology as hwloc reports it, on this machine and on
 * saved XML files of machines we do not have (tests/topo/), and the transport
 * selection rules on the facts those topologies give. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "src/topo/select.h"
#include "src/base/settings.h"
#include "src/topo/topo.h"

#ifndef WEFT_TOPO_FIXTURES
#define WEFT_TOPO_FIXTURES "tests/topo"
#endif

static const char *fixture(const char *name) {
  static char path[512];
  snprintf(path, sizeof path, "%s/%s", WEFT_TOPO_FIXTURES, name);
  return path;
}

/* Loads a fixture or fails the test with hwloc's sentence. */
static void load_fixture(const char *name, weft_topo *topo) {
  weft_error_sink err = {0};
  weft_status st = weft_topo_load(fixture(name), topo, &err);
#ifndef WEFT_HAVE_HWLOC
  assert_int_equal(st, WEFT_ERR_UNSUPPORTED);
  skip(); /* saved topologies need hwloc */
#endif
  if (st != WEFT_OK) fail_msg("%s: %s", name, err.msg);
}

/* The facts a rank on that topology would publish; `boot` stands in for the
 * kernel boot id, shm and pid namespaces are the same unless a test changes them. */
static weft_place place_on(const weft_topo *topo, const char *boot) {
  weft_place p;
  memset(&p, 0, sizeof p);
  snprintf(p.host_id, sizeof p.host_id, "%.40s/%.20s", topo->hostname, boot);
  p.shm_ns = 0x2a00000001ULL;
  p.pid_ns = 4026531836ULL;
  p.rdma_devices = topo->n_rdma;
  return p;
}

static const char *const all_built[] = {"shm", "ibv", "tcp"};
static const char *const no_ibv_built[] = {"shm", "tcp"};

/* ---- loading -------------------------------------------------------------- */

static void one_host_fixture(void **state) {
  (void)state;
  weft_topo t;
  load_fixture("one_host.xml", &t);
  assert_string_equal(t.hostname, "vm");
  assert_int_equal(t.packages, 1);
  assert_int_equal(t.numa_nodes, 1);
  assert_int_equal(t.cores, 2);
  assert_int_equal(t.pus, 2);
  assert_int_equal(t.n_net, 1);
  assert_string_equal(t.net[0].name, "eth0");
  assert_int_equal(t.net[0].numa_node, 0);
  assert_string_equal(t.net[0].pci_bus_id, "0000:00:03.0");
  assert_int_equal(t.n_rdma, 0);
  assert_int_equal(t.n_gpu, 0);
  assert_string_equal(t.source, "hwloc XML");
  assert_non_null(strstr(t.xml_path, "one_host.xml"));
}

static void two_hosts_differ_only_in_name(void **state) {
  (void)state;
  weft_topo a, b;
  load_fixture("two_hosts_a.xml", &a);
  load_fixture("two_hosts_b.xml", &b);
  assert_string_equal(a.hostname, "node-a");
  assert_string_equal(b.hostname, "node-b");
  assert_int_equal(a.cores, b.cores);
  assert_int_equal(a.pus, b.pus);
  assert_int_equal(a.n_net, 1);
  assert_int_equal(b.n_net, 1);
  assert_string_equal(a.net[0].name, b.net[0].name);
  assert_int_equal(a.n_rdma + b.n_rdma, 0);
}

/* rdma_host.xml: a two-socket GPU node with an InfiniBand HCA, written by
 * hand in hwloc 2.x's XML format (the shape lstopo writes for a ConnectX-6
 * and an A100): HCA mlx5_0 / ib0 near NUMA node 1, GPU cuda0 (also seen by
 * DRM as card1) and eth0 near NUMA node 0; 2 packages, 2 NUMA nodes, 4
 * cores, 8 PUs. The fixtures hold no XML comment: hwloc's minimal parser
 * (no libhwloc-plugins) refuses one, and the suite runs this test with
 * either parser. */
static void rdma_host_fixture(void **state) {
  (void)state;
  weft_topo t;
  load_fixture("rdma_host.xml", &t);
  assert_string_equal(t.hostname, "gpu-node-1");
  assert_int_equal(t.packages, 2);
  assert_int_equal(t.numa_nodes, 2);
  assert_int_equal(t.cores, 4);
  assert_int_equal(t.pus, 8);
  assert_int_equal(t.n_rdma, 1);
  assert_string_equal(t.rdma[0].name, "mlx5_0");
  assert_int_equal(t.rdma[0].numa_node, 1);
  assert_string_equal(t.rdma[0].pci_bus_id, "0000:3b:00.0");
  assert_int_equal(t.n_net, 2);
  int ib = strcmp(t.net[0].name, "ib0") == 0 ? 0 : 1;
  assert_string_equal(t.net[ib].name, "ib0");
  assert_string_equal(t.net[ib].pci_bus_id, "0000:3b:00.0");
  assert_string_equal(t.net[1 - ib].name, "eth0");
  assert_int_equal(t.net[1 - ib].numa_node, 0);
  assert_int_equal(t.n_gpu, 1);
  assert_string_equal(t.gpu[0].name, "cuda0");
  assert_int_equal(t.gpu[0].numa_node, 0);
  assert_string_equal(t.gpu[0].pci_bus_id, "0000:17:00.0");
}

static void missing_xml_names_the_file(void **state) {
  (void)state;
  weft_topo t;
  weft_error_sink err = {0};
  const char *path = "/nonexistent/weft-topology-12345.xml";
  weft_status st = weft_topo_load(path, &t, &err);
#ifdef WEFT_HAVE_HWLOC
  assert_int_equal(st, WEFT_ERR_INVALID);
  assert_non_null(strstr(err.msg, "No such file"));
#else
  assert_int_equal(st, WEFT_ERR_UNSUPPORTED);
#endif
  assert_non_null(strstr(err.msg, path));
}

/* Writes `text` to a temporary file and loads it as a topology. */
static weft_status load_text(const char *text, char *path, weft_error_sink *err) {
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  weft_topo t;
  weft_status st = weft_topo_load(path, &t, err);
  unlink(path);
  return st;
}

static void garbage_xml_names_the_file(void **state) {
  (void)state;
  const char *bad[] = {
      "<?xml version=\"1.0\"?>\n<topology version=\"2.0\"><object type=", /* cut short */
      "<?xml version=\"1.0\"?>\n<topology version=\"2.0\"><object type=\"Package\"/></topology>",
      "", /* empty */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char path[] = "/tmp/weft-topo-garbage-XXXXXX";
    weft_error_sink err = {0};
    weft_status st = load_text(bad[i], path, &err);
#ifdef WEFT_HAVE_HWLOC
    assert_int_equal(st, WEFT_ERR_INVALID);
    assert_non_null(strstr(err.msg, "not a valid hwloc XML"));
#else
    assert_int_equal(st, WEFT_ERR_UNSUPPORTED);
#endif
    assert_non_null(strstr(err.msg, path));
  }
}

static void this_machine_loads(void **state) {
  (void)state;
  weft_topo t;
  weft_error_sink err = {0};
  assert_int_equal(weft_topo_load(NULL, &t, &err), WEFT_OK);
  assert_true(t.cores >= 1);
  assert_true(t.pus >= t.cores);
  assert_true(t.packages >= 1);
  assert_true(t.numa_nodes >= 1);
  assert_string_equal(t.xml_path, "");
  char host[64] = "";
  gethostname(host, sizeof host - 1);
  assert_string_equal(t.hostname, host);
#ifdef WEFT_HAVE_HWLOC
  assert_string_equal(t.source, "hwloc");
#else
  assert_string_equal(t.source, "fallback (no hwloc)");
#endif
}

static void describe_names_host_and_devices(void **state) {
  (void)state;
  weft_topo t;
  load_fixture("rdma_host.xml", &t);
  char line[512];
  weft_topo_describe(&t, line, sizeof line);
  assert_string_equal(line,
                      "host gpu-node-1: 2 packages, 2 NUMA nodes, 4 cores, 8 PUs; "
                      "net: eth0, ib0; rdma: mlx5_0; gpu: cuda0");
  load_fixture("one_host.xml", &t);
  weft_topo_describe(&t, line, sizeof line);
  assert_string_equal(line,
                      "host vm: 1 package, 1 NUMA node, 2 cores, 2 PUs; "
                      "net: eth0; rdma: none; gpu: none");
  char small[12];
  memset(small, 'x', sizeof small);
  weft_topo_describe(&t, small, sizeof small);
  assert_int_equal(strlen(small), sizeof small - 1); /* cut, terminated, not overrun */
  assert_string_equal(small, "host vm: 1 ");
}

/* ---- selection -------------------------------------------------------------- */

static void same_host_uses_shm(void **state) {
  (void)state;
  weft_topo t;
  load_fixture("one_host.xml", &t);
  weft_place a = place_on(&t, "boot1"), b = place_on(&t, "boot1");
  char why[200];
  assert_true(weft_select_shm_reaches(&a, &b, why, sizeof why));
  assert_non_null(strstr(why, "same host vm/boot1"));
  assert_false(weft_select_ibv_reaches(&a, &b, why, sizeof why));
  assert_non_null(strstr(why, "same host"));
}

static void two_hosts_without_rdma_use_tcp(void **state) {
  (void)state;
  weft_topo ta, tb;
  load_fixture("two_hosts_a.xml", &ta);
  load_fixture("two_hosts_b.xml", &tb);
  weft_place a = place_on(&ta, "boot1"), b = place_on(&tb, "boot2");
  char why[200];
  assert_false(weft_select_shm_reaches(&a, &b, why, sizeof why));
  assert_string_equal(why, "different host (node-a/boot1 vs node-b/boot2)");
  assert_false(weft_select_ibv_reaches(&a, &b, why, sizeof why));
  assert_non_null(strstr(why, "no RDMA device on this rank"));
  const char *order[3];
  assert_int_equal(weft_select_order(&ta, all_built, 3, NULL, order, why, sizeof why), 2);
  assert_string_equal(order[0], "shm");
  assert_string_equal(order[1], "tcp");
  assert_non_null(strstr(why, "no RDMA device"));
}

static void rdma_hosts_use_ibv(void **state) {
  (void)state;
  weft_topo t;
  load_fixture("rdma_host.xml", &t);
  weft_place a = place_on(&t, "boot1"), b = place_on(&t, "boot2");
  snprintf(b.host_id, sizeof b.host_id, "gpu-node-2/boot2");
  char why[200];
  assert_false(weft_select_shm_reaches(&a, &b, why, sizeof why));
  assert_true(weft_select_ibv_reaches(&a, &b, why, sizeof why));
  assert_non_null(strstr(why, "gpu-node-2"));
  b.rdma_devices = 0; /* the peer has none: verbs cannot reach it */
  assert_false(weft_select_ibv_reaches(&a, &b, why, sizeof why));
  assert_non_null(strstr(why, "no RDMA device on the peer"));

  const char *order[3];
  assert_int_equal(weft_select_order(&t, all_built, 3, "", order, why, sizeof why), 3);
  assert_string_equal(order[0], "shm");
  assert_string_equal(order[1], "ibv");
  assert_string_equal(order[2], "tcp");
  assert_int_equal(weft_select_order(&t, no_ibv_built, 2, NULL, order, why, sizeof why), 2);
  assert_string_equal(order[0], "shm");
  assert_string_equal(order[1], "tcp");
}

static void other_container_or_pid_namespace_refuses_shm(void **state) {
  (void)state;
  weft_topo t;
  load_fixture("one_host.xml", &t);
  weft_place a = place_on(&t, "boot1"), b = place_on(&t, "boot1");
  char why[200];
  b.shm_ns ^= 1;
  assert_false(weft_select_shm_reaches(&a, &b, why, sizeof why));
  assert_non_null(strstr(why, "different /dev/shm"));
  b.shm_ns = 0;
  a.shm_ns = 0; /* equal, but neither has a usable /dev/shm */
  assert_false(weft_select_shm_reaches(&a, &b, why, sizeof why));
  assert_non_null(strstr(why, "/dev/shm"));
  b = a = place_on(&t, "boot1");
  b.pid_ns += 1;
  assert_false(weft_select_shm_reaches(&a, &b, why, sizeof why));
  assert_non_null(strstr(why, "another pid namespace"));
  a.pid_ns = b.pid_ns = 0;
  assert_false(weft_select_shm_reaches(&a, &b, why, sizeof why));
  assert_non_null(strstr(why, "pid namespace"));
}

static void forced_transport(void **state) {
  (void)state;
  weft_topo t;
  load_fixture("rdma_host.xml", &t);
  const char *order[3] = {NULL, NULL, NULL};
  char why[200];
  assert_int_equal(weft_select_order(&t, all_built, 3, "tcp", order, why, sizeof why), 1);
  assert_string_equal(order[0], "tcp");
  assert_non_null(strstr(why, "WEFT_TRANSPORT=tcp"));
  assert_int_equal(weft_select_order(&t, no_ibv_built, 2, "ibv", order, why, sizeof why),
                   WEFT_ERR_INVALID);
  assert_string_equal(why, "WEFT_TRANSPORT=ibv: this build has shm, tcp");
  assert_int_equal(weft_select_order(&t, no_ibv_built, 2, "xyz", order, why, sizeof why),
                   WEFT_ERR_INVALID);
  assert_non_null(strstr(why, "WEFT_TRANSPORT=xyz"));
}

static void host_id_setting_names_the_host(void **state) {
  (void)state;
  weft_topo t;
  weft_error_sink err = {0};
  assert_int_equal(weft_topo_load(NULL, &t, &err), WEFT_OK);
  weft_place p;
  setenv("WEFT_HOST_ID", "rack7-node3", 1);
  weft_settings_reload();
  weft_place_here(&t, &p);
  assert_string_equal(p.host_id, "rack7-node3");
  unsetenv("WEFT_HOST_ID");
  weft_settings_reload();
  weft_place_here(&t, &p);
  char host[64] = "";
  gethostname(host, sizeof host - 1);
  assert_true(!strncmp(p.host_id, host, strlen(host)) && p.host_id[strlen(host)] == '/');
  assert_true(strlen(p.host_id) > strlen(host) + 8); /* the boot id follows */
  if (access("/dev/shm", F_OK) == 0) assert_true(p.shm_ns != 0);
  if (access("/proc/self/ns/pid", F_OK) == 0) assert_true(p.pid_ns != 0);
  assert_int_equal(p.rdma_devices, t.n_rdma);
  weft_place q;
  weft_place_here(&t, &q); /* two ranks here would agree: shared memory reaches */
  char why[200];
  assert_true(weft_select_shm_reaches(&p, &q, why, sizeof why));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(one_host_fixture),
      cmocka_unit_test(two_hosts_differ_only_in_name),
      cmocka_unit_test(rdma_host_fixture),
      cmocka_unit_test(missing_xml_names_the_file),
      cmocka_unit_test(garbage_xml_names_the_file),
      cmocka_unit_test(this_machine_loads),
      cmocka_unit_test(describe_names_host_and_devices),
      cmocka_unit_test(same_host_uses_shm),
      cmocka_unit_test(two_hosts_without_rdma_use_tcp),
      cmocka_unit_test(rdma_hosts_use_ibv),
      cmocka_unit_test(other_container_or_pid_namespace_refuses_shm),
      cmocka_unit_test(forced_transport),
      cmocka_unit_test(host_id_setting_names_the_host),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

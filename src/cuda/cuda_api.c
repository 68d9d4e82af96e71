/* cuda_api.c - fills the CUDA driver table (cuda_api.h) from libcuda.so.1, or
 * the file WEFT_CUDA_LIBRARY names, with dlopen and dlsym of the driver's
 * versioned names, and initializes the driver once. A process keeps the
 * first library it loaded: the driver cannot be unloaded and loaded again. */
#include "src/cuda/cuda_api.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "src/base/log.h"
#include "src/base/settings.h"

static pthread_mutex_t cuda_api_lock = PTHREAD_MUTEX_INITIALIZER;
static weft_cuda_api cuda_api_table;
static bool cuda_api_tried;
static char cuda_api_why[512]; /* why the first load failed, for every later caller */
static char cuda_api_name[256];

/* A required symbol: a library without it is not usable. */
#define CUDA_API_SYM(member, symbol)                                     \
  do {                                                                   \
    *(void **)&api->member = dlsym(handle, symbol);                      \
    if (!api->member && !missing) missing = symbol;                      \
  } while (0)

static const char *cuda_api_fill(void *handle, weft_cuda_api *api) {
  const char *missing = NULL;
  CUDA_API_SYM(init, "cuInit");
  CUDA_API_SYM(driver_get_version, "cuDriverGetVersion");
  CUDA_API_SYM(get_error_string, "cuGetErrorString");
  CUDA_API_SYM(get_error_name, "cuGetErrorName");
  CUDA_API_SYM(device_get_count, "cuDeviceGetCount");
  CUDA_API_SYM(device_get, "cuDeviceGet");
  CUDA_API_SYM(device_get_name, "cuDeviceGetName");
  CUDA_API_SYM(device_get_attribute, "cuDeviceGetAttribute");
  CUDA_API_SYM(device_get_pci_bus_id, "cuDeviceGetPCIBusId");
  CUDA_API_SYM(device_can_access_peer, "cuDeviceCanAccessPeer");
  CUDA_API_SYM(primary_ctx_retain, "cuDevicePrimaryCtxRetain");
  CUDA_API_SYM(primary_ctx_release, "cuDevicePrimaryCtxRelease_v2");
  CUDA_API_SYM(ctx_get_current, "cuCtxGetCurrent");
  CUDA_API_SYM(ctx_set_current, "cuCtxSetCurrent");
  CUDA_API_SYM(pointer_get_attributes, "cuPointerGetAttributes");
  CUDA_API_SYM(mem_get_address_range, "cuMemGetAddressRange_v2");
  CUDA_API_SYM(mem_alloc, "cuMemAlloc_v2");
  CUDA_API_SYM(mem_free, "cuMemFree_v2");
  CUDA_API_SYM(mem_host_alloc, "cuMemHostAlloc");
  CUDA_API_SYM(mem_free_host, "cuMemFreeHost");
  CUDA_API_SYM(mem_host_register, "cuMemHostRegister_v2");
  CUDA_API_SYM(mem_host_unregister, "cuMemHostUnregister");
  CUDA_API_SYM(memset_d8_async, "cuMemsetD8Async");
  CUDA_API_SYM(memcpy_htod_async, "cuMemcpyHtoDAsync_v2");
  CUDA_API_SYM(memcpy_dtoh_async, "cuMemcpyDtoHAsync_v2");
  CUDA_API_SYM(memcpy_dtod_async, "cuMemcpyDtoDAsync_v2");
  CUDA_API_SYM(stream_create, "cuStreamCreate");
  CUDA_API_SYM(stream_destroy, "cuStreamDestroy_v2");
  CUDA_API_SYM(stream_wait_event, "cuStreamWaitEvent");
  CUDA_API_SYM(stream_query, "cuStreamQuery");
  CUDA_API_SYM(stream_synchronize, "cuStreamSynchronize");
  CUDA_API_SYM(event_create, "cuEventCreate");
  CUDA_API_SYM(event_destroy, "cuEventDestroy_v2");
  CUDA_API_SYM(event_record, "cuEventRecord");
  CUDA_API_SYM(event_query, "cuEventQuery");
  CUDA_API_SYM(event_synchronize, "cuEventSynchronize");
  CUDA_API_SYM(stream_wait_value32, "cuStreamWaitValue32_v2");
  CUDA_API_SYM(stream_write_value32, "cuStreamWriteValue32_v2");
  CUDA_API_SYM(module_load_data, "cuModuleLoadData");
  CUDA_API_SYM(module_unload, "cuModuleUnload");
  CUDA_API_SYM(module_get_function, "cuModuleGetFunction");
  CUDA_API_SYM(launch_kernel, "cuLaunchKernel");
  CUDA_API_SYM(ipc_get_mem_handle, "cuIpcGetMemHandle");
  CUDA_API_SYM(ipc_open_mem_handle, "cuIpcOpenMemHandle_v2");
  CUDA_API_SYM(ipc_close_mem_handle, "cuIpcCloseMemHandle");
  /* optional: a driver without it still runs everything but GPUDirect by dma-buf */
  *(void **)&api->mem_get_handle_for_address_range = dlsym(handle, "cuMemGetHandleForAddressRange");
  return missing;
}

void weft_cuda_error_words(const weft_cuda_api *api, CUresult result, char *out, size_t len) {
  const char *name = NULL, *text = NULL;
  if (api && api->get_error_name) api->get_error_name(result, &name);
  if (api && api->get_error_string) api->get_error_string(result, &text);
  if (name && text)
    snprintf(out, len, "%s (%s)", name, text);
  else
    snprintf(out, len, "CUDA error %d", (int)result);
}

/* Loads and initializes; on failure leaves the reason in cuda_api_why. */
static bool cuda_api_open(const char *name) {
  void *handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char *why = dlerror();
    snprintf(cuda_api_why, sizeof cuda_api_why,
             "cuda: cannot load %s (%s): no NVIDIA driver on this node", name,
             why ? why : "not found");
    return false;
  }
  weft_cuda_api api = {0};
  const char *missing = cuda_api_fill(handle, &api);
  if (missing) {
    snprintf(cuda_api_why, sizeof cuda_api_why,
             "cuda: %s lacks %s: the driver is too old or this is not libcuda", name, missing);
    dlclose(handle);
    return false;
  }
  int version = 0;
  if (api.driver_get_version(&version) == CUDA_SUCCESS && version < CUDA_VERSION) {
    snprintf(cuda_api_why, sizeof cuda_api_why,
             "cuda: the driver supports CUDA %d.%d, older than the %d.%d weft was built with: "
             "update the NVIDIA driver",
             version / 1000, version % 1000 / 10, CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10);
    dlclose(handle); /* before cuInit: nothing of it runs yet */
    return false;
  }
  CUresult r = api.init(0);
  if (r != CUDA_SUCCESS) {
    char words[160];
    weft_cuda_error_words(&api, r, words, sizeof words);
    snprintf(cuda_api_why, sizeof cuda_api_why, "cuda: cuInit: %s", words);
    return false; /* an initialized driver stays loaded */
  }
  snprintf(cuda_api_name, sizeof cuda_api_name, "%s", name);
  api.library = cuda_api_name;
  api.driver_version = version;
  cuda_api_table = api;
  WEFT_INFO(WEFT_SUBSYS_INIT, "cuda: loaded %s, driver for CUDA %d.%d", name, version / 1000,
            version % 1000 / 10);
  return true;
}

const weft_cuda_api *weft_cuda_api_load(weft_error_sink *err) {
  const char *name = weft_settings()->cuda_library;
  if (!*name) name = "libcuda.so.1";
  pthread_mutex_lock(&cuda_api_lock);
  if (!cuda_api_tried) {
    cuda_api_tried = true;
    if (!cuda_api_open(name)) cuda_api_table.library = NULL;
  } else if (cuda_api_table.library && strcmp(cuda_api_name, name) != 0) {
    snprintf(cuda_api_why, sizeof cuda_api_why,
             "cuda: %s is loaded already; WEFT_CUDA_LIBRARY=%s cannot replace it in one process",
             cuda_api_name, name);
    pthread_mutex_unlock(&cuda_api_lock);
    weft_error_sink_set(err, "%s", cuda_api_why);
    return NULL;
  }
  const weft_cuda_api *api = cuda_api_table.library ? &cuda_api_table : NULL;
  pthread_mutex_unlock(&cuda_api_lock);
  if (!api) weft_error_sink_set(err, "%s", cuda_api_why);
  return api;
}

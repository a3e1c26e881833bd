/* A PJRT plugin as a plugin author may ship one: it forwards to another plugin
 * (FORWARD_TO, the path of a PJRT plugin, given at compile time) through a copy of its
 * function table, with changes made at compile time:
 *
 *   -DNULL_OPTIONAL  the optional functions below are NULL
 *   -DCUT_SHORT      the table ends before PJRT_Executable_OutputElementTypes while the
 *                    plugin reports API version 0.60 (which has that function and more)
 *   -DNO_ERROR_CODES PJRT_Error_GetCode is NULL (no error could be read)
 *   -DOLD_VERSION    the whole table, but the plugin reports API version 0.28 (before
 *                    PJRT_Executable_OutputElementTypes and the functions added since)
 *
 * Built by tests/pjrt_layer/test_pjrt_forwarding_plugin.py with gcc against the PJRT C
 * API header ifrtpy is compiled with. */

#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "pjrt_c_api.h"

static PJRT_Api* table = NULL;

#define CLEAR(size, field)                                   \
  if (offsetof(PJRT_Api, field) + sizeof(void*) <= (size)) { \
    table->field = NULL;                                     \
  }

const PJRT_Api* GetPjrtApi(void) {
  if (table != NULL) return table;
  void* library = dlopen(FORWARD_TO, RTLD_NOW | RTLD_LOCAL);
  if (library == NULL) return NULL;
  const PJRT_Api* (*get_api)(void) =
      (const PJRT_Api* (*)(void))dlsym(library, "GetPjrtApi");
  if (get_api == NULL) return NULL;
  const PJRT_Api* real = get_api();
  if (real == NULL) return NULL;
  size_t size = real->struct_size; /* the table may be longer than this header's */
  table = (PJRT_Api*)malloc(size);
  if (table == NULL) return NULL;
  memcpy(table, real, size);
#ifdef NULL_OPTIONAL
  CLEAR(size, PJRT_Executable_OutputMemoryKinds);
  CLEAR(size, PJRT_Executable_GetCostAnalysis);
  CLEAR(size, PJRT_Buffer_CopyToDevice);
  CLEAR(size, PJRT_Device_MemoryStats);
  CLEAR(size, PJRT_Executable_Fingerprint);
  CLEAR(size, PJRT_LoadedExecutable_Fingerprint);
  CLEAR(size, PJRT_Buffer_CopyToMemory);
  CLEAR(size, PJRT_Executable_GetCompiledMemoryStats);
  CLEAR(size, PJRT_Client_CreateViewOfDeviceBuffer);
  CLEAR(size, PJRT_Executable_Serialize);
  CLEAR(size, PJRT_Buffer_UnsafePointer);
  CLEAR(size, PJRT_Executable_OptimizedProgram);
  CLEAR(size, PJRT_Buffer_OpaqueDeviceMemoryDataPointer);
#endif
#ifdef NO_ERROR_CODES
  CLEAR(size, PJRT_Error_GetCode);
#endif
#ifdef OLD_VERSION
  table->pjrt_api_version.minor_version = 28;
#endif
#ifdef CUT_SHORT
  table->struct_size = offsetof(PJRT_Api, PJRT_Executable_OutputElementTypes);
  table->pjrt_api_version.minor_version = 60;
#endif
  return table;
}

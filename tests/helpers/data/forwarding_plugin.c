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
 *   -DFAILING_LAYOUTS the layouts extension's serialize and destroy fail, each with an
 *                    error of its own ("serialize failed here", INTERNAL; "destroy
 *                    failed here", DATA_LOSS), made here: the error functions answer for
 *                    these and forward the others; the destroy still destroys
 *
 * Built by tests/pjrt_layer/test_pjrt_forwarding_plugin.py with gcc against the PJRT C
 * API header ifrtpy is compiled with. */

#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "pjrt_c_api.h"

static PJRT_Api* table = NULL;

#ifdef FAILING_LAYOUTS
typedef struct {
  PJRT_Error_Code code;
  const char* message;
} OwnError;
static const OwnError serialize_failed = {PJRT_Error_Code_INTERNAL, "serialize failed here"};
static const OwnError destroy_failed = {PJRT_Error_Code_DATA_LOSS, "destroy failed here"};
static const PJRT_Api* real_api = NULL;

/* The layouts extension's first four functions (pjrt_c_api_layouts_extension.h). */
typedef PJRT_Error* (*LayoutFunction)(void* args);
typedef struct {
  PJRT_Extension_Base base;
  LayoutFunction destroy, serialize, default_layout, buffer_layout;
} Layouts;
static LayoutFunction real_destroy = NULL;

static int own(const PJRT_Error* error) {
  return error == (const PJRT_Error*)&serialize_failed ||
         error == (const PJRT_Error*)&destroy_failed;
}

static void error_destroy(PJRT_Error_Destroy_Args* args) {
  if (!own(args->error)) real_api->PJRT_Error_Destroy(args);
}

static void error_message(PJRT_Error_Message_Args* args) {
  if (!own(args->error)) {
    real_api->PJRT_Error_Message(args);
    return;
  }
  args->message = ((const OwnError*)args->error)->message;
  args->message_size = strlen(args->message);
}

static PJRT_Error* error_code(PJRT_Error_GetCode_Args* args) {
  if (!own(args->error)) return real_api->PJRT_Error_GetCode(args);
  args->code = ((const OwnError*)args->error)->code;
  return NULL;
}

static PJRT_Error* failing_serialize(void* args) {
  (void)args;
  return (PJRT_Error*)&serialize_failed;
}

static PJRT_Error* failing_destroy(void* args) {
  PJRT_Error* error = real_destroy(args);
  if (error != NULL) {
    PJRT_Error_Destroy_Args destroy = {PJRT_Error_Destroy_Args_STRUCT_SIZE, NULL, error};
    real_api->PJRT_Error_Destroy(&destroy);
  }
  return (PJRT_Error*)&destroy_failed;
}

/* A copy of the extension chain of ``real``, its layouts extension failing. */
static void fail_layouts(const PJRT_Api* real) {
  PJRT_Extension_Base** link = &table->extension_start;
  for (PJRT_Extension_Base* ext = real->extension_start; ext != NULL; ext = ext->next) {
    PJRT_Extension_Base* copy = (PJRT_Extension_Base*)malloc(ext->struct_size);
    memcpy(copy, ext, ext->struct_size);
    if (ext->type == PJRT_Extension_Type_Layouts) {
      Layouts* layouts = (Layouts*)copy;
      real_destroy = layouts->destroy;
      layouts->destroy = failing_destroy;
      layouts->serialize = failing_serialize;
    }
    *link = copy;
    link = &copy->next;
  }
  *link = NULL;
  real_api = real;
  table->PJRT_Error_Destroy = error_destroy;
  table->PJRT_Error_Message = error_message;
  table->PJRT_Error_GetCode = error_code;
}
#endif

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
#ifdef FAILING_LAYOUTS
  fail_layouts(real);
#endif
#ifdef CUT_SHORT
  table->struct_size = offsetof(PJRT_Api, PJRT_Executable_OutputElementTypes);
  table->pjrt_api_version.minor_version = 60;
#endif
  return table;
}

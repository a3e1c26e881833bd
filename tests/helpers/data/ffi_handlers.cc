// XLA FFI handlers of the tests' own, built by tests/ffi/test_ffi.py with g++ against
// the headers jaxlib ships (jax.ffi.include_dir()).
//
// * ScaleTyped: y = x * scale (f32 buffers, f32 attribute "scale"), written with the C++
//   API (xla/ffi/api/ffi.h) as jax users write handlers; it claims the XLA FFI version of
//   those headers.
// * ScaleAbi: the same op on the C ABI alone (xla/ffi/api/c_api.h), claiming the version
//   of the framework that calls it, so that plugins running an older XLA FFI take it too.
// Both return an error (INVALID_ARGUMENT) for a negative scale.
// * DoubleLegacy: a legacy custom call (status-returning API): 4 floats doubled.
#include <cstdint>
#include <cstring>

#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

static ffi::Error ScaleImpl(ffi::Buffer<ffi::F32> x, float scale,
                            ffi::ResultBuffer<ffi::F32> y) {
  if (scale < 0) return ffi::Error::InvalidArgument("ScaleTyped refuses a negative scale");
  for (size_t i = 0; i < x.element_count(); ++i) {
    y->typed_data()[i] = x.typed_data()[i] * scale;
  }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(ScaleTyped, ScaleImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("scale")
                                  .Ret<ffi::Buffer<ffi::F32>>());

static XLA_FFI_Error* AbiError(const XLA_FFI_Api* api, const char* message) {
  XLA_FFI_Error_Create_Args args;
  std::memset(&args, 0, sizeof(args));
  args.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
  args.message = message;
  args.errc = XLA_FFI_Error_Code_INVALID_ARGUMENT;
  return api->XLA_FFI_Error_Create(&args);
}

extern "C" XLA_FFI_Error* ScaleAbi(XLA_FFI_CallFrame* frame) {
  if (frame->extension_start != nullptr &&
      frame->extension_start->type == XLA_FFI_Extension_Metadata) {
    auto* metadata = reinterpret_cast<XLA_FFI_Metadata_Extension*>(frame->extension_start)->metadata;
    metadata->api_version.major_version = frame->api->api_version.major_version;
    metadata->api_version.minor_version = frame->api->api_version.minor_version;
    metadata->traits = 0;
    return nullptr;
  }
  if (frame->stage != XLA_FFI_ExecutionStage_EXECUTE) return nullptr;
  if (frame->args.size != 1 || frame->rets.size != 1 || frame->attrs.size != 1) {
    return AbiError(frame->api, "ScaleAbi takes one operand, one result and `scale`");
  }
  auto* x = static_cast<XLA_FFI_Buffer*>(frame->args.args[0]);
  auto* y = static_cast<XLA_FFI_Buffer*>(frame->rets.rets[0]);
  auto* scale = static_cast<XLA_FFI_Scalar*>(frame->attrs.attrs[0]);
  if (x->dtype != XLA_FFI_DataType_F32 || y->dtype != XLA_FFI_DataType_F32 ||
      scale->dtype != XLA_FFI_DataType_F32) {
    return AbiError(frame->api, "ScaleAbi takes f32 only");
  }
  int64_t n = 1;
  for (int64_t d = 0; d < x->rank; ++d) n *= x->dims[d];
  const float factor = *static_cast<float*>(scale->value);
  if (factor < 0) return AbiError(frame->api, "ScaleAbi refuses a negative scale");
  for (int64_t i = 0; i < n; ++i) {
    static_cast<float*>(y->data)[i] = static_cast<float*>(x->data)[i] * factor;
  }
  return nullptr;
}

extern "C" void DoubleLegacy(void* out, const void** in, void* status) {
  const float* x = static_cast<const float*>(in[0]);
  float* y = static_cast<float*>(out);
  for (int i = 0; i < 4; ++i) y[i] = 2 * x[i];
}

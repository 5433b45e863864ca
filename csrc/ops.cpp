// The fused compression ops' schema and their CUDA implementation (the CPU side is numba, in
// transientvod/gradients/ops/cpu_kernels.py). Thin on purpose: check the tensors, then call the launchers of
// cuda/compress.cuh on torch's current stream. Each op ORs 1 into `flag` (int32, one element,
// zeroed by the caller) when it meets NaN/Inf; transientvod/gradients/ops/cuda.py reads it back.
#include <Python.h>

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>  // not ATen/cuda/CUDAContext.h: that one pulls in cuSPARSE
#include <torch/library.h>

#include <optional>

#include "cuda/compress.cuh"

namespace {

void check_tensor(const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t numel,
                  const at::Device& device) {
  TORCH_CHECK(t.device() == device, name, " must be on ", device, ", not ", t.device());
  TORCH_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, ", not ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous() && t.numel() == numel, name,
              " must be contiguous with ", numel, " elements");
}

int64_t blocks_of(int64_t n, int64_t block) {
  TORCH_CHECK(block >= TV_BLOCK_MIN && block <= TV_BLOCK_MAX, "block must be in [",
              TV_BLOCK_MIN, ", ", TV_BLOCK_MAX, "], not ", block);
  return (n + block - 1) / block;
}

const at::Tensor& int8_scales(const std::optional<at::Tensor>& scales) {
  TORCH_CHECK(scales.has_value(), "an int8 payload needs its scales tensor");
  return *scales;
}

// The checks of each op, shared by its CUDA implementation and its Meta one (which is only
// these checks: the ops write into their arguments and return nothing, so tracing them with
// fake or meta tensors, as torch.compile and torch.library.opcheck do, needs no more).

void check_compress_ef(const at::Tensor& grad, const at::Tensor& residual, const at::Tensor& payload,
                       const std::optional<at::Tensor>& scales, int64_t block, const at::Tensor& flag) {
  const int64_t n = grad.numel();
  const at::Device device = grad.device();
  check_tensor(grad, "grad", at::kFloat, n, device);
  check_tensor(residual, "residual", at::kFloat, n, device);
  check_tensor(payload, "payload", payload.scalar_type(), n, device);
  check_tensor(flag, "flag", at::kInt, 1, device);
  const at::ScalarType dtype = payload.scalar_type();
  TORCH_CHECK(dtype == at::kHalf || dtype == at::kBFloat16 || dtype == at::kChar,
              "payload must be float16, bfloat16 or int8, not ", dtype);
  if (dtype == at::kChar) {
    check_tensor(int8_scales(scales), "scales", at::kFloat, blocks_of(n, block), device);
  }
}

void check_decompress_avg(const at::Tensor& payload, const at::Tensor& out,
                          const std::optional<at::Tensor>& scales, int64_t block, const at::Tensor& flag) {
  const int64_t n = payload.numel();
  const at::Device device = payload.device();
  check_tensor(payload, "payload", payload.scalar_type(), n, device);
  check_tensor(out, "out", at::kFloat, n, device);
  check_tensor(flag, "flag", at::kInt, 1, device);
  const at::ScalarType dtype = payload.scalar_type();
  TORCH_CHECK(dtype == at::kHalf || dtype == at::kBFloat16 || dtype == at::kFloat || dtype == at::kChar,
              "payload must be float32, float16, bfloat16 or int8, not ", dtype);
  if (dtype == at::kChar) {
    check_tensor(int8_scales(scales), "scales", at::kFloat, blocks_of(n, block), device);
  }
}

void check_decompress_sum(const at::Tensor& payloads, const at::Tensor& out,
                          const std::optional<at::Tensor>& scales, int64_t block, const at::Tensor& flag) {
  TORCH_CHECK(payloads.dim() == 2, "payloads must be [k, m], not ", payloads.sizes());
  const int64_t k = payloads.size(0), m = payloads.size(1);
  TORCH_CHECK(k >= 1 && k <= INT32_MAX, "payloads must have 1 to ", INT32_MAX, " rows, not ", k);
  const at::Device device = payloads.device();
  check_tensor(payloads, "payloads", payloads.scalar_type(), k * m, device);
  check_tensor(out, "out", at::kFloat, m, device);
  check_tensor(flag, "flag", at::kInt, 1, device);
  const at::ScalarType dtype = payloads.scalar_type();
  TORCH_CHECK(dtype == at::kHalf || dtype == at::kBFloat16 || dtype == at::kChar,
              "payloads must be float16, bfloat16 or int8, not ", dtype);
  if (dtype == at::kChar) {
    check_tensor(int8_scales(scales), "scales", at::kFloat, k * blocks_of(m, block), device);
  }
}

void check_reduce_compress_ef(const at::Tensor& payloads, const at::Tensor& residual,
                              const at::Tensor& out_payload, const std::optional<at::Tensor>& in_scales,
                              const std::optional<at::Tensor>& out_scales, int64_t block,
                              const at::Tensor& flag) {
  TORCH_CHECK(payloads.dim() == 2, "payloads must be [k, m], not ", payloads.sizes());
  const int64_t k = payloads.size(0), m = payloads.size(1);
  TORCH_CHECK(k >= 1 && k <= INT32_MAX, "payloads must have 1 to ", INT32_MAX, " rows, not ", k);
  const at::Device device = payloads.device();
  const at::ScalarType dtype = payloads.scalar_type();
  TORCH_CHECK(dtype == at::kHalf || dtype == at::kBFloat16 || dtype == at::kChar,
              "payloads must be float16, bfloat16 or int8, not ", dtype);
  check_tensor(payloads, "payloads", dtype, k * m, device);
  check_tensor(residual, "residual", at::kFloat, m, device);
  check_tensor(out_payload, "out_payload", dtype, m, device);  // the owner re-encodes in its format
  check_tensor(flag, "flag", at::kInt, 1, device);
  if (dtype == at::kChar) {
    const int64_t blocks = blocks_of(m, block);
    TORCH_CHECK(in_scales.has_value() && out_scales.has_value(),
                "int8 payloads need in_scales and out_scales");
    check_tensor(*in_scales, "in_scales", at::kFloat, k * blocks, device);
    check_tensor(*out_scales, "out_scales", at::kFloat, blocks, device);
  }
}

void compress_ef_meta(const at::Tensor& grad, at::Tensor& residual, at::Tensor& payload, double,
                      const std::optional<at::Tensor>& scales, int64_t block, at::Tensor& flag) {
  check_compress_ef(grad, residual, payload, scales, block, flag);
}

void decompress_avg_meta(const at::Tensor& payload, at::Tensor& out, double,
                         const std::optional<at::Tensor>& scales, int64_t block, at::Tensor& flag) {
  check_decompress_avg(payload, out, scales, block, flag);
}

void decompress_sum_meta(const at::Tensor& payloads, at::Tensor& out, double,
                         const std::optional<at::Tensor>& scales, int64_t block, at::Tensor& flag) {
  check_decompress_sum(payloads, out, scales, block, flag);
}

void reduce_compress_ef_meta(const at::Tensor& payloads, at::Tensor& residual, at::Tensor& out_payload,
                             double, const std::optional<at::Tensor>& in_scales,
                             const std::optional<at::Tensor>& out_scales, int64_t block, at::Tensor& flag) {
  check_reduce_compress_ef(payloads, residual, out_payload, in_scales, out_scales, block, flag);
}

void compress_ef(const at::Tensor& grad, at::Tensor& residual, at::Tensor& payload,
                 double weight, const std::optional<at::Tensor>& scales, int64_t block,
                 at::Tensor& flag) {
  check_compress_ef(grad, residual, payload, scales, block, flag);
  const int64_t n = grad.numel();
  const c10::cuda::CUDAGuard guard(grad.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const float w = static_cast<float>(weight);  // the CPU side multiplies by a float32 too
  int* f = flag.mutable_data_ptr<int>();
  switch (payload.scalar_type()) {
    case at::kHalf:
      C10_CUDA_CHECK(tv_compress_ef_f16(grad.const_data_ptr<float>(),
                                        residual.mutable_data_ptr<float>(),
                                        static_cast<unsigned short*>(payload.mutable_data_ptr()),
                                        w, n, f, stream));
      break;
    case at::kBFloat16:
      C10_CUDA_CHECK(tv_compress_ef_bf16(grad.const_data_ptr<float>(),
                                         residual.mutable_data_ptr<float>(),
                                         static_cast<unsigned short*>(payload.mutable_data_ptr()),
                                         w, n, f, stream));
      break;
    case at::kChar: {
      const at::Tensor& s = int8_scales(scales);
      C10_CUDA_CHECK(tv_compress_ef_i8(grad.const_data_ptr<float>(),
                                       residual.mutable_data_ptr<float>(),
                                       payload.mutable_data_ptr<int8_t>(),
                                       s.mutable_data_ptr<float>(), w, n, block, f, stream));
      break;
    }
    default:
      TORCH_CHECK(false, "payload must be float16, bfloat16 or int8, not ", payload.scalar_type());
  }
}

void decompress_avg(const at::Tensor& payload, at::Tensor& out, double inv_n,
                    const std::optional<at::Tensor>& scales, int64_t block, at::Tensor& flag) {
  check_decompress_avg(payload, out, scales, block, flag);
  const int64_t n = payload.numel();
  const c10::cuda::CUDAGuard guard(payload.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const float s_inv = static_cast<float>(inv_n);
  int* f = flag.mutable_data_ptr<int>();
  switch (payload.scalar_type()) {
    case at::kHalf:
      C10_CUDA_CHECK(tv_decompress_avg_f16(
          static_cast<const unsigned short*>(payload.const_data_ptr()),
          out.mutable_data_ptr<float>(), s_inv, n, f, stream));
      break;
    case at::kBFloat16:
      C10_CUDA_CHECK(tv_decompress_avg_bf16(
          static_cast<const unsigned short*>(payload.const_data_ptr()),
          out.mutable_data_ptr<float>(), s_inv, n, f, stream));
      break;
    case at::kFloat:
      C10_CUDA_CHECK(tv_decompress_avg_f32(payload.const_data_ptr<float>(),
                                           out.mutable_data_ptr<float>(), s_inv, n, f, stream));
      break;
    case at::kChar: {
      const at::Tensor& s = int8_scales(scales);
      C10_CUDA_CHECK(tv_decompress_avg_i8(payload.const_data_ptr<int8_t>(),
                                          s.const_data_ptr<float>(),
                                          out.mutable_data_ptr<float>(), s_inv, n, block, f,
                                          stream));
      break;
    }
    default:
      TORCH_CHECK(false, "payload must be float32, float16, bfloat16 or int8, not ",
                  payload.scalar_type());
  }
}

void decompress_sum(const at::Tensor& payloads, at::Tensor& out, double inv_n,
                    const std::optional<at::Tensor>& scales, int64_t block, at::Tensor& flag) {
  check_decompress_sum(payloads, out, scales, block, flag);
  const int k = static_cast<int>(payloads.size(0));
  const int64_t m = payloads.size(1);
  const c10::cuda::CUDAGuard guard(payloads.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const float s_inv = static_cast<float>(inv_n);
  float* o = out.mutable_data_ptr<float>();
  int* f = flag.mutable_data_ptr<int>();
  switch (payloads.scalar_type()) {
    case at::kHalf:
      C10_CUDA_CHECK(tv_decompress_sum_f16(
          static_cast<const unsigned short*>(payloads.const_data_ptr()), k, m, o, s_inv, f, stream));
      break;
    case at::kBFloat16:
      C10_CUDA_CHECK(tv_decompress_sum_bf16(
          static_cast<const unsigned short*>(payloads.const_data_ptr()), k, m, o, s_inv, f, stream));
      break;
    case at::kChar:
      C10_CUDA_CHECK(tv_decompress_sum_i8(payloads.const_data_ptr<int8_t>(),
                                          int8_scales(scales).const_data_ptr<float>(), k, m, o,
                                          s_inv, block, f, stream));
      break;
    default:
      TORCH_CHECK(false, "payloads must be float16, bfloat16 or int8, not ", payloads.scalar_type());
  }
}

void reduce_compress_ef(const at::Tensor& payloads, at::Tensor& residual, at::Tensor& out_payload,
                        double weight, const std::optional<at::Tensor>& in_scales,
                        const std::optional<at::Tensor>& out_scales, int64_t block, at::Tensor& flag) {
  check_reduce_compress_ef(payloads, residual, out_payload, in_scales, out_scales, block, flag);
  const int k = static_cast<int>(payloads.size(0));
  const int64_t m = payloads.size(1);
  const c10::cuda::CUDAGuard guard(payloads.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const float w = static_cast<float>(weight);  // the CPU side multiplies by a float32 too
  float* r = residual.mutable_data_ptr<float>();
  int* f = flag.mutable_data_ptr<int>();
  switch (payloads.scalar_type()) {
    case at::kHalf:
      C10_CUDA_CHECK(tv_reduce_compress_ef_f16(
          static_cast<const unsigned short*>(payloads.const_data_ptr()), k, m, r,
          static_cast<unsigned short*>(out_payload.mutable_data_ptr()), w, f, stream));
      break;
    case at::kBFloat16:
      C10_CUDA_CHECK(tv_reduce_compress_ef_bf16(
          static_cast<const unsigned short*>(payloads.const_data_ptr()), k, m, r,
          static_cast<unsigned short*>(out_payload.mutable_data_ptr()), w, f, stream));
      break;
    case at::kChar:
      C10_CUDA_CHECK(tv_reduce_compress_ef_i8(payloads.const_data_ptr<int8_t>(),
                                              in_scales->const_data_ptr<float>(), k, m, r,
                                              out_payload.mutable_data_ptr<int8_t>(),
                                              out_scales->mutable_data_ptr<float>(), w, block, f,
                                              stream));
      break;
    default:
      TORCH_CHECK(false, "payloads must be float16, bfloat16 or int8, not ", payloads.scalar_type());
  }
}

}  // namespace

// Rows of decompress_sum_'s and reduce_compress_ef_'s `payloads` / `scales` / `in_scales` are
// the k ranks' copies, summed in row order.
TORCH_LIBRARY(transientvod, m) {
  m.def("compress_ef_(Tensor grad, Tensor(a!) residual, Tensor(b!) payload, float weight, "
        "Tensor(c!)? scales, int block, Tensor(d!) flag) -> ()");
  m.def("decompress_avg_(Tensor payload, Tensor(a!) out, float inv_n, Tensor? scales, "
        "int block, Tensor(b!) flag) -> ()");
  m.def("decompress_sum_(Tensor payloads, Tensor(a!) out, float inv_n, Tensor? scales, "
        "int block, Tensor(b!) flag) -> ()");
  m.def("reduce_compress_ef_(Tensor payloads, Tensor(a!) residual, Tensor(b!) out_payload, "
        "float weight, Tensor? in_scales, Tensor(c!)? out_scales, int block, Tensor(d!) flag) -> ()");
}

TORCH_LIBRARY_IMPL(transientvod, CUDA, m) {
  m.impl("compress_ef_", &compress_ef);
  m.impl("decompress_avg_", &decompress_avg);
  m.impl("decompress_sum_", &decompress_sum);
  m.impl("reduce_compress_ef_", &reduce_compress_ef);
}

TORCH_LIBRARY_IMPL(transientvod, Meta, m) {
  m.impl("compress_ef_", &compress_ef_meta);
  m.impl("decompress_avg_", &decompress_avg_meta);
  m.impl("decompress_sum_", &decompress_sum_meta);
  m.impl("reduce_compress_ef_", &reduce_compress_ef_meta);
}

// `import transientvod._C` loads this library, which registers the ops above; the module
// itself is empty (the ops live under torch.ops.transientvod).
PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module);
}

// Host launchers for the kernels in compress.cuh. No torch headers: ops.cpp binds these to the
// TORCH_LIBRARY schema and passes torch's current stream. Never build this file with
// --use_fast_math: the kernels' rounding already avoids fast paths explicitly, but
// -ftz=true would flush denormal gradients that the CPU side keeps.
#include "compress.cuh"

namespace {

// Grid-stride kernels need only enough CTAs to fill the GPU: more just queue up, fewer leave
// SMs idle. 2048 resident threads per SM is the ceiling on sm_80/sm_90 (sm_75 holds 1024 and
// simply keeps the rest waiting).
int grid_size(long long ctas_wanted, int threads) {
  int device = 0, sms = 1;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    sms = 1;  // the launch itself will report what is wrong
  const long long cap = (long long)sms * (2048 / threads);
  return (int)(ctas_wanted < cap ? ctas_wanted : cap);
}

int elementwise_grid(long long n) {
  const long long groups = (n + TV_VEC - 1) / TV_VEC;
  return grid_size((groups + TV_THREADS - 1) / TV_THREADS, TV_THREADS);
}

}  // namespace

extern "C" {

cudaError_t tv_compress_ef_f16(const float* grad, float* residual, unsigned short* payload,
                               float weight, long long n, int* flag, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  tv_compress_ef_f16_kernel<<<elementwise_grid(n), TV_THREADS, 0, stream>>>(
      grad, residual, payload, weight, n, flag);
  return cudaGetLastError();
}

cudaError_t tv_compress_ef_bf16(const float* grad, float* residual, unsigned short* payload,
                                float weight, long long n, int* flag, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  tv_compress_ef_bf16_kernel<<<elementwise_grid(n), TV_THREADS, 0, stream>>>(
      grad, residual, payload, weight, n, flag);
  return cudaGetLastError();
}

cudaError_t tv_compress_ef_i8(const float* grad, float* residual, signed char* q, float* scales,
                              float weight, long long n, int block, int* flag,
                              cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (block < TV_BLOCK_MIN || block > TV_BLOCK_MAX) return cudaErrorInvalidValue;
  const int threads = tv::quant_threads(block);
  tv_compress_ef_i8_kernel<<<grid_size((n + block - 1) / block, threads), threads, 0, stream>>>(
      grad, residual, q, scales, weight, n, block, flag);
  return cudaGetLastError();
}

cudaError_t tv_decompress_avg_f16(const unsigned short* payload, float* out, float inv_n,
                                  long long n, int* flag, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  tv_decompress_avg_f16_kernel<<<elementwise_grid(n), TV_THREADS, 0, stream>>>(
      payload, out, inv_n, n, flag);
  return cudaGetLastError();
}

cudaError_t tv_decompress_avg_bf16(const unsigned short* payload, float* out, float inv_n,
                                   long long n, int* flag, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  tv_decompress_avg_bf16_kernel<<<elementwise_grid(n), TV_THREADS, 0, stream>>>(
      payload, out, inv_n, n, flag);
  return cudaGetLastError();
}

cudaError_t tv_decompress_avg_f32(const float* payload, float* out, float inv_n, long long n,
                                  int* flag, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  tv_decompress_avg_f32_kernel<<<elementwise_grid(n), TV_THREADS, 0, stream>>>(
      payload, out, inv_n, n, flag);
  return cudaGetLastError();
}

cudaError_t tv_decompress_avg_i8(const signed char* q, const float* scales, float* out,
                                 float inv_n, long long n, int block, int* flag,
                                 cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (block < TV_BLOCK_MIN || block > TV_BLOCK_MAX) return cudaErrorInvalidValue;
  const int threads = tv::quant_threads(block);
  tv_decompress_avg_i8_kernel<<<grid_size((n + block - 1) / block, threads), threads, 0,
                                stream>>>(q, scales, out, inv_n, n, block, flag);
  return cudaGetLastError();
}

// decompress_sum_: one thread per element, so the grid counts elements, not vector steps.
cudaError_t tv_decompress_sum_f16(const unsigned short* payloads, int k, long long m, float* out,
                                  float inv_n, int* flag, cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  if (k < 1) return cudaErrorInvalidValue;
  tv_decompress_sum_f16_kernel<<<grid_size((m + TV_THREADS - 1) / TV_THREADS, TV_THREADS),
                                 TV_THREADS, 0, stream>>>(payloads, k, m, out, inv_n, flag);
  return cudaGetLastError();
}

cudaError_t tv_decompress_sum_bf16(const unsigned short* payloads, int k, long long m, float* out,
                                   float inv_n, int* flag, cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  if (k < 1) return cudaErrorInvalidValue;
  tv_decompress_sum_bf16_kernel<<<grid_size((m + TV_THREADS - 1) / TV_THREADS, TV_THREADS),
                                  TV_THREADS, 0, stream>>>(payloads, k, m, out, inv_n, flag);
  return cudaGetLastError();
}

cudaError_t tv_decompress_sum_i8(const signed char* q, const float* scales, int k, long long m,
                                 float* out, float inv_n, int block, int* flag,
                                 cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  if (block < TV_BLOCK_MIN || block > TV_BLOCK_MAX || k < 1) return cudaErrorInvalidValue;
  tv_decompress_sum_i8_kernel<<<grid_size((m + TV_THREADS - 1) / TV_THREADS, TV_THREADS),
                                TV_THREADS, 0, stream>>>(q, scales, k, m, out, inv_n, block, flag);
  return cudaGetLastError();
}

// reduce_compress_ef_: 16-bit one thread per element, as decompress_sum_; int8 one CTA per block,
// as compress_ef_.
cudaError_t tv_reduce_compress_ef_f16(const unsigned short* payloads, int k, long long m,
                                      float* residual, unsigned short* out, float weight, int* flag,
                                      cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  if (k < 1) return cudaErrorInvalidValue;
  tv_reduce_compress_ef_f16_kernel<<<grid_size((m + TV_THREADS - 1) / TV_THREADS, TV_THREADS),
                                     TV_THREADS, 0, stream>>>(payloads, k, m, residual, out, weight,
                                                              flag);
  return cudaGetLastError();
}

cudaError_t tv_reduce_compress_ef_bf16(const unsigned short* payloads, int k, long long m,
                                       float* residual, unsigned short* out, float weight,
                                       int* flag, cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  if (k < 1) return cudaErrorInvalidValue;
  tv_reduce_compress_ef_bf16_kernel<<<grid_size((m + TV_THREADS - 1) / TV_THREADS, TV_THREADS),
                                      TV_THREADS, 0, stream>>>(payloads, k, m, residual, out, weight,
                                                               flag);
  return cudaGetLastError();
}

cudaError_t tv_reduce_compress_ef_i8(const signed char* q, const float* in_scales, int k,
                                     long long m, float* residual, signed char* out,
                                     float* out_scales, float weight, int block, int* flag,
                                     cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  if (block < TV_BLOCK_MIN || block > TV_BLOCK_MAX || k < 1) return cudaErrorInvalidValue;
  const int threads = tv::quant_threads(block);
  tv_reduce_compress_ef_i8_kernel<<<grid_size((m + block - 1) / block, threads), threads, 0,
                                    stream>>>(q, in_scales, k, m, residual, out, out_scales, weight,
                                              block, flag);
  return cudaGetLastError();
}

}  // extern "C"

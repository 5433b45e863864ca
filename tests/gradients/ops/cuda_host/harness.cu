// The element functions of csrc/cuda/compress.cuh, run on the host: the ops of the kernels in
// plain loops, one element at a time, for tests/test_cuda_host_arith.py (ctypes) to compare
// with the torch reference bit for bit.
//
// It lives under tests/, not csrc/cuda/, because it is test code: csrc/check_compile.sh builds
// every csrc/cuda/*.cu for each architecture and counts their kernels, and the extension ships
// that directory. Build (the test does this):
//   nvcc -std=c++17 -O2 -shared -Xcompiler -fPIC,-ffp-contract=off --cudart none
//        -I csrc/cuda tests/cuda_host/harness.cu -o harness.so
// -ffp-contract=off keeps each host mul_rn / add_rn its own rounding (see compress.cuh).
//
// What the loops below are not: the kernels' memory traffic (vector loads, grid-stride
// indexing, padding of a short block) and their CTA-wide steps (the warp-shuffle block max,
// the flag's warp vote). The block max here is a sequential amax_step, which gives the same value
// in any order; the flag is an OR over the elements.
#include "compress.cuh"

namespace {

enum Codec { FP16 = 0, BF16 = 1 };

template <class C>
int compress_ef_16bit(const float* grad, float* residual, unsigned short* payload, float weight,
                      long long n) {
  bool bad = false;
  for (long long i = 0; i < n; ++i)
    residual[i] = tv::compress_one<C>(grad[i], weight, residual[i], payload[i], bad);
  return bad;
}

template <class C>
int decompress_avg_16bit(const unsigned short* payload, float* out, float inv_n, long long n) {
  bool bad = false;
  for (long long i = 0; i < n; ++i) {
    out[i] = tv::average_one(C::decode(payload[i]), inv_n);
    bad |= !tv::is_finite(out[i]);
  }
  return bad;
}

// The int8 rule on one block of finite values: its scale, and each value's code.
float quantize_block(const float* x, float* codes, long long len) {
  float amax = 0.0f;
  for (long long i = 0; i < len; ++i) amax = tv::amax_step(amax, x[i]);
  const float scale = tv::int8_scale(amax);
  for (long long i = 0; i < len; ++i) codes[i] = tv::quantize_one(x[i], scale);
  return scale;
}

}  // namespace

extern "C" {

int host_compress_ef_16bit(int codec, const float* grad, float* residual,
                           unsigned short* payload, float weight, long long n) {
  return codec == FP16 ? compress_ef_16bit<tv::Half>(grad, residual, payload, weight, n)
                       : compress_ef_16bit<tv::BFloat16>(grad, residual, payload, weight, n);
}

int host_decompress_avg_16bit(int codec, const unsigned short* payload, float* out, float inv_n,
                              long long n) {
  return codec == FP16 ? decompress_avg_16bit<tv::Half>(payload, out, inv_n, n)
                       : decompress_avg_16bit<tv::BFloat16>(payload, out, inv_n, n);
}

int host_decompress_avg_fp32(const float* payload, float* out, float inv_n, long long n) {
  bool bad = false;
  for (long long i = 0; i < n; ++i) {
    out[i] = tv::average_one(payload[i], inv_n);
    bad |= !tv::is_finite(out[i]);
  }
  return bad;
}

int host_compress_ef_i8(const float* grad, float* residual, signed char* q, float* scales,
                        float weight, long long n, int block) {
  bool bad = false;
  float x[TV_BLOCK_MAX], codes[TV_BLOCK_MAX];
  for (long long start = 0, b = 0; start < n; start += block, ++b) {
    const long long len = n - start < block ? n - start : block;
    for (long long i = 0; i < len; ++i) {
      const float v = tv::error_feedback(grad[start + i], weight, residual[start + i]);
      bad |= !tv::is_finite(v);
      x[i] = tv::finite_or_zero(v);
    }
    const float scale = quantize_block(x, codes, len);
    scales[b] = scale;
    for (long long i = 0; i < len; ++i) {
      residual[start + i] = tv::int8_residual(x[i], codes[i], scale);
      q[start + i] = (signed char)(int)codes[i];
    }
  }
  return bad;
}

int host_decompress_avg_i8(const signed char* q, const float* scales, float* out, float inv_n,
                           long long n, int block) {
  bool bad = false;
  for (long long i = 0; i < n; ++i) {
    out[i] = tv::average_one(tv::dequantize_one((float)q[i], scales[i / block]), inv_n);
    bad |= !tv::is_finite(out[i]);
  }
  return bad;
}

// decompress_sum_ through the kernels' own element function (sum_one and the row decoders):
// payloads [k, m] (int8: scales [k, ceil(m / block)]), row-major.
int host_decompress_sum_16bit(int codec, const unsigned short* payloads, int k, long long m,
                              float* out, float inv_n) {
  bool bad = false;
  for (long long i = 0; i < m; ++i) {
    out[i] = codec == FP16 ? tv::sum_one(tv::Rows16bit<tv::Half>{payloads, m}, k, i, inv_n)
                           : tv::sum_one(tv::Rows16bit<tv::BFloat16>{payloads, m}, k, i, inv_n);
    bad |= !tv::is_finite(out[i]);
  }
  return bad;
}

int host_decompress_sum_i8(const signed char* q, const float* scales, int k, long long m,
                           float* out, float inv_n, int block) {
  const tv::RowsInt8 rows{q, scales, m, (m + block - 1) / block, block};
  bool bad = false;
  for (long long i = 0; i < m; ++i) {
    out[i] = tv::sum_one(rows, k, i, inv_n);
    bad |= !tv::is_finite(out[i]);
  }
  return bad;
}

// reduce_compress_ef_, 16-bit: the kernels' own element function (reduce_compress_one).
int host_reduce_compress_ef_16bit(int codec, const unsigned short* payloads, int k, long long m,
                                  float* residual, unsigned short* out, float weight) {
  bool bad = false;
  for (long long i = 0; i < m; ++i)
    residual[i] = codec == FP16
        ? tv::reduce_compress_one<tv::Half>(tv::Rows16bit<tv::Half>{payloads, m}, k, i, weight,
                                            residual[i], out[i], bad)
        : tv::reduce_compress_one<tv::BFloat16>(tv::Rows16bit<tv::BFloat16>{payloads, m}, k, i,
                                                weight, residual[i], out[i], bad);
  return bad;
}

// reduce_compress_ef_, int8: the sum the kernel's sum_copies makes (decompress_sum_'s, inv_n = 1:
// the same add_rn / dequantize_one / average_one steps), then compress_ef_'s block rule on it.
int host_reduce_compress_ef_i8(const signed char* q, const float* in_scales, int k, long long m,
                               float* residual, signed char* out, float* out_scales, float weight,
                               int block) {
  float* total = new float[m > 0 ? m : 1];
  host_decompress_sum_i8(q, in_scales, k, m, total, 1.0f, block);
  const int bad = host_compress_ef_i8(total, residual, out, out_scales, weight, m, block);
  delete[] total;
  return bad;
}

}  // extern "C"

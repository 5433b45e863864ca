// Fused gradient-compression kernels: error feedback + quantization, dequantization + averaging,
// the shard owner's decode-and-sum of k ranks' copies, and that sum re-encoded with error
// feedback in the same pass (reduce_compress_ef_). No torch headers on purpose: nvcc
// compiles this text into the extension (through compress.cu), and NVRTC (cupy) compiles the very
// same text at run time when the extension was not built. The op semantics are the CPU side's
// (transientvod/gradients/ops/reference.py, and cpu_kernels.py's numba kernels); every rounding step below is
// spelled out so that the results agree with them bit for bit:
//   * tv::mul_rn / add_rn / sub_rn / div_rn, max_f / min_f / abs_f: on the device inline PTX
//     (mul.rn.f32 etc.), each step rounded on its own, never contracted into an FMA, never
//     approximated and never flushing subnormals to zero, whatever flags the build passes.
//     That matters: cupy appends -ftz=true to every NVRTC compile, and under it the intrinsics
//     (__fmul_rn, fmaxf, ...) flush; csrc/check_compile.sh fails on any .ftz in the PTX.
//   * float -> half / bfloat16 rounds to nearest even, like torch's conversions (only a NaN's
//     bit pattern may differ from the CPU's: NaN either way).
//   * int8: per block of `block` elements, scale = amax / 127 over the finite values,
//     q = rint(x / scale) (half to even, like torch.round) clamped to [-127, 127];
//     an all-zero block has scale 0 and q 0, never NaN.
//   * non-finite values raise the flag (`nonfinite`):
//       16-bit payloads: a payload that came out Inf/NaN (x was, or x overflowed the format)
//       keeps it, and its residual is 0;
//       int8: x counts as 0 (code 0, residual 0, left out of its block's amax: one NaN must
//       not wipe out the whole block);
//       decompression and the sum of copies: any non-finite output.
//
// Layout of this file:
//   1. the element functions (__host__ __device__): the arithmetic of one element, with the few
//      device intrinsics behind wrappers that have a host branch; tests/cuda_host/harness.cu
//      compiles them for the host and tests/test_cuda_host_arith.py checks them against the
//      torch reference on every 16-bit pattern, every rounding midpoint and random inputs;
//   2. device code (kernels), compiled by nvcc and NVRTC (both define __CUDACC__);
//   3. the launchers' declarations (host), seen by nvcc and by the host compiler of ops.cpp,
//      hidden from NVRTC (__CUDACC_RTC__), which has no host side.
#pragma once

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#endif

// Constants shared by the kernels, the launchers (compress.cu) and transientvod/gradients/ops/cuda.py
// (tests/test_cuda_sources.py checks that the Python copies match):
#define TV_THREADS 256        // CTA size of the elementwise kernels; every __launch_bounds__
#define TV_VEC 8              // elements per 16-byte payload access (8 x 16-bit) in elementwise kernels
#define TV_QUANT_ITEMS 4      // elements of an int8 block one thread holds in registers
#define TV_BLOCK_MIN 256      // int8 block sizes the kernels accept (the op contract)
#define TV_BLOCK_MAX 1024     // = TV_QUANT_ITEMS * TV_THREADS: a block fits one CTA's registers

#if defined(__CUDACC__)

namespace tv {

// Threads per CTA for an int8 block: enough for TV_QUANT_ITEMS elements each, in whole warps
// (the reductions and the flag vote use full-warp shuffles). ops/cuda.py mirrors this formula.
__host__ __device__ inline int quant_threads(int block) {
  const int threads = ((block + TV_QUANT_ITEMS - 1) / TV_QUANT_ITEMS + 31) / 32 * 32;
  return threads < TV_THREADS ? threads : TV_THREADS;
}

// ---------------------------------------------------------------------------------------------
// 1. Element functions. Everything the kernels compute on one element lives here, so that the
// host harness runs the same text. What the host build does NOT run: the device's own
// instructions behind the wrappers below, and everything CTA-wide (vector loads, warp votes,
// the block max). On the host, each wrapper is the plain IEEE float32 operation (SSE on x86-64:
// no excess precision, subnormals kept), which rounds to nearest even like the __f*_rn
// intrinsics; a host caller must compile with -ffp-contract=off (gcc would otherwise fuse
// mul_rn + add_rn into an FMA where the CPU has one) and without -ffast-math. rintf needs no
// wrapper: CUDA's math headers declare it __host__ __device__ (NVRTC has it built in), a
// subnormal rounds to 0 with or without flushing, and on the host it rounds half to even in the
// default rounding mode.

#define TV_HD __host__ __device__ __forceinline__

#if defined(__CUDA_ARCH__)
// PTX without .ftz: subnormal inputs and results are kept (IEEE), even under -ftz=true. max.f32
// and min.f32 without .NaN return the other operand for one NaN, like fmaxf / fminf.
TV_HD float mul_rn(float a, float b) { float r; asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }
TV_HD float add_rn(float a, float b) { float r; asm("add.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }
TV_HD float sub_rn(float a, float b) { float r; asm("sub.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }
TV_HD float div_rn(float a, float b) { float r; asm("div.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }
TV_HD float max_f(float a, float b) { float r; asm("max.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }
TV_HD float min_f(float a, float b) { float r; asm("min.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }
TV_HD float abs_f(float a) { float r; asm("abs.f32 %0, %1;" : "=f"(r) : "f"(a)); return r; }
// An int8 code (a float holding an integer) as an int: truncation, exact for integers.
TV_HD int code_to_int(float c) { int r; asm("cvt.rzi.s32.f32 %0, %1;" : "=r"(r) : "f"(c)); return r; }
TV_HD unsigned float_bits(float v) { return __float_as_uint(v); }
#else
TV_HD float mul_rn(float a, float b) { return a * b; }
TV_HD float add_rn(float a, float b) { return a + b; }
TV_HD float sub_rn(float a, float b) { return a - b; }
TV_HD float div_rn(float a, float b) { return a / b; }
TV_HD float max_f(float a, float b) { return fmaxf(a, b); }
TV_HD float min_f(float a, float b) { return fminf(a, b); }
TV_HD float abs_f(float a) { return fabsf(a); }
TV_HD int code_to_int(float c) { return (int)c; }
// __builtin_memcpy, not <cstring>: the header includes nothing NVRTC lacks, even on this side.
TV_HD unsigned float_bits(float v) {
  unsigned u;
  __builtin_memcpy(&u, &v, sizeof u);
  return u;
}
#endif

// Inf or NaN: exponent all ones. A bit test needs no <cmath> under NVRTC.
TV_HD bool is_finite(float v) { return (float_bits(v) & 0x7f800000u) != 0x7f800000u; }

// x = grad * weight + residual, two roundings like the CPU's separate multiply and add.
TV_HD float error_feedback(float g, float w, float r) { return add_rn(mul_rn(g, w), r); }

// A decoded value times 1/N: the averaging step of every decompression.
TV_HD float average_one(float v, float inv_n) { return mul_rn(v, inv_n); }

// 16-bit payloads travel as raw bits (unsigned short) so that the launchers' signatures need
// no half types; the codecs say how the bits round-trip. cuda_fp16.h / cuda_bf16.h declare
// these conversions __host__ __device__: on the host they are the toolkit's software
// round-to-nearest-even, on the device its conversion instructions.
struct Half {
  static TV_HD unsigned short encode(float x) { return __half_as_ushort(__float2half_rn(x)); }
  static TV_HD float decode(unsigned short p) { return __half2float(__ushort_as_half(p)); }
};

struct BFloat16 {
  static TV_HD unsigned short encode(float x) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  }
  static TV_HD float decode(unsigned short p) {
    return __bfloat162float(__ushort_as_bfloat16(p));
  }
};

// Error feedback into a 16-bit payload: returns the new residual, p gets the payload.
template <class Codec>
TV_HD float compress_one(float g, float w, float r, unsigned short& p, bool& bad) {
  const float x = error_feedback(g, w, r);
  p = Codec::encode(x);  // Inf/NaN stay in the payload, as with torch's .to()
  const float sent = Codec::decode(p);
  if (!is_finite(sent)) {  // also a finite x past the format's range: its error is no residual
    bad = true;
    return 0.0f;
  }
  return sub_rn(x, sent);
}

// int8: a non-finite x counts as 0 (code 0, residual 0, left out of its block's amax); the
// caller raises the flag.
TV_HD float finite_or_zero(float x) { return is_finite(x) ? x : 0.0f; }

// One step of a block's amax over its (finite) values.
TV_HD float amax_step(float amax, float x) { return max_f(amax, abs_f(x)); }

// The block's scale from its amax (over finite values): exactly 0 for an all-zero block.
TV_HD float int8_scale(float amax) { return div_rn(amax, 127.0f); }

// x's code, as a float holding an integer in [-127, 127]: a true division (never a multiply by
// the reciprocal), rounded half to even like torch.round; a zero scale gives 0, never NaN.
// Zero is tested on the bits: under -ftz=true a subnormal scale would compare equal to 0.
TV_HD float quantize_one(float x, float scale) {
  if ((float_bits(scale) & 0x7fffffffu) == 0u) return 0.0f;
  return min_f(max_f(rintf(div_rn(x, scale)), -127.0f), 127.0f);
}

// What a code stands for, and what quantizing x left behind.
TV_HD float dequantize_one(float code, float scale) { return mul_rn(code, scale); }
TV_HD float int8_residual(float x, float code, float scale) {
  return sub_rn(x, dequantize_one(code, scale));
}

// decompress_sum_: element i of k ranks' copies (rows of m), each decoded as decompress_avg_
// decodes it with inv_n = 1, summed in row order from 0.0f (not from row 0: 0 + -0 is +0, as
// in the composition zeros + copy_0 + copy_1 ... that the op replaces), one rounding per row,
// then times inv_n. The rows are read through a small decoder object (no lambdas: those would
// need nvcc's --extended-lambda, and NVRTC compiles this text too).
template <class Codec>
struct Rows16bit {  // fp16 / bf16 bits, [k, m] row-major
  const unsigned short* payloads;
  long long m;
  TV_HD float operator()(int row, long long i) const {
    return Codec::decode(payloads[row * m + i]);
  }
};

// The element decode of an int8 copy: its code times its row's scale of this block.
TV_HD float decode_int8(signed char q, float scale) { return dequantize_one((float)q, scale); }

struct RowsInt8 {  // codes [k, m] and scales [k, blocks], row-major
  const signed char* q;
  const float* scales;
  long long m, blocks;
  int block;
  TV_HD float operator()(int row, long long i) const {
    return decode_int8(q[row * m + i], scales[row * blocks + i / block]);
  }
};

template <class Rows>
TV_HD float sum_one(const Rows& rows, int k, long long i, float inv_n) {
  float total = 0.0f;
  for (int row = 0; row < k; ++row) total = add_rn(total, rows(row, i));
  return average_one(total, inv_n);
}

// reduce_compress_ef_ (fp16 / bf16): element i of the k copies summed as decompress_sum_ sums
// them with inv_n = 1, then compress_ef_ with that sum as its grad; returns the new residual.
// A non-finite sum makes x, so the payload, non-finite: compress_one raises `bad` for it.
template <class Codec, class Rows>
TV_HD float reduce_compress_one(const Rows& rows, int k, long long i, float w, float r,
                                unsigned short& p, bool& bad) {
  return compress_one<Codec>(sum_one(rows, k, i, 1.0f), w, r, p, bad);
}

// ---------------------------------------------------------------------------------------------
// 2. Device code.

template <int BYTES>
__device__ __forceinline__ bool aligned(const void* p) {
  return (reinterpret_cast<unsigned long long>(p) & (BYTES - 1)) == 0;
}

// One warp vote and one atomic per warp, and only when something was non-finite: the common
// case costs no memory traffic. Every thread of the CTA must call it (full-warp vote).
__device__ __forceinline__ void report_nonfinite(bool bad, int* flag) {
  if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) atomicOr(flag, 1);
}

// ---------------------------------------------------------------------------------------------
// 16-bit payloads: elementwise, grid-stride. When all pointers are 16-byte aligned a thread
// moves TV_VEC elements per step (two float4 of fp32, one uint4 of payload); the last
// n % TV_VEC elements (or everything, when unaligned) go one at a time.

template <class Codec>
__device__ __forceinline__ void compress_ef_16bit(const float* __restrict__ grad,
                                                  float* __restrict__ residual,
                                                  unsigned short* __restrict__ payload,
                                                  float weight, long long n, int* flag) {
  const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long stride = (long long)gridDim.x * blockDim.x;
  bool bad = false;
  long long vectorized = 0;
  if (aligned<16>(grad) && aligned<16>(residual) && aligned<16>(payload)) {
    const long long groups = n / TV_VEC;
    const float4* g4 = reinterpret_cast<const float4*>(grad);
    float4* r4 = reinterpret_cast<float4*>(residual);
    uint4* p4 = reinterpret_cast<uint4*>(payload);
    for (long long i = first; i < groups; i += stride) {
      const float4 ga = g4[2 * i], gb = g4[2 * i + 1];
      const float4 ra = r4[2 * i], rb = r4[2 * i + 1];
      const float g[TV_VEC] = {ga.x, ga.y, ga.z, ga.w, gb.x, gb.y, gb.z, gb.w};
      float r[TV_VEC] = {ra.x, ra.y, ra.z, ra.w, rb.x, rb.y, rb.z, rb.w};
      unsigned short p[TV_VEC];
#pragma unroll
      for (int k = 0; k < TV_VEC; ++k) r[k] = compress_one<Codec>(g[k], weight, r[k], p[k], bad);
      // little endian: element 0 in the low half of the first word
      p4[i] = make_uint4(p[0] | (unsigned)p[1] << 16, p[2] | (unsigned)p[3] << 16,
                         p[4] | (unsigned)p[5] << 16, p[6] | (unsigned)p[7] << 16);
      r4[2 * i] = make_float4(r[0], r[1], r[2], r[3]);
      r4[2 * i + 1] = make_float4(r[4], r[5], r[6], r[7]);
    }
    vectorized = groups * TV_VEC;
  }
  for (long long i = vectorized + first; i < n; i += stride) {
    unsigned short p;
    residual[i] = compress_one<Codec>(grad[i], weight, residual[i], p, bad);
    payload[i] = p;
  }
  report_nonfinite(bad, flag);
}

template <class Codec>
__device__ __forceinline__ void decompress_avg_16bit(const unsigned short* __restrict__ payload,
                                                     float* __restrict__ out, float inv_n,
                                                     long long n, int* flag) {
  const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long stride = (long long)gridDim.x * blockDim.x;
  bool bad = false;
  long long vectorized = 0;
  if (aligned<16>(payload) && aligned<16>(out)) {
    const long long groups = n / TV_VEC;
    const uint4* p4 = reinterpret_cast<const uint4*>(payload);
    float4* o4 = reinterpret_cast<float4*>(out);
    for (long long i = first; i < groups; i += stride) {
      const uint4 w = p4[i];
      const unsigned words[4] = {w.x, w.y, w.z, w.w};
      float o[TV_VEC];
#pragma unroll
      for (int k = 0; k < TV_VEC; ++k) {
        const unsigned short p = (unsigned short)(words[k / 2] >> (16 * (k % 2)));
        o[k] = average_one(Codec::decode(p), inv_n);
        bad |= !is_finite(o[k]);
      }
      o4[2 * i] = make_float4(o[0], o[1], o[2], o[3]);
      o4[2 * i + 1] = make_float4(o[4], o[5], o[6], o[7]);
    }
    vectorized = groups * TV_VEC;
  }
  for (long long i = vectorized + first; i < n; i += stride) {
    const float o = average_one(Codec::decode(payload[i]), inv_n);
    bad |= !is_finite(o);
    out[i] = o;
  }
  report_nonfinite(bad, flag);
}

// An fp32 payload (no compression): four elements per float4.
__device__ __forceinline__ void decompress_avg_fp32(const float* __restrict__ payload,
                                                    float* __restrict__ out, float inv_n,
                                                    long long n, int* flag) {
  const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long stride = (long long)gridDim.x * blockDim.x;
  bool bad = false;
  long long vectorized = 0;
  if (aligned<16>(payload) && aligned<16>(out)) {
    const long long groups = n / 4;
    const float4* p4 = reinterpret_cast<const float4*>(payload);
    float4* o4 = reinterpret_cast<float4*>(out);
    for (long long i = first; i < groups; i += stride) {
      const float4 p = p4[i];
      const float4 o = make_float4(average_one(p.x, inv_n), average_one(p.y, inv_n),
                                   average_one(p.z, inv_n), average_one(p.w, inv_n));
      bad |= !(is_finite(o.x) && is_finite(o.y) && is_finite(o.z) && is_finite(o.w));
      o4[i] = o;
    }
    vectorized = groups * 4;
  }
  for (long long i = vectorized + first; i < n; i += stride) {
    const float o = average_one(payload[i], inv_n);
    bad |= !is_finite(o);
    out[i] = o;
  }
  report_nonfinite(bad, flag);
}

// decompress_sum_: one thread per element (grid-stride), looping over the k rows in order. At
// each row step a warp reads 32 neighbouring elements of one row (coalesced). The sum stays in a
// register, so out is written once, where the decompress_avg_ + add composition writes a copy
// and reads and writes the total once per row.
template <class Rows>
__device__ __forceinline__ void decompress_sum(const Rows& rows, int k, float* __restrict__ out,
                                               float inv_n, long long m, int* flag) {
  const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long stride = (long long)gridDim.x * blockDim.x;
  bool bad = false;
  for (long long i = first; i < m; i += stride) {
    const float o = sum_one(rows, k, i, inv_n);
    bad |= !is_finite(o);
    out[i] = o;
  }
  report_nonfinite(bad, flag);
}

// reduce_compress_ef_ with 16-bit payloads: as decompress_sum, one thread per element; the
// residual is read and written once, the payload written once, and no sum goes to memory.
template <class Codec>
__device__ __forceinline__ void reduce_compress_ef_16bit(const unsigned short* __restrict__ payloads,
                                                         int k, long long m,
                                                         float* __restrict__ residual,
                                                         unsigned short* __restrict__ out,
                                                         float weight, int* flag) {
  const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long stride = (long long)gridDim.x * blockDim.x;
  const Rows16bit<Codec> rows{payloads, m};
  bool bad = false;
  for (long long i = first; i < m; i += stride) {
    unsigned short p;
    residual[i] = reduce_compress_one<Codec>(rows, k, i, weight, residual[i], p, bad);
    out[i] = p;
  }
  report_nonfinite(bad, flag);
}

// ---------------------------------------------------------------------------------------------
// int8 payloads: one CTA per quantization block (grid-stride over blocks). A thread holds up to
// TV_QUANT_ITEMS elements of its block in registers, so the block is read once, reduced to its
// amax, and quantized without a second trip to memory.
//
// Which elements a thread holds: with vector access (block % 4 == 0 and aligned pointers) four
// consecutive ones, so one float4 / one 32-bit word of int8 per array; otherwise elements
// strided by blockDim, so that neighbouring threads still touch neighbouring addresses.

__device__ __forceinline__ int item_index(bool vec, int k) {
  return vec ? TV_QUANT_ITEMS * threadIdx.x + k : k * blockDim.x + threadIdx.x;
}

// True when this thread's four elements are all inside the block and can move as one vector.
__device__ __forceinline__ bool whole_vector(bool vec, int len) {
  return vec && TV_QUANT_ITEMS * (int)threadIdx.x + TV_QUANT_ITEMS <= len;
}

// Elements past the end of the block (the bucket's last, short block) read as 0, which leaves
// the block's amax unchanged.
__device__ __forceinline__ void load_items(const float* __restrict__ p, bool vec, int len,
                                           float v[TV_QUANT_ITEMS]) {
  if (whole_vector(vec, len)) {
    const float4 t = reinterpret_cast<const float4*>(p)[threadIdx.x];
    v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
    return;
  }
#pragma unroll
  for (int k = 0; k < TV_QUANT_ITEMS; ++k) {
    const int i = item_index(vec, k);
    v[k] = i < len ? p[i] : 0.0f;
  }
}

__device__ __forceinline__ void store_items(float* __restrict__ p, bool vec, int len,
                                            const float v[TV_QUANT_ITEMS]) {
  if (whole_vector(vec, len)) {
    reinterpret_cast<float4*>(p)[threadIdx.x] = make_float4(v[0], v[1], v[2], v[3]);
    return;
  }
#pragma unroll
  for (int k = 0; k < TV_QUANT_ITEMS; ++k) {
    const int i = item_index(vec, k);
    if (i < len) p[i] = v[k];
  }
}

__device__ __forceinline__ void load_codes(const signed char* __restrict__ q, bool vec, int len,
                                           float v[TV_QUANT_ITEMS]) {
  if (whole_vector(vec, len)) {
    const unsigned w = reinterpret_cast<const unsigned*>(q)[threadIdx.x];
#pragma unroll
    for (int k = 0; k < TV_QUANT_ITEMS; ++k) v[k] = (float)(signed char)(w >> (8 * k));
    return;
  }
#pragma unroll
  for (int k = 0; k < TV_QUANT_ITEMS; ++k) {
    const int i = item_index(vec, k);
    v[k] = i < len ? (float)q[i] : 0.0f;
  }
}

// The codes arrive as floats holding integers in [-127, 127]: exact in the conversion.
__device__ __forceinline__ void store_codes(signed char* __restrict__ q, bool vec, int len,
                                            const float v[TV_QUANT_ITEMS]) {
  if (whole_vector(vec, len)) {
    unsigned w = 0;
#pragma unroll
    for (int k = 0; k < TV_QUANT_ITEMS; ++k) w |= ((unsigned)code_to_int(v[k]) & 0xffu) << (8 * k);
    reinterpret_cast<unsigned*>(q)[threadIdx.x] = w;
    return;
  }
#pragma unroll
  for (int k = 0; k < TV_QUANT_ITEMS; ++k) {
    const int i = item_index(vec, k);
    if (i < len) q[i] = (signed char)code_to_int(v[k]);
  }
}

// Max over the CTA: shuffles within each warp, then every thread reads the few warp results
// from shared memory (saves a second barrier-and-broadcast round). The trailing barrier lets the
// next block of the grid-stride loop reuse `warp_max`. max is exact, so the order is free.
__device__ __forceinline__ float block_max(float v, float* warp_max) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v = max_f(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = v;
  __syncthreads();
  v = 0.0f;
  for (int w = 0; w < (int)(blockDim.x >> 5); ++w) v = max_f(v, warp_max[w]);
  __syncthreads();
  return v;
}

// reduce_compress_ef_: this thread's elements of one block, summed over the k copies (codes
// q + row * m, the row's scale at scales[row * blocks]) as decompress_sum_ sums them with
// inv_n = 1: from 0.0f, in row order, one rounding per row. Items past the block's end sum
// codes of 0 (and are never stored or flagged by the caller).
__device__ __forceinline__ void sum_copies(const signed char* __restrict__ q,
                                           const float* __restrict__ scales, int k, long long m,
                                           long long blocks, bool vec, int len,
                                           float total[TV_QUANT_ITEMS]) {
#pragma unroll
  for (int j = 0; j < TV_QUANT_ITEMS; ++j) total[j] = 0.0f;
  for (int row = 0; row < k; ++row) {
    float codes[TV_QUANT_ITEMS];
    load_codes(q + row * m, vec, len, codes);
    const float scale = scales[row * blocks];
#pragma unroll
    for (int j = 0; j < TV_QUANT_ITEMS; ++j) total[j] = add_rn(total[j], dequantize_one(codes[j], scale));
  }
#pragma unroll
  for (int j = 0; j < TV_QUANT_ITEMS; ++j) total[j] = average_one(total[j], 1.0f);
}

// The int8 rule on one block held in registers; x[] is finite (non-finite values were replaced
// by 0 and flagged by the caller). Returns the block's scale; q[] gets the codes as floats.
__device__ __forceinline__ float quantize_block(const float x[TV_QUANT_ITEMS],
                                                float q[TV_QUANT_ITEMS], float* warp_max) {
  float amax = 0.0f;
#pragma unroll
  for (int k = 0; k < TV_QUANT_ITEMS; ++k) amax = amax_step(amax, x[k]);
  amax = block_max(amax, warp_max);
  const float scale = int8_scale(amax);
#pragma unroll
  for (int k = 0; k < TV_QUANT_ITEMS; ++k) q[k] = quantize_one(x[k], scale);
  return scale;
}

// compress_ef_'s int8 rule on one block whose x[] (the grad: compress_ef_'s, or the owner's sum
// of the copies) and r[] (the residual) this thread has loaded: error feedback, the block's
// scale (to *scale), codes and new residual stored from the block's start. Returns whether one
// of this thread's real elements (not padding: 0 * an Inf weight is no finding) was not finite;
// there x becomes 0, so its code and residual are 0.
__device__ __forceinline__ bool compress_block(float x[TV_QUANT_ITEMS], float r[TV_QUANT_ITEMS],
                                               float weight, bool vec, int len, float* warp_max,
                                               float* __restrict__ residual,
                                               signed char* __restrict__ q,
                                               float* __restrict__ scale) {
  bool bad = false;
  float codes[TV_QUANT_ITEMS];
#pragma unroll
  for (int k = 0; k < TV_QUANT_ITEMS; ++k) {
    x[k] = error_feedback(x[k], weight, r[k]);
    bad |= !is_finite(x[k]) && item_index(vec, k) < len;
    x[k] = finite_or_zero(x[k]);
  }
  const float s = quantize_block(x, codes, warp_max);
  if (threadIdx.x == 0) *scale = s;
#pragma unroll
  for (int k = 0; k < TV_QUANT_ITEMS; ++k) r[k] = int8_residual(x[k], codes[k], s);
  store_items(residual, vec, len, r);
  store_codes(q, vec, len, codes);
  return bad;
}

}  // namespace tv

// ---------------------------------------------------------------------------------------------
// Kernel entry points: C names, so that cupy's get_function finds them without name mangling.

extern "C" __global__ void __launch_bounds__(TV_THREADS)
tv_compress_ef_f16_kernel(const float* __restrict__ grad, float* __restrict__ residual,
                          unsigned short* __restrict__ payload, float weight, long long n,
                          int* flag) {
  tv::compress_ef_16bit<tv::Half>(grad, residual, payload, weight, n, flag);
}

extern "C" __global__ void __launch_bounds__(TV_THREADS)
tv_compress_ef_bf16_kernel(const float* __restrict__ grad, float* __restrict__ residual,
                           unsigned short* __restrict__ payload, float weight, long long n,
                           int* flag) {
  tv::compress_ef_16bit<tv::BFloat16>(grad, residual, payload, weight, n, flag);
}

extern "C" __global__ void __launch_bounds__(TV_THREADS)
tv_decompress_avg_f16_kernel(const unsigned short* __restrict__ payload, float* __restrict__ out,
                             float inv_n, long long n, int* flag) {
  tv::decompress_avg_16bit<tv::Half>(payload, out, inv_n, n, flag);
}

extern "C" __global__ void __launch_bounds__(TV_THREADS)
tv_decompress_avg_bf16_kernel(const unsigned short* __restrict__ payload,
                              float* __restrict__ out, float inv_n, long long n, int* flag) {
  tv::decompress_avg_16bit<tv::BFloat16>(payload, out, inv_n, n, flag);
}

extern "C" __global__ void __launch_bounds__(TV_THREADS)
tv_decompress_avg_f32_kernel(const float* __restrict__ payload, float* __restrict__ out,
                             float inv_n, long long n, int* flag) {
  tv::decompress_avg_fp32(payload, out, inv_n, n, flag);
}

// blockDim.x must be tv::quant_threads(block); block in [TV_BLOCK_MIN, TV_BLOCK_MAX];
// scales has ceil(n / block) entries.
extern "C" __global__ void __launch_bounds__(TV_THREADS)
tv_compress_ef_i8_kernel(const float* __restrict__ grad, float* __restrict__ residual,
                         signed char* __restrict__ q, float* __restrict__ scales, float weight,
                         long long n, int block, int* flag) {
  __shared__ float warp_max[TV_THREADS / 32];
  // block % 4 == 0 keeps every block's start as aligned as the bucket's start.
  const bool vec = block % TV_QUANT_ITEMS == 0 && tv::aligned<16>(grad) &&
                   tv::aligned<16>(residual) && tv::aligned<4>(q);
  const long long blocks = (n + block - 1) / block;
  bool bad = false;
  for (long long b = blockIdx.x; b < blocks; b += gridDim.x) {
    const long long start = b * block;
    const int len = n - start < block ? (int)(n - start) : block;
    float x[TV_QUANT_ITEMS], r[TV_QUANT_ITEMS];
    tv::load_items(grad + start, vec, len, x);
    tv::load_items(residual + start, vec, len, r);
    bad |= tv::compress_block(x, r, weight, vec, len, warp_max, residual + start, q + start,
                              scales + b);
  }
  tv::report_nonfinite(bad, flag);
}

// Same launch contract as tv_compress_ef_i8_kernel.
extern "C" __global__ void __launch_bounds__(TV_THREADS)
tv_decompress_avg_i8_kernel(const signed char* __restrict__ q, const float* __restrict__ scales,
                            float* __restrict__ out, float inv_n, long long n, int block,
                            int* flag) {
  const bool vec = block % TV_QUANT_ITEMS == 0 && tv::aligned<4>(q) && tv::aligned<16>(out);
  const long long blocks = (n + block - 1) / block;
  bool bad = false;
  for (long long b = blockIdx.x; b < blocks; b += gridDim.x) {
    const long long start = b * block;
    const int len = n - start < block ? (int)(n - start) : block;
    const float scale = scales[b];
    float v[TV_QUANT_ITEMS];
    tv::load_codes(q + start, vec, len, v);
#pragma unroll
    for (int k = 0; k < TV_QUANT_ITEMS; ++k) {
      v[k] = tv::average_one(tv::dequantize_one(v[k], scale), inv_n);
      // padding items past the block's end are 0 * scale: finite unless the scale is not,
      // so they are judged only when real
      if (tv::item_index(vec, k) < len) bad |= !tv::is_finite(v[k]);
    }
    tv::store_items(out + start, vec, len, v);
  }
  tv::report_nonfinite(bad, flag);
}

// decompress_sum_: payloads [k, m] row-major (int8: scales [k, ceil(m / block)]), out [m];
// one thread per element, blockDim.x = TV_THREADS. Sums in row order.
extern "C" __global__ void __launch_bounds__(TV_THREADS)
tv_decompress_sum_f16_kernel(const unsigned short* __restrict__ payloads, int k, long long m,
                             float* __restrict__ out, float inv_n, int* flag) {
  tv::decompress_sum(tv::Rows16bit<tv::Half>{payloads, m}, k, out, inv_n, m, flag);
}

extern "C" __global__ void __launch_bounds__(TV_THREADS)
tv_decompress_sum_bf16_kernel(const unsigned short* __restrict__ payloads, int k, long long m,
                              float* __restrict__ out, float inv_n, int* flag) {
  tv::decompress_sum(tv::Rows16bit<tv::BFloat16>{payloads, m}, k, out, inv_n, m, flag);
}

extern "C" __global__ void __launch_bounds__(TV_THREADS)
tv_decompress_sum_i8_kernel(const signed char* __restrict__ q, const float* __restrict__ scales,
                            int k, long long m, float* __restrict__ out, float inv_n, int block,
                            int* flag) {
  const long long blocks = (m + block - 1) / block;
  tv::decompress_sum(tv::RowsInt8{q, scales, m, blocks, block}, k, out, inv_n, m, flag);
}

// reduce_compress_ef_: payloads [k, m] summed and re-encoded into out [m] with the residual [m];
// 16-bit as decompress_sum_ (one thread per element, blockDim.x = TV_THREADS), int8 as
// compress_ef_'s int8 kernel (one CTA per block: blockDim.x = tv::quant_threads(block)), the
// block's x made from the k copies' codes and scales [k, ceil(m / block)] in registers.
extern "C" __global__ void __launch_bounds__(TV_THREADS)
tv_reduce_compress_ef_f16_kernel(const unsigned short* __restrict__ payloads, int k, long long m,
                                 float* __restrict__ residual, unsigned short* __restrict__ out,
                                 float weight, int* flag) {
  tv::reduce_compress_ef_16bit<tv::Half>(payloads, k, m, residual, out, weight, flag);
}

extern "C" __global__ void __launch_bounds__(TV_THREADS)
tv_reduce_compress_ef_bf16_kernel(const unsigned short* __restrict__ payloads, int k, long long m,
                                  float* __restrict__ residual, unsigned short* __restrict__ out,
                                  float weight, int* flag) {
  tv::reduce_compress_ef_16bit<tv::BFloat16>(payloads, k, m, residual, out, weight, flag);
}

extern "C" __global__ void __launch_bounds__(TV_THREADS)
tv_reduce_compress_ef_i8_kernel(const signed char* __restrict__ q,
                                const float* __restrict__ in_scales, int k, long long m,
                                float* __restrict__ residual, signed char* __restrict__ out,
                                float* __restrict__ out_scales, float weight, int block,
                                int* flag) {
  __shared__ float warp_max[TV_THREADS / 32];
  // Each copy's row starts m codes after the previous one: vector loads need m % 4 == 0 too.
  const bool vec = block % TV_QUANT_ITEMS == 0 && m % TV_QUANT_ITEMS == 0 && tv::aligned<4>(q) &&
                   tv::aligned<16>(residual) && tv::aligned<4>(out);
  const long long blocks = (m + block - 1) / block;
  bool bad = false;
  for (long long b = blockIdx.x; b < blocks; b += gridDim.x) {
    const long long start = b * block;
    const int len = m - start < block ? (int)(m - start) : block;
    float x[TV_QUANT_ITEMS], r[TV_QUANT_ITEMS];
    tv::sum_copies(q + start, in_scales + b, k, m, blocks, vec, len, x);
    tv::load_items(residual + start, vec, len, r);
    // compress_ef_ from here, the sum its grad
    bad |= tv::compress_block(x, r, weight, vec, len, warp_max, residual + start, out + start,
                              out_scales + b);
  }
  tv::report_nonfinite(bad, flag);
}

#endif  // __CUDACC__

// ---------------------------------------------------------------------------------------------
// 3. Launchers (defined in compress.cu): raw pointers, sizes, a stream; no allocation. Each ORs 1
// into *flag (a device int the caller zeroed) when it meets a non-finite value, and returns the
// launch's error (cudaSuccess when n is 0 and nothing was launched).

#if !defined(__CUDACC_RTC__)
#include <cuda_runtime_api.h>

extern "C" {

cudaError_t tv_compress_ef_f16(const float* grad, float* residual, unsigned short* payload,
                               float weight, long long n, int* flag, cudaStream_t stream);
cudaError_t tv_compress_ef_bf16(const float* grad, float* residual, unsigned short* payload,
                                float weight, long long n, int* flag, cudaStream_t stream);
cudaError_t tv_compress_ef_i8(const float* grad, float* residual, signed char* q, float* scales,
                              float weight, long long n, int block, int* flag,
                              cudaStream_t stream);

cudaError_t tv_decompress_avg_f16(const unsigned short* payload, float* out, float inv_n,
                                  long long n, int* flag, cudaStream_t stream);
cudaError_t tv_decompress_avg_bf16(const unsigned short* payload, float* out, float inv_n,
                                   long long n, int* flag, cudaStream_t stream);
cudaError_t tv_decompress_avg_f32(const float* payload, float* out, float inv_n, long long n,
                                  int* flag, cudaStream_t stream);
cudaError_t tv_decompress_avg_i8(const signed char* q, const float* scales, float* out,
                                 float inv_n, long long n, int block, int* flag,
                                 cudaStream_t stream);

cudaError_t tv_decompress_sum_f16(const unsigned short* payloads, int k, long long m, float* out,
                                  float inv_n, int* flag, cudaStream_t stream);
cudaError_t tv_decompress_sum_bf16(const unsigned short* payloads, int k, long long m, float* out,
                                   float inv_n, int* flag, cudaStream_t stream);
cudaError_t tv_decompress_sum_i8(const signed char* q, const float* scales, int k, long long m,
                                 float* out, float inv_n, int block, int* flag,
                                 cudaStream_t stream);

cudaError_t tv_reduce_compress_ef_f16(const unsigned short* payloads, int k, long long m,
                                      float* residual, unsigned short* out, float weight, int* flag,
                                      cudaStream_t stream);
cudaError_t tv_reduce_compress_ef_bf16(const unsigned short* payloads, int k, long long m,
                                       float* residual, unsigned short* out, float weight,
                                       int* flag, cudaStream_t stream);
cudaError_t tv_reduce_compress_ef_i8(const signed char* q, const float* in_scales, int k,
                                     long long m, float* residual, signed char* out,
                                     float* out_scales, float weight, int block, int* flag,
                                     cudaStream_t stream);

}  // extern "C"
#endif  // !__CUDACC_RTC__

// Causal GQA attention over a session's bf16 KV cache (kernels.cuh), on CUDA cores in fp32.
// A block takes one kv head, up to 16 query rows that share it ((position, query head) pairs: a prefill
// block several positions of the group's heads, a decode block the group's heads at one position) and a
// range of keys, which it walks in tiles of 32 keys staged in shared memory (K rows padded by one bf16 pair,
// so the 32 lanes reading 32 different keys hit 32 banks). Each warp holds 4 rows: lane j scores key j of the
// tile against them, the warp takes the tile's max and sum (online softmax, fp32), and every lane adds the
// weighted V values of its own dims (d = lane, lane + 32, ...). Keys past a row's position are masked; a
// fully masked tile leaves a row's state exactly as it was.
#include <algorithm>
#include <cmath>

#include "kernels.cuh"

namespace strata_cuda {

namespace {

constexpr int kKeyTile = 32;   // keys per shared-memory tile (one per lane)
constexpr int kRows = 16;      // query rows per block
constexpr int kRowsWarp = 4;   // rows per warp (4 warps)

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// NPL: values of a head each lane owns (ceil(hd / 32)). grid: x = row blocks along the positions, y = kv head x
// head chunk, z = key chunk. Rows r of a block: position t = t0 + r / gb, query head kh * G + g0 + r % gb.
// part == nullptr: out gets the normalised rows; else part[z][t * H + h] = (max, sum, acc[hd]) of the chunk.
template <int NPL>
__global__ void __launch_bounds__(128) attention_kernel(const float* __restrict__ q, int ldq, int n, int H, int Hkv,
                                                        int hd, int gb, int tq, const bf16* __restrict__ kc,
                                                        const bf16* __restrict__ vc, int64_t cap, int64_t pos0,
                                                        float scale, int64_t chunk, bf16* __restrict__ out,
                                                        float* __restrict__ part) {
  extern __shared__ float smem[];
  const int G = H / Hkv, hchunks = (G + gb - 1) / gb;
  const int kh = blockIdx.y / hchunks, g0 = (blockIdx.y % hchunks) * gb, t0 = blockIdx.x * tq;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kstride = hd + 2;  // bf16 per K row in shared memory
  float* qs = smem;                                                      // [kRows][hd]
  bf16* ks = reinterpret_cast<bf16*>(smem + kRows * hd);                 // [kKeyTile][hd + 2]
  bf16* vs = ks + kKeyTile * kstride;                                    // [kKeyTile][hd]

  // this warp's rows: their head, position and key limit (exclusive; 0 for a row past n or the group)
  int head[kRowsWarp];
  int64_t t_of[kRowsWarp], limit[kRowsWarp];
  const int64_t kbeg = int64_t(blockIdx.z) * chunk, kchunk_end = kbeg + chunk;
  for (int i = 0; i < kRowsWarp; ++i) {
    const int r = warp * kRowsWarp + i, t = t0 + r / gb, g = g0 + r % gb;
    const bool valid = r < tq * gb && t < n && g < G;
    head[i] = valid ? kh * G + g : -1;
    t_of[i] = t;
    limit[i] = valid ? min(pos0 + t + 1, kchunk_end) : 0;
  }
  for (int idx = threadIdx.x; idx < kRows * hd; idx += blockDim.x) {  // the block's query rows, fp32
    const int r = idx / hd, d = idx % hd, t = t0 + r / gb, g = g0 + r % gb;
    qs[idx] = (r < tq * gb && t < n && g < G) ? q[int64_t(t) * ldq + int64_t(kh * G + g) * hd + d] : 0.f;
  }
  const int64_t t_last = min(int64_t(t0 + tq), int64_t(n)) - 1;
  const int64_t kend = min(pos0 + t_last + 1, kchunk_end);  // keys this block reads: [kbeg, kend)

  float m[kRowsWarp], l[kRowsWarp], acc[kRowsWarp][NPL];
  for (int i = 0; i < kRowsWarp; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
    for (int c = 0; c < NPL; ++c) acc[i][c] = 0.f;
  }
  const bf16* kbase = kc + int64_t(kh) * cap * hd;
  const bf16* vbase = vc + int64_t(kh) * cap * hd;
  for (int64_t k0 = kbeg; k0 < kend; k0 += kKeyTile) {
    __syncthreads();  // the previous tile is consumed (and, the first time, qs is written)
    for (int idx = threadIdx.x; idx < kKeyTile * hd; idx += blockDim.x) {
      const int j = idx / hd, d = idx % hd;
      const bool in = k0 + j < kend;
      const bf16 zero = __float2bfloat16(0.f);
      ks[j * kstride + d] = in ? kbase[(k0 + j) * hd + d] : zero;
      vs[j * hd + d] = in ? vbase[(k0 + j) * hd + d] : zero;
    }
    __syncthreads();
    const int64_t key = k0 + lane;
    float s[kRowsWarp];
    for (int i = 0; i < kRowsWarp; ++i) s[i] = 0.f;
    const __nv_bfloat162* kr = reinterpret_cast<const __nv_bfloat162*>(ks + lane * kstride);
    for (int d4 = 0; d4 < hd / 4; ++d4) {  // (hd is a multiple of 16) 4 dims a step: one float4 of each row's q
      const float2 k01 = __bfloat1622float2(kr[2 * d4]), k23 = __bfloat1622float2(kr[2 * d4 + 1]);
      for (int i = 0; i < kRowsWarp; ++i) {
        const float4 qv = reinterpret_cast<const float4*>(qs + (warp * kRowsWarp + i) * hd)[d4];
        s[i] += qv.x * k01.x + qv.y * k01.y + qv.z * k23.x + qv.w * k23.y;
      }
    }
    float p[kRowsWarp];
    for (int i = 0; i < kRowsWarp; ++i) {
      s[i] = key < limit[i] ? s[i] * scale : -INFINITY;
      const float m_new = fmaxf(m[i], warp_max(s[i]));
      if (m_new == -INFINITY) {  // nothing visible to this row yet (uniform across the warp)
        p[i] = 0.f;
        continue;
      }
      const float alpha = expf(m[i] - m_new);  // 0 when m was -inf (acc and l are 0 then)
      p[i] = s[i] == -INFINITY ? 0.f : expf(s[i] - m_new);
      l[i] = l[i] * alpha + warp_sum(p[i]);
      for (int c = 0; c < NPL; ++c) acc[i][c] *= alpha;
      m[i] = m_new;
    }
    for (int j = 0; j < kKeyTile; ++j) {
      float pj[kRowsWarp];
      for (int i = 0; i < kRowsWarp; ++i) pj[i] = __shfl_sync(0xffffffffu, p[i], j);
      for (int c = 0; c < NPL; ++c) {
        const int d = lane + 32 * c;
        if (d >= hd) break;
        const float v = __bfloat162float(vs[j * hd + d]);
        for (int i = 0; i < kRowsWarp; ++i) acc[i][c] += pj[i] * v;
      }
    }
  }
  for (int i = 0; i < kRowsWarp; ++i) {
    if (head[i] < 0) continue;
    if (part) {
      float* dst = part + (int64_t(blockIdx.z) * n * H + t_of[i] * H + head[i]) * (hd + 2);
      if (lane == 0) {
        dst[0] = m[i];
        dst[1] = l[i];
      }
      for (int c = 0; c < NPL; ++c)
        if (lane + 32 * c < hd) dst[2 + lane + 32 * c] = acc[i][c];
    } else {
      const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
      bf16* o = out + t_of[i] * int64_t(H) * hd + int64_t(head[i]) * hd;
      for (int c = 0; c < NPL; ++c)
        if (lane + 32 * c < hd) o[lane + 32 * c] = __float2bfloat16(acc[i][c] * inv);
    }
  }
}

// out[row] = sum_z e^(m_z - M) acc_z / sum_z e^(m_z - M) l_z over the key chunks; one block per (t, h) row.
__global__ void attention_combine(const float* __restrict__ part, int splits, int rows, int hd,
                                  bf16* __restrict__ out) {
  const int row = blockIdx.x;
  float mx = -INFINITY;
  for (int z = 0; z < splits; ++z) mx = fmaxf(mx, part[(int64_t(z) * rows + row) * (hd + 2)]);
  float lsum = 0.f;
  for (int z = 0; z < splits; ++z) {
    const float* p = part + (int64_t(z) * rows + row) * (hd + 2);
    if (p[0] != -INFINITY) lsum += expf(p[0] - mx) * p[1];
  }
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.f;
    for (int z = 0; z < splits; ++z) {
      const float* p = part + (int64_t(z) * rows + row) * (hd + 2);
      if (p[0] != -INFINITY) o += expf(p[0] - mx) * p[2 + d];
    }
    out[int64_t(row) * hd + d] = __float2bfloat16(lsum > 0.f ? o / lsum : 0.f);
  }
}

template <int NPL>
void launch(dim3 grid, size_t smem, cudaStream_t s, const float* q, int ldq, int n, int H, int Hkv, int hd, int gb,
            int tq, const bf16* kc, const bf16* vc, int64_t cap, int64_t pos0, float scale, int64_t chunk, bf16* out,
            float* part) {
  static bool attr = false;  // hd 256 needs more than the default 48 KiB of dynamic shared memory
  if (!attr) {
    cudaFuncSetAttribute(attention_kernel<NPL>, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024);
    attr = true;
  }
  attention_kernel<NPL><<<grid, 128, smem, s>>>(q, ldq, n, H, Hkv, hd, gb, tq, kc, vc, cap, pos0, scale, chunk, out,
                                                part);
}

}  // namespace

void attention(const float* q, int ldq, int n, int H, int Hkv, int hd, const bf16* kc, const bf16* vc, int64_t cap,
               int64_t pos0, bf16* out, float* work, int sms, cudaStream_t s) {
  const int G = H / Hkv, gb = G < kRows ? G : kRows, tq = kRows / gb, hchunks = (G + gb - 1) / gb;
  const int64_t keys = pos0 + n;
  int64_t chunk = round_up(keys, kKeyTile), splits = 1;
  if (n == 1) {  // decode: enough blocks to fill the GPU (several per SM), chunks of whole tiles
    const int64_t per_split = int64_t(Hkv) * hchunks, want = (8 * int64_t(sms) + per_split - 1) / per_split;
    const int64_t tiles = (keys + kKeyTile - 1) / kKeyTile;
    splits = std::min<int64_t>(std::min<int64_t>(want, tiles), kAttnMaxSplits);
    if (splits < 1) splits = 1;
    chunk = ((tiles + splits - 1) / splits) * kKeyTile;
    splits = (keys + chunk - 1) / chunk;
  }
  const dim3 grid(unsigned((n + tq - 1) / tq), unsigned(Hkv * hchunks), unsigned(splits));
  const size_t smem = size_t(kRows) * hd * sizeof(float) + size_t(kKeyTile) * (hd + 2) * 2 + size_t(kKeyTile) * hd * 2;
  const float scale = 1.0f / sqrtf(float(hd));
  float* part = splits > 1 ? work : nullptr;
  const int npl = (hd + 31) / 32;
  if (npl <= 1) launch<1>(grid, smem, s, q, ldq, n, H, Hkv, hd, gb, tq, kc, vc, cap, pos0, scale, chunk, out, part);
  else if (npl <= 2) launch<2>(grid, smem, s, q, ldq, n, H, Hkv, hd, gb, tq, kc, vc, cap, pos0, scale, chunk, out, part);
  else if (npl <= 4) launch<4>(grid, smem, s, q, ldq, n, H, Hkv, hd, gb, tq, kc, vc, cap, pos0, scale, chunk, out, part);
  else launch<8>(grid, smem, s, q, ldq, n, H, Hkv, hd, gb, tq, kc, vc, cap, pos0, scale, chunk, out, part);
  if (part) attention_combine<<<unsigned(n * H), 128, 0, s>>>(part, int(splits), n * H, hd, out);
}

}  // namespace strata_cuda

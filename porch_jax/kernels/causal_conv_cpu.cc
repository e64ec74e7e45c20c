// Gated DeltaNet's short depthwise causal convolution followed by SiLU, forward and backward, as XLA
// FFI custom calls for the CPU (the CPU path of porch_jax/models/deltanet.causal_conv1d).
//
//   u[b, t, c] = sum_l w[K-1-l, c] x[b, t-l, c]  over lags l <= reach[b, t],   y = silu(u)
//
// where x[b, s < 0] is the carried state [B, K-1, C], w [K, C] the transposed depthwise weight, and
// reach[b, t] the largest lag that stays in token t's packed segment. XLA:CPU runs the shifted
// copies, masks and their transposes as separate passes over [B, T, C]; here each direction is one
// pass with the K rows in cache (the stack of bench_deltanet: 202.7 -> 177.7 ms). Work items are (batch, block of tokens) pairs on XLA's intra-op pool.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu_common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using porch::f32x16;
using porch::i32x16;
using porch::parallel_for;

constexpr int64_t BLOCK = 128;  // tokens per work item

// exp and the logistic function on 16 lanes (Cephes' expf polynomial: ~1 ulp on the clamped range),
// so that SiLU vectorises without -ffast-math (which would set flush-to-zero for the whole process).
inline f32x16 exp16(f32x16 x) {
  const f32x16 hi = f32x16{} + 88.3762626647949f, lo = f32x16{} - 88.3762626647949f;
  x = x > hi ? hi : x;
  x = x < lo ? lo : x;
  f32x16 fx = x * 1.44269504088896341f + 0.5f;
  i32x16 n = __builtin_convertvector(fx, i32x16);
  n += (__builtin_convertvector(n, f32x16) > fx);  // floor (a true comparison is -1)
  const f32x16 nf = __builtin_convertvector(n, f32x16);
  x = x - nf * 0.693359375f + nf * 2.12194440e-4f;
  const f32x16 z = x * x;
  f32x16 y = 1.9875691500E-4f * x + 1.3981999507E-3f;
  y = y * x + 8.3334519073E-3f;
  y = y * x + 4.1665795894E-2f;
  y = y * x + 1.6666665459E-1f;
  y = y * x + 5.0000001201E-1f;
  y = y * z + x + 1.0f;
  const i32x16 bits = (n + 127) << 23;
  f32x16 scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return y * scale;
}
inline f32x16 sigmoid16(f32x16 u) { return 1.0f / (1.0f + exp16(-u)); }

struct Shape {
  int64_t b, t, c, k, blocks;
};

struct Conv {
  const Shape& s;
  const float *x, *state, *w;
  const int32_t* reach;

  // Row of input at token index t (t < 0: the state's row K-1+t) of sequence b.
  const float* row(int64_t b, int64_t t) const {
    return t >= 0 ? x + (b * s.t + t) * s.c : state + (b * (s.k - 1) + (s.k - 1 + t)) * s.c;
  }
  // u for lanes [c0, c0 + 16) of token t.
  f32x16 pre(int64_t b, int64_t t, int64_t c0) const {
    f32x16 u = {};
    const int64_t lags = std::min<int64_t>(s.k - 1, reach[b * s.t + t]);
    for (int64_t l = 0; l <= lags; ++l) {
      f32x16 xv, wv;
      std::memcpy(&xv, row(b, t - l) + c0, sizeof(xv));
      std::memcpy(&wv, w + (s.k - 1 - l) * s.c + c0, sizeof(wv));
      u += wv * xv;
    }
    return u;
  }
};

ffi::Error read_shape(ffi::Buffer<ffi::F32>& x, ffi::Buffer<ffi::F32>& state, ffi::Buffer<ffi::F32>& w,
                      ffi::Buffer<ffi::S32>& reach, Shape* s) {
  auto xd = x.dimensions(), sd = state.dimensions(), wd = w.dimensions(), rd = reach.dimensions();
  if (xd.size() != 3 || sd.size() != 3 || wd.size() != 2 || rd.size() != 2 || wd[1] != xd[2] || wd[0] < 1 ||
      sd[0] != xd[0] || sd[1] != wd[0] - 1 || sd[2] != xd[2] || rd[0] != xd[0] || rd[1] != xd[1] || xd[2] % 16)
    return ffi::Error::InvalidArgument(
        "causal conv: expected x [B, T, C] with C a multiple of 16, state [B, K-1, C], weight [K, C], reach [B, T]");
  *s = Shape{xd[0], xd[1], xd[2], wd[0], (xd[1] + BLOCK - 1) / BLOCK};
  return ffi::Error::Success();
}

ffi::Error Forward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> state,
                   ffi::Buffer<ffi::F32> w, ffi::Buffer<ffi::S32> reach, ffi::ResultBuffer<ffi::F32> y) {
  Shape s;
  if (auto err = read_shape(x, state, w, reach, &s); err.failure()) return err;
  const Conv conv{s, x.typed_data(), state.typed_data(), w.typed_data(), reach.typed_data()};
  float* out = y->typed_data();
  parallel_for(pool, s.b * s.blocks, [&](int64_t item) {
    const int64_t b = item / s.blocks, start = (item % s.blocks) * BLOCK, stop = std::min(s.t, start + BLOCK);
    for (int64_t t = start; t < stop; ++t) {
      for (int64_t c0 = 0; c0 < s.c; c0 += 16) {
        const f32x16 u = conv.pre(b, t, c0), v = u * sigmoid16(u);
        std::memcpy(out + (b * s.t + t) * s.c + c0, &v, sizeof(v));
      }
    }
  });
  return ffi::Error::Success();
}

// du = dy silu'(u); dx[s] = sum_l du[s + l] w[K-1-l] (where lag l reaches s from s + l); the same into
// the state's rows for s < 0; dw[K-1-l] = sum_t du[t] x[t - l]. Each item recomputes du for its
// tokens and the K-1 after them, and sums its own dw, added up at the end.
ffi::Error Backward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> state,
                    ffi::Buffer<ffi::F32> w, ffi::Buffer<ffi::S32> reach, ffi::Buffer<ffi::F32> dy,
                    ffi::ResultBuffer<ffi::F32> dx, ffi::ResultBuffer<ffi::F32> dstate,
                    ffi::ResultBuffer<ffi::F32> dw) {
  Shape s;
  if (auto err = read_shape(x, state, w, reach, &s); err.failure()) return err;
  const Conv conv{s, x.typed_data(), state.typed_data(), w.typed_data(), reach.typed_data()};
  const float* g = dy.typed_data();
  float *gx = dx->typed_data(), *gs = dstate->typed_data();
  const int64_t items = s.b * s.blocks;
  std::vector<float> partial(items * s.c * s.k, 0.f);  // dw per item, [K, C] each
  parallel_for(pool, items, [&](int64_t item) {
    const int64_t b = item / s.blocks, start = (item % s.blocks) * BLOCK, stop = std::min(s.t, start + BLOCK);
    const int64_t last = std::min(s.t, stop + s.k - 1);  // du is needed up to here
    std::vector<float> du((last - start) * s.c);
    for (int64_t t = start; t < last; ++t) {
      for (int64_t c0 = 0; c0 < s.c; c0 += 16) {
        const f32x16 u = conv.pre(b, t, c0), sg = sigmoid16(u);
        f32x16 gy, d;
        std::memcpy(&gy, g + (b * s.t + t) * s.c + c0, sizeof(gy));
        d = gy * (sg + u * sg * (1.0f - sg));
        std::memcpy(du.data() + (t - start) * s.c + c0, &d, sizeof(d));
      }
    }
    float* dwi = partial.data() + item * s.c * s.k;
    // Input rows this item owns: its tokens, and the state's rows for the first block.
    const int64_t first = start == 0 ? -(s.k - 1) : start;
    for (int64_t r = first; r < stop; ++r) {
      float* target = r >= 0 ? gx + (b * s.t + r) * s.c : gs + (b * (s.k - 1) + s.k - 1 + r) * s.c;
      for (int64_t c = 0; c < s.c; ++c) target[c] = 0.f;
      for (int64_t l = 0; l < s.k; ++l) {
        const int64_t t = r + l;  // the token whose lag l reads row r
        if (t < start || t >= last || l > conv.reach[b * s.t + t]) continue;
        const float* d = du.data() + (t - start) * s.c;
        const float* wl = conv.w + (s.k - 1 - l) * s.c;
#pragma omp simd
        for (int64_t c = 0; c < s.c; ++c) target[c] += d[c] * wl[c];
      }
    }
    for (int64_t t = start; t < stop; ++t) {  // dw: the terms of this item's tokens
      const float* d = du.data() + (t - start) * s.c;
      const int64_t lags = std::min<int64_t>(s.k - 1, conv.reach[b * s.t + t]);
      for (int64_t l = 0; l <= lags; ++l) {
        const float* xin = conv.row(b, t - l);
        float* dwl = dwi + (s.k - 1 - l) * s.c;
#pragma omp simd
        for (int64_t c = 0; c < s.c; ++c) dwl[c] += d[c] * xin[c];
      }
    }
  });
  float* out = dw->typed_data();
  std::memset(out, 0, s.c * s.k * sizeof(float));
  for (int64_t i = 0; i < items; ++i)
    for (int64_t j = 0; j < s.c * s.k; ++j) out[j] += partial[i * s.c * s.k + j];
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(PorchCausalConvForward, Forward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x
                                  .Arg<ffi::Buffer<ffi::F32>>()  // state
                                  .Arg<ffi::Buffer<ffi::F32>>()  // weight [K, C]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // reach
                                  .Ret<ffi::Buffer<ffi::F32>>());  // y

XLA_FFI_DEFINE_HANDLER_SYMBOL(PorchCausalConvBackward, Backward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x
                                  .Arg<ffi::Buffer<ffi::F32>>()  // state
                                  .Arg<ffi::Buffer<ffi::F32>>()  // weight [K, C]
                                  .Arg<ffi::Buffer<ffi::S32>>()  // reach
                                  .Arg<ffi::Buffer<ffi::F32>>()  // dy
                                  .Ret<ffi::Buffer<ffi::F32>>()  // dx
                                  .Ret<ffi::Buffer<ffi::F32>>()  // d state
                                  .Ret<ffi::Buffer<ffi::F32>>());  // d weight

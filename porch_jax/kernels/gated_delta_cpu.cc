// The gated delta rule, token by token, as XLA FFI custom calls for the CPU: forward and backward.
//
// Per (batch, value head), with the state S [Dk, Dv] kept in L1:
//   a_t = exp(g_t) keep_t,  delta_t = beta_t (v_t - a_t S^T k_t),  S <- a_t S + k_t delta_t^T,  o_t = S^T q_t
// (keep_t = 0 where a packed segment starts: the state restarts). One pass over S per token.
// XLA:CPU runs the chunked (WY/UT) form as many small matmuls at ~40 GFLOP/s; the recurrence runs
// near this CPU's FMA peak (7 Dk Dv flops per token, the state in cache), so this file is the CPU
// path of porch_jax/models/deltanet.py. The backward recomputes each chunk's states from checkpoints the
// forward writes every `chunk` tokens. Work items are (batch, value head) pairs, spread over XLA's
// intra-op thread pool.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu_common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using porch::f32x16;
using porch::f32x4;
using porch::f32x8;
using porch::parallel_for;

struct Shape {
  int64_t b, t, hk, h, dk, dv, chunks, chunk;
};

inline float hsum(float x) { return x; }
inline float hsum(f32x16 x) {  // halving with constant shuffles (a mask built at run time costs ~20x)
  f32x8 a = __builtin_shufflevector(x, x, 0, 1, 2, 3, 4, 5, 6, 7) +
            __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15);
  f32x4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

// The sums of four vectors at once (one shuffle tree instead of four): lanes 0-3 of the result.
inline f32x4 hsum4(f32x16 a, f32x16 b, f32x16 c, f32x16 d) {
  // [a halves folded | b halves folded], and the same for c, d: 8 partial sums each.
  f32x16 ab = __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
              __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  f32x16 cd = __builtin_shufflevector(c, d, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
              __builtin_shufflevector(c, d, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  // 4 partial sums each of a, b, c, d.
  f32x16 x = __builtin_shufflevector(ab, cd, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
             __builtin_shufflevector(ab, cd, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  // 2, then 1.
  f32x16 y = x + __builtin_shufflevector(x, x, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  y += __builtin_shufflevector(y, y, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  return __builtin_shufflevector(y, y, 0, 4, 8, 12);
}
inline f32x4 hsum4(float a, float b, float c, float d) { return f32x4{a, b, c, d}; }

template <int W> struct Lanes;  // (GCC drops vector_size on typedefs that depend on a template parameter)
template <> struct Lanes<16> { using vec = f32x16; };
template <> struct Lanes<1> { using vec = float; };

template <int W, int NV_>
struct Rule {
  using vec = typename Lanes<W>::vec;
  static constexpr int MAXV = NV_ ? NV_ : 1024 / W;
  const Shape& s;

  int64_t nv() const { return NV_ ? NV_ : s.dv / W; }
  static vec load(const float* p) { vec x; __builtin_memcpy(&x, p, sizeof(vec)); return x; }
  static void store(float* p, vec x) { __builtin_memcpy(p, &x, sizeof(vec)); }
  float dot(const vec* x, const vec* y) const {
    vec acc = {};
    for (int64_t c = 0; c < nv(); ++c) acc += x[c] * y[c];
    return hsum(acc);
  }
  static float dot(const float* x, const float* y, int64_t n) {
    float acc = 0.f;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < n; ++i) acc += x[i] * y[i];
    return acc;
  }

  // Offsets of token t of one work item (b, h) in q/k, in v/o, in g/beta and in keep.
  struct Item {
    int64_t qk0, v0, g0, keep0, qk_stride, v_stride, g_stride;
    int64_t qk(int64_t t) const { return qk0 + t * qk_stride; }
    int64_t v(int64_t t) const { return v0 + t * v_stride; }
    int64_t g(int64_t t) const { return g0 + t * g_stride; }
  };
  Item item_of(int64_t b, int64_t h) const {
    return Item{(b * s.t * s.hk + h / (s.h / s.hk)) * s.dk, (b * s.t * s.h + h) * s.dv, b * s.t * s.h + h, b * s.t,
                s.hk * s.dk, s.h * s.dv, s.h};
  }
  static float decay(const float* g, const float* keep, const Item& it, int64_t t) {
    return std::exp(g[it.g(t)]) * keep[it.keep0 + t];
  }

  // Token rows are strided (other heads lie between them): prefetching a few tokens ahead took
  // 0.43 -> 0.38 ms (forward) and 1.60 -> 1.40 ms (backward) per item.
  static void prefetch(const float* p, int64_t n) {
    for (int64_t l = 0; l < n; l += 16) __builtin_prefetch(p + l);
  }
  static constexpr int64_t AHEAD = 4;

  // acc[c] = sum_i x[i] S[i, c] (and acc2 with y when given).
  void project(const float* S, const float* x, const float* y, vec* acc, vec* acc2) const {
    const int64_t V = nv();
    for (int64_t c = 0; c < V; ++c) acc[c] = acc2[c] = vec{};
    for (int64_t i = 0; i < s.dk; ++i) {
      const float* row = S + i * V * W;
      for (int64_t c = 0; c < V; ++c) {
        const vec r = load(row + c * W);
        acc[c] += x[i] * r;
        if (y) acc2[c] += y[i] * r;
      }
    }
  }

  void forward(int64_t item, const float* q, const float* k, const float* v, const float* g, const float* beta,
               const float* keep, const float* s0, float* o, float* s_final, float* checkpoints) const {
    const Item it = item_of(item / s.h, item % s.h);
    const int64_t V = nv(), size = s.dk * s.dv;
    if (s.t == 0) {
      std::memcpy(s_final + item * size, s0 + item * size, size * sizeof(float));
      return;
    }
    std::vector<float> state(s0 + item * size, s0 + (item + 1) * size), zeros(s.dk, 0.f);
    float* S = state.data();
    vec sk[MAXV], sq[MAXV], delta[MAXV];
    project(S, k + it.qk(0), q + it.qk(0), sk, sq);  // S^T k and S^T q for token 0
    for (int64_t t = 0; t < s.t; ++t) {
      if (t % s.chunk == 0) std::memcpy(checkpoints + (item * s.chunks + t / s.chunk) * size, S, size * sizeof(float));
      const float *qt = q + it.qk(t), *kt = k + it.qk(t), *vt = v + it.v(t);
      const float a = decay(g, keep, it, t), bt = beta[it.g(t)], qk = dot(qt, kt, s.dk);
      float* ot = o + it.v(t);
      if (t + AHEAD < s.t) {
        prefetch(v + it.v(t + AHEAD), s.dv), prefetch(o + it.v(t + AHEAD), s.dv);
        prefetch(q + it.qk(t + AHEAD), s.dk), prefetch(k + it.qk(t + AHEAD), s.dk);
      }
      for (int64_t c = 0; c < V; ++c) {
        delta[c] = bt * (load(vt + c * W) - a * sk[c]);
        store(ot + c * W, a * sq[c] + qk * delta[c]);
        sk[c] = sq[c] = vec{};
      }
      const bool last = t + 1 == s.t;
      const float* kn = last ? zeros.data() : k + it.qk(t + 1);
      const float* qn = last ? zeros.data() : q + it.qk(t + 1);
      for (int64_t i = 0; i < s.dk; ++i) {  // S <- a S + k delta^T, and the next token's products
        float* row = S + i * V * W;
        const float ki = kt[i], kni = kn[i], qni = qn[i];
        for (int64_t c = 0; c < V; ++c) {
          const vec r = a * load(row + c * W) + ki * delta[c];
          store(row + c * W, r);
          sk[c] += kni * r;
          sq[c] += qni * r;
        }
      }
    }
    std::memcpy(s_final + item * size, S, size * sizeof(float));
  }

  // Reverse pass over one work item. dq and dk are per value head ([B, T, H, Dk]); the caller sums
  // the value heads of each key head. Per token t, with P the state before it and dS the cotangent
  // of the state after it: dS' = dS + q do^T, d_delta = dS'^T k, u = beta d_delta (= dv),
  // dk = dS' delta - a P u, dq = (a P + k delta^T) do, dA = dS' - k u^T, dg = a <dA, P>, and the
  // cotangent of the state before token t is a dA. X = dS^T k, Y = dS delta and Z = P do are
  // accumulated in the pass of the token after.
  void backward(int64_t item, const float* q, const float* k, const float* v, const float* g, const float* beta,
                const float* keep, const float* checkpoints, const float* d_o, const float* d_final, float* dq,
                float* dk_out, float* dv_out, float* dg, float* dbeta, float* ds0) const {
    const Item it = item_of(item / s.h, item % s.h);
    const int64_t V = nv(), size = s.dk * s.dv;
    std::vector<float> states(s.chunk * size), deltas(s.chunk * s.dv), rs(s.chunk * s.dv), Y(s.dk), Z(s.dk);
    std::vector<float> dS(d_final + item * size, d_final + (item + 1) * size);
    vec sk[MAXV], unused[MAXV], X[MAXV], Xn[MAXV], dd[MAXV], u[MAXV], dov[MAXV], dlt[MAXV];
    for (int64_t c = s.chunks - 1; c >= 0; --c) {
      const int64_t start = c * s.chunk, stop = std::min(s.t, start + s.chunk);
      // Recompute the chunk's states (slot j: before token start + j), deltas and r = v - a S^T k.
      std::memcpy(states.data(), checkpoints + (item * s.chunks + c) * size, size * sizeof(float));
      project(states.data(), k + it.qk(start), nullptr, sk, unused);
      for (int64_t t = start; t < stop; ++t) {
        const int64_t j = t - start;
        const float *kt = k + it.qk(t), *vt = v + it.v(t);
        const float a = decay(g, keep, it, t), bt = beta[it.g(t)];
        if (t + AHEAD < stop) prefetch(k + it.qk(t + AHEAD), s.dk), prefetch(v + it.v(t + AHEAD), s.dv);
        for (int64_t c2 = 0; c2 < V; ++c2) {
          const vec r = load(vt + c2 * W) - a * sk[c2];
          store(rs.data() + j * s.dv + c2 * W, r);
          store(deltas.data() + j * s.dv + c2 * W, bt * r);
          sk[c2] = vec{};
        }
        if (t + 1 == stop) break;
        const float* P = states.data() + j * size;
        float* next = states.data() + (j + 1) * size;
        const float* delta = deltas.data() + j * s.dv;
        const float* kn = k + it.qk(t + 1);
        for (int64_t i = 0; i < s.dk; ++i) {
          const float ki = kt[i], kni = kn[i];
          for (int64_t c2 = 0; c2 < V; ++c2) {
            const vec r = a * load(P + i * V * W + c2 * W) + ki * load(delta + c2 * W);
            store(next + i * V * W + c2 * W, r);
            sk[c2] += kni * r;
          }
        }
      }
      // X, Y, Z of the chunk's last token, from dS as it enters the chunk.
      {
        const int64_t t = stop - 1, j = t - start;
        const float* kt = k + it.qk(t);
        for (int64_t c2 = 0; c2 < V; ++c2) {
          X[c2] = vec{};
          dlt[c2] = load(deltas.data() + j * s.dv + c2 * W);
          dov[c2] = load(d_o + it.v(t) + c2 * W);
        }
        for (int64_t i = 0; i < s.dk; ++i) {
          vec y = {}, z = {};
          for (int64_t c2 = 0; c2 < V; ++c2) {
            const vec r = load(dS.data() + i * V * W + c2 * W);
            X[c2] += kt[i] * r;
            y += r * dlt[c2];
            z += load(states.data() + j * size + i * V * W + c2 * W) * dov[c2];
          }
          Y[i] = hsum(y);
          Z[i] = hsum(z);
        }
      }
      for (int64_t t = stop - 1; t >= start; --t) {
        const int64_t j = t - start, gi = it.g(t);
        const float* P = states.data() + j * size;
        const float *qt = q + it.qk(t), *kt = k + it.qk(t);
        const float a = decay(g, keep, it, t), bt = beta[gi], qk = dot(qt, kt, s.dk);
        if (t - AHEAD >= 0) {
          prefetch(q + it.qk(t - AHEAD), s.dk), prefetch(k + it.qk(t - AHEAD), s.dk);
          prefetch(d_o + it.v(t - AHEAD), s.dv), prefetch(dv_out + it.v(t - AHEAD), s.dv);
          prefetch(dq + it.g(t - AHEAD) * s.dk, s.dk), prefetch(dk_out + it.g(t - AHEAD) * s.dk, s.dk);
        }
        for (int64_t c2 = 0; c2 < V; ++c2) {
          dov[c2] = load(d_o + it.v(t) + c2 * W);
          dlt[c2] = load(deltas.data() + j * s.dv + c2 * W);
        }
        const float ddo = dot(dlt, dov);
        vec db = {};
        for (int64_t c2 = 0; c2 < V; ++c2) {
          dd[c2] = X[c2] + qk * dov[c2];
          u[c2] = bt * dd[c2];
          db += dd[c2] * load(rs.data() + j * s.dv + c2 * W);
          store(dv_out + it.v(t) + c2 * W, u[c2]);
          Xn[c2] = vec{};
        }
        dbeta[gi] = hsum(db);
        // The previous token's operands (zeros at the chunk's first token: its X, Y, Z are computed
        // from scratch when the previous chunk starts).
        const bool prev = t > start;
        const float* Pp = prev ? P - size : P;
        const float* kp = prev ? k + it.qk(t - 1) : kt;
        vec dlt_p[MAXV], do_p[MAXV];
        for (int64_t c2 = 0; c2 < V; ++c2) {
          dlt_p[c2] = prev ? load(deltas.data() + (j - 1) * s.dv + c2 * W) : vec{};
          do_p[c2] = prev ? load(d_o + it.v(t - 1) + c2 * W) : vec{};
        }
        float* dqt = dq + it.g(t) * s.dk;
        float* dkt = dk_out + it.g(t) * s.dk;
        vec da = {};
        for (int64_t i = 0; i < s.dk; ++i) {
          float* row = dS.data() + i * V * W;
          const float* prow = P + i * V * W;
          const float* pprow = Pp + i * V * W;
          const float qi = qt[i], ki = kt[i], kpi = kp[i];
          vec pu = {}, y = {}, z = {};
          for (int64_t c2 = 0; c2 < V; ++c2) {
            const vec p = load(prow + c2 * W);
            const vec dA = load(row + c2 * W) + qi * dov[c2] - ki * u[c2];
            pu += p * u[c2];
            da += dA * p;
            const vec r = a * dA;
            store(row + c2 * W, r);
            Xn[c2] += kpi * r;
            y += r * dlt_p[c2];
            z += load(pprow + c2 * W) * do_p[c2];
          }
          const f32x4 sums = hsum4(pu, y, z, vec{});
          dkt[i] = Y[i] + qi * ddo - a * sums[0];
          dqt[i] = a * Z[i] + ki * ddo;
          Y[i] = sums[1];
          Z[i] = sums[2];
        }
        for (int64_t c2 = 0; c2 < V; ++c2) X[c2] = Xn[c2];
        dg[gi] = a * hsum(da);
      }
    }
    std::memcpy(ds0 + item * size, dS.data(), size * sizeof(float));
  }
};

// Reads and checks the shapes: q, k [B, T, Hk, Dk], v [B, T, H, Dv], g, beta [B, T, H], keep [B, T].
ffi::Error read_shape(ffi::Buffer<ffi::F32>& q, ffi::Buffer<ffi::F32>& v, ffi::Buffer<ffi::F32>& g,
                      ffi::Buffer<ffi::F32>& keep, int64_t chunk, Shape* s) {
  auto qd = q.dimensions(), vd = v.dimensions(), gd = g.dimensions(), kd = keep.dimensions();
  if (qd.size() != 4 || vd.size() != 4 || gd.size() != 3 || kd.size() != 2)
    return ffi::Error::InvalidArgument("gated delta rule: q/v must be rank 4, g rank 3, keep rank 2");
  *s = Shape{qd[0], qd[1], qd[2], vd[2], qd[3], vd[3], 0, chunk};
  if (vd[0] != s->b || vd[1] != s->t || gd[0] != s->b || gd[1] != s->t || gd[2] != s->h || kd[0] != s->b ||
      kd[1] != s->t || s->hk == 0 || s->h % s->hk || chunk <= 0 || s->dv > 1024)
    return ffi::Error::InvalidArgument(
        "gated delta rule: expected q, k [B, T, Hk, Dk], v [B, T, H, Dv] with H a multiple of Hk and Dv <= 1024, "
        "g, beta [B, T, H], keep [B, T]");
  s->chunks = (s->t + chunk - 1) / chunk;
  return ffi::Error::Success();
}

template <typename F>
void dispatch(const Shape& s, F fn) {
  if (s.dv == 64) fn(Rule<16, 4>{s});
  else if (s.dv == 128) fn(Rule<16, 8>{s});
  else if (s.dv % 16 == 0) fn(Rule<16, 0>{s});
  else fn(Rule<1, 0>{s});
}

ffi::Error Forward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                   ffi::Buffer<ffi::F32> g, ffi::Buffer<ffi::F32> beta, ffi::Buffer<ffi::F32> keep,
                   ffi::Buffer<ffi::F32> s0, ffi::ResultBuffer<ffi::F32> o, ffi::ResultBuffer<ffi::F32> s_final,
                   ffi::ResultBuffer<ffi::F32> checkpoints, int64_t chunk) {
  Shape s;
  if (auto err = read_shape(q, v, g, keep, chunk, &s); err.failure()) return err;
  dispatch(s, [&](auto rule) {
    parallel_for(pool, s.b * s.h, [&](int64_t item) {
      rule.forward(item, q.typed_data(), k.typed_data(), v.typed_data(), g.typed_data(), beta.typed_data(),
                   keep.typed_data(), s0.typed_data(), o->typed_data(), s_final->typed_data(),
                   checkpoints->typed_data());
    });
  });
  return ffi::Error::Success();
}

ffi::Error Backward(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                    ffi::Buffer<ffi::F32> g, ffi::Buffer<ffi::F32> beta, ffi::Buffer<ffi::F32> keep,
                    ffi::Buffer<ffi::F32> checkpoints, ffi::Buffer<ffi::F32> d_o, ffi::Buffer<ffi::F32> d_final,
                    ffi::ResultBuffer<ffi::F32> dq, ffi::ResultBuffer<ffi::F32> dk, ffi::ResultBuffer<ffi::F32> dv,
                    ffi::ResultBuffer<ffi::F32> dg, ffi::ResultBuffer<ffi::F32> dbeta,
                    ffi::ResultBuffer<ffi::F32> ds0, int64_t chunk) {
  Shape s;
  if (auto err = read_shape(q, v, g, keep, chunk, &s); err.failure()) return err;
  dispatch(s, [&](auto rule) {
    parallel_for(pool, s.b * s.h, [&](int64_t item) {
      rule.backward(item, q.typed_data(), k.typed_data(), v.typed_data(), g.typed_data(), beta.typed_data(),
                    keep.typed_data(), checkpoints.typed_data(), d_o.typed_data(), d_final.typed_data(),
                    dq->typed_data(), dk->typed_data(), dv->typed_data(), dg->typed_data(), dbeta->typed_data(),
                    ds0->typed_data());
    });
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(PorchGatedDeltaForward, Forward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k
                                  .Arg<ffi::Buffer<ffi::F32>>()  // v
                                  .Arg<ffi::Buffer<ffi::F32>>()  // g
                                  .Arg<ffi::Buffer<ffi::F32>>()  // beta
                                  .Arg<ffi::Buffer<ffi::F32>>()  // keep
                                  .Arg<ffi::Buffer<ffi::F32>>()  // initial state
                                  .Ret<ffi::Buffer<ffi::F32>>()  // o
                                  .Ret<ffi::Buffer<ffi::F32>>()  // final state
                                  .Ret<ffi::Buffer<ffi::F32>>()  // checkpoints
                                  .Attr<int64_t>("chunk"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PorchGatedDeltaBackward, Backward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k
                                  .Arg<ffi::Buffer<ffi::F32>>()  // v
                                  .Arg<ffi::Buffer<ffi::F32>>()  // g
                                  .Arg<ffi::Buffer<ffi::F32>>()  // beta
                                  .Arg<ffi::Buffer<ffi::F32>>()  // keep
                                  .Arg<ffi::Buffer<ffi::F32>>()  // checkpoints
                                  .Arg<ffi::Buffer<ffi::F32>>()  // d o
                                  .Arg<ffi::Buffer<ffi::F32>>()  // d final state
                                  .Ret<ffi::Buffer<ffi::F32>>()  // dq per value head
                                  .Ret<ffi::Buffer<ffi::F32>>()  // dk per value head
                                  .Ret<ffi::Buffer<ffi::F32>>()  // dv
                                  .Ret<ffi::Buffer<ffi::F32>>()  // dg
                                  .Ret<ffi::Buffer<ffi::F32>>()  // dbeta
                                  .Ret<ffi::Buffer<ffi::F32>>()  // d initial state
                                  .Attr<int64_t>("chunk"));

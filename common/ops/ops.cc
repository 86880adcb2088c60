#include "common/ops/ops.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace coli::ops {
int ParallelTeam(int64_t work, int64_t min_work_per_thread, int64_t items, int threads) {
  const int64_t budget = threads > 0 ? threads : omp_get_max_threads();
  const int64_t by_work = min_work_per_thread > 0 ? work / min_work_per_thread : budget;
  return static_cast<int>(std::max<int64_t>(1, std::min({budget, items, by_work})));
}

void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* y) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  if (w == nullptr) {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv;
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] * inv) * w[i];
  }
}

void RmsNormRows(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y) {
  for (int64_t r = 0; r < rows; ++r) RmsNorm(x + r * n, w, n, eps, y + r * n);
}

void SiluInPlace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] * Sigmoid(x[i]);
}

void SituGlu(const float* g, const float* u, int64_t n, float beta1, float beta2, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i], ui = u[i];
    const float gate = beta1 * std::tanh(gi / beta1) * Sigmoid(gi);
    const float up = beta2 * std::tanh(ui / beta2);
    out[i] = gate * up;
  }
}

void Softmax(float* x, int64_t n) {
  if (n <= 0) return;
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void L2Normalize(float* x, int64_t n, float eps, float scale) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float f = static_cast<float>(static_cast<double>(scale) / std::sqrt(ss + eps));
  for (int64_t i = 0; i < n; ++i) x[i] *= f;
}

double Dot(const float* a, const float* b, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

void Axpy(float a, const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void Add(const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void Mul(const float* x, const float* s, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * s[i];
}

void KdaStepReference(int dk, int dv, const float* q, const float* k, const float* v,
                      const float* alpha, float beta, float* S, float* o) {
  for (int i = 0; i < dk; ++i)
    for (int j = 0; j < dv; ++j) S[i * dv + j] *= alpha[i];
  std::vector<float> e(dv);
  for (int j = 0; j < dv; ++j) {
    float acc = 0.0f;
    for (int i = 0; i < dk; ++i) acc += k[i] * S[i * dv + j];
    e[j] = v[j] - acc;
  }
  for (int i = 0; i < dk; ++i)
    for (int j = 0; j < dv; ++j) S[i * dv + j] += (beta * k[i]) * e[j];
  for (int j = 0; j < dv; ++j) {
    float acc = 0.0f;
    for (int i = 0; i < dk; ++i) acc += q[i] * S[i * dv + j];
    o[j] = acc;
  }
}

void KdaStep(int dk, int dv, const float* q, const float* k, const float* v, const float* alpha,
             float beta, float* S, float* o) {
  // Row sweeps: for every j the sums over i run in index order, as in the reference.
  constexpr int kStack = 256;
  float acc_stack[kStack];
  std::vector<float> acc_heap;
  float* acc = acc_stack;
  if (dv > kStack) {
    acc_heap.resize(dv);
    acc = acc_heap.data();
  }
  for (int j = 0; j < dv; ++j) acc[j] = 0.0f;
  for (int i = 0; i < dk; ++i) {
    float* row = S + static_cast<int64_t>(i) * dv;
    const float a = alpha[i], ki = k[i];
#pragma omp simd
    for (int j = 0; j < dv; ++j) {
      row[j] *= a;
      acc[j] += ki * row[j];
    }
  }
  for (int j = 0; j < dv; ++j) {
    acc[j] = v[j] - acc[j];  // acc now holds e
    o[j] = 0.0f;
  }
  for (int i = 0; i < dk; ++i) {
    float* row = S + static_cast<int64_t>(i) * dv;
    const float bk = beta * k[i], qi = q[i];
#pragma omp simd
    for (int j = 0; j < dv; ++j) {
      row[j] += bk * acc[j];
      o[j] += qi * row[j];
    }
  }
}

void KdaStepHeads(int heads, int dk, int dv, const float* q, const float* k, const float* v,
                  const float* alpha, const float* beta, float* S, float* o, int threads) {
  const int team =
      ParallelTeam(int64_t{heads} * dk * dv, kKdaStepHeadsWorkPerThread, heads, threads);
  const auto step = [&](int h) {
    KdaStep(dk, dv, q + static_cast<int64_t>(h) * dk, k + static_cast<int64_t>(h) * dk,
            v + static_cast<int64_t>(h) * dv, alpha + static_cast<int64_t>(h) * dk, beta[h],
            S + static_cast<int64_t>(h) * dk * dv, o + static_cast<int64_t>(h) * dv);
  };
  // Without a region at all for one thread: even an if(false) region costs ~1-2 µs.
  if (team == 1) {
    for (int h = 0; h < heads; ++h) step(h);
    return;
  }
#pragma omp parallel for num_threads(team) schedule(static)
  for (int h = 0; h < heads; ++h) step(h);
}

void CausalConvStep(int64_t channels, int taps, const float* w, float* window, const float* x,
                    float* y) {
  for (int64_t c = 0; c < channels; ++c) {
    const float* wc = w + c * taps;
    float acc = 0.0f;
    for (int j = 0; j < taps - 1; ++j) acc += wc[j] * window[j * channels + c];
    acc += wc[taps - 1] * x[c];
    y[c] = acc;
  }
  for (int j = 0; j + 1 < taps - 1; ++j) {
    std::copy(window + (j + 1) * channels, window + (j + 2) * channels, window + j * channels);
  }
  if (taps > 1) std::copy(x, x + channels, window + static_cast<int64_t>(taps - 2) * channels);
}

void LatentAttention(int heads, int64_t T, int latent, int extra, int64_t stride,
                     const float* q_abs, const float* q_x, const float* cache, float scale,
                     float* ctx, int threads) {
  const int team = ParallelTeam(int64_t{heads} * T * (latent + extra),
                                kLatentAttentionWorkPerThread, heads, threads);
  // One head's scores in p[0, T), then its context.
  const auto attend = [&](int h, float* p) {
    const float* qa = q_abs + static_cast<int64_t>(h) * latent;
    const float* qx = q_x + static_cast<int64_t>(h) * extra;
    for (int64_t t = 0; t < T; ++t) {
      const float* row = cache + t * stride;
      const double s = Dot(qa, row, latent) + Dot(qx, row + latent, extra);
      p[t] = static_cast<float>(s * scale);
    }
    Softmax(p, T);
    float* out = ctx + static_cast<int64_t>(h) * latent;
    for (int d = 0; d < latent; ++d) out[d] = 0.0f;
    for (int64_t t = 0; t < T; ++t) {
      const float pt = p[t];
      const float* row = cache + t * stride;
#pragma omp simd
      for (int d = 0; d < latent; ++d) out[d] += pt * row[d];
    }
  };
  if (team == 1) {  // no region (see KdaStepHeads)
    std::vector<float> p(static_cast<size_t>(T));
    for (int h = 0; h < heads; ++h) attend(h, p.data());
    return;
  }
#pragma omp parallel num_threads(team)
  {
    std::vector<float> p(static_cast<size_t>(T));
#pragma omp for schedule(static)
    for (int h = 0; h < heads; ++h) attend(h, p.data());
  }
}

}  // namespace coli::ops

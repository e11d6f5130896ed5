// Skip-observation GAE on the CPU in one pass over the tokens: an XLA FFI custom call (target `sao_gae_f32`).
//
// The recursion of `sao.core.advantages.gae` (docs/algorithm.md), for each row, from the last token to the first,
// with `h` the state that enters token t from the right (h = γ·nextV + γλ·lastA, 0 after the last token):
//
//     A'_t = (r_t − V_t) + h,      A_t = m_t·A'_t,      R_t = m_t·(A'_t + V_t),
//     h ← m_t ? e_t + g·h : h,     e_t = γ·V_t + g·(r_t − V_t),   g = γ·λ_b.
//
// Each token is an affine map of h (h ↦ a_t·h + b_t with (a, b) = (g, e_t) on action tokens and (1, 0) on
// observation tokens), so eight tokens at a time are one vector: a reverse inclusive scan of the maps inside the
// vector (three shift-and-compose steps) gives, for every lane, the map from the state entering the block to the
// state entering that token, and the block's whole map carries h to the next block. Only that last step is serial,
// one fused multiply-add per eight tokens, so a row runs at memory speed: r, V and m are read once, A and R written
// once. The row's masked count, mean and centred sum of squares of A come out with it (the second pass over A runs
// while the row is still in cache), for whitening to merge across rows.
//
// Rows are independent; they are spread over XLA's intra-op thread pool. Leading dimensions are rows.
//
// Built at first use by `sao.kernels.build` with the host's C++ compiler (-O3 -march=native); GCC >= 12 or Clang
// (`__builtin_shufflevector`, `__builtin_convertvector`).
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

typedef float V8 __attribute__((vector_size(32)));
typedef int32_t I8 __attribute__((vector_size(32)));
typedef int8_t B8 __attribute__((vector_size(8)));

inline V8 Load(const float* p) { V8 x; std::memcpy(&x, p, sizeof(x)); return x; }
inline void Store(float* p, V8 x) { std::memcpy(p, &x, sizeof(x)); }
// XLA's PRED is one byte, 0 or 1: lanes of all ones where the token is an action token. GCC lowers the portable
// conversion to eight scalar extracts and inserts, which cost a third of the kernel's time on AVX2 hosts; one
// zero-extending load does it there.
inline I8 LoadMask(const bool* p) {
#if defined(__AVX2__)
  const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return reinterpret_cast<I8>(_mm256_sub_epi32(_mm256_setzero_si256(), bytes));
#else
  B8 b;
  std::memcpy(&b, p, sizeof(b));
  return -__builtin_convertvector(b, I8);
#endif
}
inline V8 Splat(float x) { return V8{} + x; }
inline float Sum(V8 x) { return ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7])); }

// Lane i takes lane i + D; lanes past the end take `fill`'s first lanes.
template <int D> inline V8 ShiftDown(V8 x, V8 fill) {
  if constexpr (D == 1) return __builtin_shufflevector(x, fill, 1, 2, 3, 4, 5, 6, 7, 8);
  else if constexpr (D == 2) return __builtin_shufflevector(x, fill, 2, 3, 4, 5, 6, 7, 8, 9);
  else return __builtin_shufflevector(x, fill, 4, 5, 6, 7, 8, 9, 10, 11);
}

// Composes each lane's map with the maps of the lanes after it (applied first): (a, b) then (a', b') is
// (a·a', b + a·b'), a Hillis-Steele scan towards lane 0. Past the end: the identity (1, 0).
template <int D> inline void ComposeStep(V8& a, V8& b) {
  const V8 later_a = ShiftDown<D>(a, Splat(1.0f)), later_b = ShiftDown<D>(b, V8{});
  b = b + a * later_b;
  a = a * later_a;
}

struct RowIo {
  const float* r; const float* v; const bool* m; float gamma, g;
  float* a; float* ret;  // ret may be null: returns not asked for
};

// One row of T tokens; writes A (and R) and returns (count, mean, centred sum of squares) of A over m.
void Row(const RowIo& io, int64_t T, float* moments) {
  const int64_t T8 = T - T % 8;
  float h = 0.0f;
  float tail_sum = 0.0f, tail_count = 0.0f;
  for (int64_t t = T - 1; t >= T8; --t) {  // the last T % 8 tokens, one at a time
    const float d = io.r[t] - io.v[t], adv = d + h;
    const bool act = io.m[t];
    io.a[t] = act ? adv : 0.0f;
    if (io.ret) io.ret[t] = act ? adv + io.v[t] : 0.0f;
    h = act ? io.gamma * io.v[t] + io.g * d + io.g * h : h;
    tail_sum += act ? adv : 0.0f;
    tail_count += act ? 1.0f : 0.0f;
  }
  const V8 ones = Splat(1.0f), g = Splat(io.g), gamma = Splat(io.gamma);
  V8 sum = V8{}, count = V8{};
  for (int64_t t = T8 - 8; t >= 0; t -= 8) {
    const V8 r = Load(io.r + t), v = Load(io.v + t);
    const I8 m = LoadMask(io.m + t);
    const V8 d = r - v;
    V8 a = m ? g : ones, b = m ? gamma * v + g * d : V8{};
    ComposeStep<1>(a, b);
    ComposeStep<2>(a, b);
    ComposeStep<4>(a, b);
    // The state entering token t+i is the map of lanes i+1..7 applied to h.
    const V8 entering = ShiftDown<1>(b, V8{}) + ShiftDown<1>(a, ones) * Splat(h);
    const V8 adv = d + entering;
    const V8 out = m ? adv : V8{};
    Store(io.a + t, out);
    if (io.ret) Store(io.ret + t, m ? adv + v : V8{});
    h = b[0] + a[0] * h;
    sum += out;
    count += m ? ones : V8{};
  }
  const float n = Sum(count) + tail_count;
  const float mean = n > 0.0f ? (Sum(sum) + tail_sum) / n : 0.0f;
  V8 sq = V8{};
  for (int64_t t = 0; t < T8; t += 8) {
    const V8 d = Load(io.a + t) - Splat(mean);
    sq += LoadMask(io.m + t) ? d * d : V8{};
  }
  float m2 = Sum(sq);
  for (int64_t t = T8; t < T; ++t) {
    const float d = io.a[t] - mean;
    m2 += io.m[t] ? d * d : 0.0f;
  }
  moments[0] = n;
  moments[1] = mean;
  moments[2] = m2;
}

// Rows handed out one at a time to the calling thread and up to `helpers` pool threads; the caller waits until
// every row is done (not until every task ran: a task the pool starts late finds no row left and touches nothing
// but the shared counters it keeps alive).
struct Rows {
  std::atomic<int64_t> next{0}, done{0};
  std::mutex mu;
  std::condition_variable all_done;
};

constexpr int64_t kTokensPerHelper = 1 << 16;  // below this a pool thread costs more than it saves

ffi::Error GaeF32(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> rewards, ffi::Buffer<ffi::F32> values,
                  ffi::Buffer<ffi::PRED> mask, ffi::Buffer<ffi::F32> gamma, ffi::Buffer<ffi::F32> gamma_lam,
                  ffi::ResultBuffer<ffi::F32> advantages, ffi::ResultBuffer<ffi::F32> returns,
                  ffi::ResultBuffer<ffi::F32> moments) {
  const auto dims = rewards.dimensions();
  if (dims.size() < 1) return ffi::Error::InvalidArgument("sao_gae_f32: rewards must be [..., T]");
  const int64_t T = dims.back();
  const int64_t rows = static_cast<int64_t>(gamma.element_count());
  const int64_t tokens = rows * T;
  if (static_cast<int64_t>(rewards.element_count()) != tokens ||
      static_cast<int64_t>(values.element_count()) != tokens || static_cast<int64_t>(mask.element_count()) != tokens ||
      static_cast<int64_t>(advantages->element_count()) != tokens)
    return ffi::Error::InvalidArgument("sao_gae_f32: rewards, values, mask and advantages must have one shape");
  if (static_cast<int64_t>(gamma_lam.element_count()) != rows ||
      static_cast<int64_t>(moments->element_count()) != 3 * rows)
    return ffi::Error::InvalidArgument("sao_gae_f32: gamma and gamma_lam must be [...], moments [..., 3]");
  const bool with_returns = returns->element_count() != 0;
  if (with_returns && static_cast<int64_t>(returns->element_count()) != tokens)
    return ffi::Error::InvalidArgument("sao_gae_f32: returns must have the rewards' shape, or be empty");
  if (rows == 0 || T == 0) {
    std::fill(moments->typed_data(), moments->typed_data() + 3 * rows, 0.0f);
    return ffi::Error::Success();
  }
  const float* r = rewards.typed_data();
  const float* v = values.typed_data();
  const bool* m = mask.typed_data();
  const float* gm = gamma.typed_data();
  const float* gl = gamma_lam.typed_data();
  float* a = advantages->typed_data();
  float* ret = with_returns ? returns->typed_data() : nullptr;
  float* mo = moments->typed_data();
  auto work = [=](Rows* state) {
    for (int64_t row; (row = state->next.fetch_add(1)) < rows;) {
      const int64_t o = row * T;
      Row(RowIo{r + o, v + o, m + o, gm[row], gl[row], a + o, ret ? ret + o : nullptr}, T, mo + 3 * row);
      if (state->done.fetch_add(1) + 1 == rows) {
        std::lock_guard<std::mutex> lock(state->mu);
        state->all_done.notify_all();
      }
    }
  };
  auto state = std::make_shared<Rows>();
  const int64_t helpers = std::min<int64_t>({pool.num_threads(), rows, tokens / kTokensPerHelper + 1}) - 1;
  for (int64_t i = 0; i < helpers; ++i) pool.Schedule([work, state] { work(state.get()); });
  work(state.get());
  std::unique_lock<std::mutex> lock(state->mu);
  state->all_done.wait(lock, [&] { return state->done.load() == rows; });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SaoGaeF32, GaeF32,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // rewards [..., T]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // values [..., T]
                                  .Arg<ffi::Buffer<ffi::PRED>>()  // action mask [..., T]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // gamma [...]
                                  .Arg<ffi::Buffer<ffi::F32>>()   // gamma * lambda [...]
                                  .Ret<ffi::Buffer<ffi::F32>>()   // advantages [..., T]
                                  .Ret<ffi::Buffer<ffi::F32>>()   // returns [..., T], or [0]: not written
                                  .Ret<ffi::Buffer<ffi::F32>>()); // (count, mean, M2) of A per row [..., 3]

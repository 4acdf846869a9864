// CPU kernels: Attention (torch's scaled_dot_product_attention) and AttentionGrad.
//
//   Attention(Q [..., Hq, Lq, E], K [..., Hk, Lk, E], V [..., Hk, Lk, Ev], mask?)
//     -> (Y [..., Hq, Lq, Ev], LSE [..., Hq, Lq], seed)
//
// Hq a multiple of Hk (grouped-query heads: query head h reads key/value head h / (Hq / Hk)).
// mask: bool (true = attend) or float (added to the scores), broadcast to [..., Hq, Lq, Lk].
// Attributes: scale (default 1/sqrt(E)), causal (top-left aligned, as torch), dropout (p), and
// heads_inside (1: Q, K, V, Y and their gradients are [..., L, H, E], the layout a projection
// writes before the heads are transposed out, read and written through strides; LSE and the mask
// keep the [..., H, Lq(, Lk)] layout), packed with heads (1: one X [..., L, 3 H E] holds Q, K and
// V side by side in each row, a fused projection's output; Y is [..., L, H, E], the gradient is
// one dX). Packed, an optional input 4 is the projection's bias [3 H E], X's rows taken as X + bias
// (recognize_attention folds the projection's bias Add into the Attention: X is neither written
// with the bias nor read twice). kv_bias_free: the bias costs no copy of the keys
// or values. The keys' bias adds q_r . b_k to all of row r's scores, which the softmax cancels (and
// the rows of dS sum to zero, so dQ = dS K takes nothing from it either), so it is left out (the
// log-sum-exp it keeps for the backward leaves it out the same way); the values' adds b_v to every
// output row, since P's rows sum to 1 (rows that see nothing stay zero), and dP = dY V^T without
// it differs by a constant per row, which dS = P (dP - D) cancels when D = rowsum(dY (Y - b_v)).
// With dropout P's rows no longer sum to 1: the values are copied with their bias. The queries'
// bias is added to their transposed copy (forward) or a copy of their rows (backward).
//
// A thread works on a tile of kTileQ (16) query rows at a time and holds the tile's scores for
// every key a row of it may see, transposed: one column of 16 rows per key (S^T = K Q^T), so a
// row's max and sum are lane-wise operations down the columns (vec_attention_softmax_t), with no
// per-row reduction or call, and the T x T probabilities never exist. The backward recomputes the
// probabilities from LSE (the log-sum-exp of each row's scores) in the same transposed tiles,
// unless the forward kept them: for short sequences (kMaxKeptScores scores a head or fewer) a
// training forward writes each tile's probabilities to its output 3, P (a tile of kTileQ rows and
// Lk columns per (batch, head, tile); only the visible columns are written or read), and the
// backward reads them there instead of recomputing S = Q K^T and the exponentials. Longer ones
// keep P empty: its memory would grow with L^2. A fully masked row gives zeros, as torch does.
// Dropout masks come from a counter-based generator keyed by `seed` and the element's (batch, head,
// row, column), so the backward regenerates them.
//
// Each tile computes only the keys up to the last one a row of it may see (causal, or a mask
// whose trailing keys are masked out for these rows: a causal or padding mask), so a causal
// product does about 5/8 of the work. The per-tile products are register-tiled small GEMMs
// (vec_small_gemm) over blocks that sit in L1/L2, reading Q transposed (made once per block of
// queries) and P or dS through their transposes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include "kernels/cpu/common.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/random.h"
#include "kernels/cpu/vec_dispatch.h"
#include "kernels/cpu/vec_math.h"

namespace graphtrain::cpu {
namespace {

constexpr int64_t kBlockQ = 64;                 // query rows of a forward task
constexpr int64_t kTileQ = kAttentionTileRows;  // query rows of one tile of scores
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// The forward keeps the probabilities for the backward when a head's padded tiles hold at most
// this many scores (sequences up to 128: 64 KiB a head).
constexpr int64_t kMaxKeptScores = 128 * 128;

inline bool keep(uint64_t key, uint64_t index, float p) {
  return uniform(key, index) >= p;
}

// dst[r * cols + c] = src[r * ld + c] + bias[c]: rows of one head of a packed X with the fused
// projection's bias added, contiguous (the same single rounding as the Add it replaces).
void add_bias_rows(const float* src, int64_t ld, int64_t rows, int64_t cols, const float* bias,
                   float* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = src[r * ld + c] + bias[c];
}

// p[r * ld + c] = 0 for r < rows, c < cols, with vector stores: rows of a head's gradient (32 or
// 64 floats) are too short for a memset call to pay.
// The zero comes from a volatile read, or GCC turns the loop back into memset calls.
volatile float zero_value = 0.0f;
void zero_rows(float* p, int64_t rows, int64_t cols, int64_t ld) {
  const vec::f8 zero = vec::splat(zero_value);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = p + r * ld;
    int64_t c = 0;
    for (; c + 8 <= cols; c += 8) vec::store(row + c, zero);
    for (; c < cols; ++c) row[c] = zero[0];
  }
}

// Copies n floats (a multiple of 8; dst 32-byte aligned) with non-temporal stores: the kept
// probabilities are read by the backward, long after the cache has moved on, so writing them
// around the cache saves reading each line before it is written.
void stream_copy(float* dst, const float* src, int64_t n) {
#if defined(__AVX__)
  for (int64_t i = 0; i < n; i += 8) _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
#else
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
#endif
}
void stream_fence() {
#if defined(__AVX__)
  _mm_sfence();
#endif
}

// Reads n floats, one per cache line, in order. A head's rows are a few lines out of each row of
// the batch's block (2 out of 24 in a packed X of width 128), and read cold in that pattern, each
// row waits on its own misses: the hardware prefetcher does not run ahead of it. Read in order,
// the block streams in at the memory's bandwidth. In gpt's training step at 1 thread this took
// AttentionGrad from 2.3-2.5 to 1.5-1.7 ms and Attention from 1.2-1.6 to 1.0-1.15 ms.
thread_local volatile float touch_sink = 0;  // the loads are kept; a thread writes its own
void touch(const float* p, int64_t n) {
  float acc = 0;
  for (int64_t i = 0; i < n; i += 16) acc += p[i];
  touch_sink = acc;
}
// Batch blocks are touched only while they fit in half of a core's L2 together.
constexpr int64_t kTouchBytes = 512 << 10;

// t[c * ld + j] += bias[c] for c < rows, j < cols: the bias of a transposed block (keys or values
// as columns).
void add_bias_transposed(float* t, int64_t ld, int64_t rows, int64_t cols, const float* bias) {
  for (int64_t c = 0; c < rows; ++c)
    for (int64_t j = 0; j < cols; ++j) t[c * ld + j] += bias[c];
}

// Where one operand's heads are: head h of batch b starts at element at(b, h), and its rows are
// `row` elements apart.
struct Operand {
  int64_t base = 0, batch = 0, head = 0, row = 0;
  int64_t at(int64_t b, int64_t h) const { return base + b * batch + h * head; }
};

// The geometry of one call, shared by the forward and backward kernels.
struct Geometry {
  int64_t batch = 1;  // product of the batch dims
  int64_t hq = 1, hk = 1, lq = 0, lk = 0, e = 0, ev = 0;
  float scale = 1, dropout = 0;
  bool causal = false;
  Operand oq, ok, ov, oy;  // Q and dQ, K and dK, V and dV, Y and dY
  Shape rows;              // LSE's shape: [batch..., Hq, Lq] ([Lq] without heads)
  // The mask (may be absent), with element strides over (batch, head, row, column); 0 where
  // broadcast.
  const void* mask = nullptr;
  bool mask_bool = false;
  // Packed: the projection's bias [3 D] (input 4 of Attention, 8 of AttentionGrad), or null.
  const float* bias = nullptr;
  // The bias of operand o's head h: packed rows hold Q, K, V at columns base + h * head.
  const float* bias_of(const Operand& o, int64_t h) const { return bias + o.base + h * o.head; }
  int64_t m_b = 0, m_h = 0, m_q = 0, m_k = 0;
  uint64_t key = 0;
  // With a mask: for each tile of kTileQ query rows (and each batch and head the mask varies
  // over), one past the last key a row of the tile may see.
  std::vector<int64_t> ends;
  int64_t tiles = 0;
  // A mask the same for every batch and head, as addends, transposed: mask_cols[c * lq_pad + r]
  // for key c, query row r (rows padded to a multiple of kTileQ with zeros).
  std::vector<float> mask_cols;
  int64_t lq_pad = 0;

  int64_t group() const { return hq / hk; }
  // Floats of batch b's Q, K and V blocks (packed: one X block holds all three), and a read of
  // them in order (see touch).
  int64_t qkv_floats(bool packed) const { return oq.batch + (packed ? 0 : ok.batch + ov.batch); }
  void touch_qkv(int64_t b, const float* q, const float* k, const float* v, bool packed) const {
    touch(q + oq.at(b, 0), oq.batch);
    if (!packed) {
      touch(k + ok.at(b, 0), ok.batch);
      touch(v + ov.at(b, 0), ov.batch);
    }
  }
  // The kept probabilities (Attention's output 3): their size, 0 where the sequence is too long,
  // and the offset of the tile of query rows from q0 of batch b, head h.
  int64_t kept_scores() const {
    return lq_pad * lk <= kMaxKeptScores ? batch * hq * lq_pad * lk : 0;
  }
  int64_t kept_tile(int64_t b, int64_t h, int64_t q0) const {
    return ((b * hq + h) * lq_pad + q0) * lk;
  }
  // Keys a query row may see: all, or (causal) up to its own position.
  int64_t key_end(int64_t row_end) const { return causal ? std::min(lk, row_end) : lk; }

  bool masked_out(int64_t b, int64_t h, int64_t row, int64_t col) const {
    return addend(b, h, row, col) == kNegInf;
  }
  // Fills `ends` (run once per call: the mask usually broadcasts over batch and heads).
  void find_mask_ends(ThreadPool& pool) {
    tiles = (lq + kTileQ - 1) / kTileQ;
    int64_t nb = m_b ? batch : 1, nh = m_h ? hq : 1;
    ends.assign(static_cast<size_t>(nb * nh * tiles), 0);
    pool.parallel_for(nb * nh * tiles, 16, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        int64_t b = i / (nh * tiles), h = i / tiles % nh, q0 = i % tiles * kTileQ;
        int64_t q1 = std::min(lq, q0 + kTileQ), end = 0;
        for (int64_t c = key_end(q1) - 1; c >= 0 && end == 0; --c)
          for (int64_t r = q0; r < q1; ++r)
            if (!masked_out(b, h, r, c)) {
              end = c + 1;
              break;
            }
        ends[static_cast<size_t>(i)] = end;
      }
    });
  }
  // One past the last key a row of [q0, q0 + nq) may see (q0 a multiple of kTileQ).
  int64_t visible_end(int64_t b, int64_t h, int64_t q0, int64_t nq) const {
    if (!mask) return key_end(q0 + nq);
    int64_t end = 0;
    int64_t base = ((m_b ? b : 0) * (m_h ? hq : 1) + (m_h ? h : 0)) * tiles;
    for (int64_t t = q0 / kTileQ; t * kTileQ < q0 + nq; ++t)
      end = std::max(end, ends[static_cast<size_t>(base + t)]);
    return end;
  }

  // The mask as an addend: 0 (bool true) or -inf (bool false), or the float mask's value.
  float addend(int64_t b, int64_t h, int64_t row, int64_t col) const {
    int64_t i = b * m_b + h * m_h + row * m_q + col * m_k;
    return mask_bool ? (static_cast<const bool*>(mask)[i] ? 0.0f : kNegInf)
                     : static_cast<const float*>(mask)[i];
  }
  // Fills mask_cols when the mask is the same for every batch and head (run once per call).
  void transpose_mask(ThreadPool& pool) {
    lq_pad = (lq + kTileQ - 1) / kTileQ * kTileQ;
    if (!mask || m_b != 0 || m_h != 0) return;
    mask_cols.assign(static_cast<size_t>(lk * lq_pad), 0.0f);
    pool.parallel_for(lk, 64, [&](int64_t lo, int64_t hi) {
      for (int64_t c = lo; c < hi; ++c)
        for (int64_t r = 0; r < lq; ++r)
          mask_cols[static_cast<size_t>(c * lq_pad + r)] = addend(0, 0, r, c);
    });
  }
  // The mask's columns for the tile of query rows [q0, q0 + nr) of batch b, head h, and keys
  // [0, cols) as vec_attention_softmax_t reads them (column c at c * ld), or null without a
  // mask: a view of mask_cols, else built in `scratch` (cols * kTileQ floats).
  const float* tile_mask(int64_t b, int64_t h, int64_t q0, int64_t nr, int64_t cols, float* scratch,
                         int64_t& ld) const {
    if (!mask) return nullptr;
    if (!mask_cols.empty()) {
      ld = lq_pad;
      return mask_cols.data() + q0;
    }
    ld = kTileQ;
    if (m_q == 0) {  // one value per key (a padding mask): each column filled with it
      for (int64_t c = 0; c < cols; ++c)
        std::fill(scratch + c * kTileQ, scratch + (c + 1) * kTileQ, addend(b, h, q0, c));
    } else if (!mask_bool && m_k == 1) {  // rows of a float mask: transposed in registers
      transpose_matrix(static_cast<const float*>(mask) + b * m_b + h * m_h + q0 * m_q, nr, cols,
                       m_q, scratch, kTileQ);
    } else {
      for (int64_t c = 0; c < cols; ++c)
        for (int64_t r = 0; r < nr; ++r) scratch[c * kTileQ + r] = addend(b, h, q0 + r, c);
    }
    return scratch;
  }

  uint64_t element(int64_t b, int64_t h, int64_t row, int64_t col) const {
    return static_cast<uint64_t>(((b * hq + h) * lq + row) * lk + col);
  }
};

// Q, K and V: three tensors, or (attribute packed) q alone, [..., L, 3 D] holding them side by
// side in each row (a fused projection's output), with attribute heads.
Geometry geometry(KernelContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor* mask, const Tensor* bias) {
  Geometry g;
  const Node& n = ctx.node();
  size_t r = q.rank();
  Shape batch_dims;
  if (n.attr_int("packed", 0) != 0) {
    int64_t heads = n.attr_int("heads", 0), width = r >= 2 ? q.dim(r - 1) : 0;
    if (r < 2 || heads <= 0 || width % (3 * heads) != 0)
      ctx.fail(str_cat("packed Q, K and V must be [..., L, 3 * heads * E] with heads (", heads,
                       ") >= 1; got ", q.shape()));
    batch_dims.assign(q.shape().begin(), q.shape().end() - 2);
    g.hq = g.hk = heads;
    g.lq = g.lk = q.dim(r - 2);
    g.e = g.ev = width / (3 * heads);
    int64_t d = width / 3;
    g.oq = {0, g.lq * width, g.e, width};
    g.ok = {d, g.lq * width, g.e, width};
    g.ov = {2 * d, g.lq * width, g.e, width};
    g.oy = {0, g.lq * d, g.e, d};  // Y [..., L, H, E]
    if (bias) {
      if (bias->dtype() != F32 || bias->numel() != width)
        ctx.fail(str_cat("the qkv bias must be float32 with ", width,
                         " elements (X's last dim), got ", bias->describe()));
      g.bias = bias->data<float>();
    }
  } else {
    if (bias) ctx.fail("a qkv bias (Attention's input 4) needs packed=1");
    bool inside = n.attr_int("heads_inside", 0) != 0;
    if (r < (inside ? 3u : 2u) || k.rank() != r || v.rank() != r)
      ctx.fail(str_cat("Q, K and V must have the same rank, ", inside ? 3 : 2, " or more; got ",
                       q.shape(), ", ", k.shape(), ", ", v.shape()));
    for (size_t i = 0; i + 3 < r; ++i) {
      if (k.dim(i) != q.dim(i) || v.dim(i) != q.dim(i))
        ctx.fail(str_cat("Q, K and V must have the same batch dims; got ", q.shape(), ", ",
                         k.shape(), ", ", v.shape()));
      batch_dims.push_back(q.dim(i));
    }
    // The dims (heads, rows) of the layout: [..., H, L, D] or [..., L, H, D].
    size_t hd = inside ? r - 2 : r - 3, ld = inside ? r - 3 : r - 2;
    g.hq = r >= 3 ? q.dim(hd) : 1;
    g.hk = r >= 3 ? k.dim(hd) : 1;
    g.lq = q.dim(ld);
    g.lk = k.dim(ld);
    g.e = q.dim(r - 1);
    g.ev = v.dim(r - 1);
    if (k.dim(r - 1) != g.e || v.dim(ld) != g.lk || (r >= 3 && v.dim(hd) != g.hk))
      ctx.fail(str_cat("K and V do not fit Q: ", q.shape(), ", ", k.shape(), ", ", v.shape()));
    if (g.hk == 0 || g.hq % g.hk != 0)
      ctx.fail(
          str_cat("query heads (", g.hq, ") must be a multiple of key/value heads (", g.hk, ")"));
    auto layout = [inside](int64_t heads, int64_t len, int64_t d) {
      return inside ? Operand{0, len * heads * d, d, heads * d}
                    : Operand{0, heads * len * d, len * d, d};
    };
    g.oq = layout(g.hq, g.lq, g.e);
    g.ok = layout(g.hk, g.lk, g.e);
    g.ov = layout(g.hk, g.lk, g.ev);
    g.oy = layout(g.hq, g.lq, g.ev);
  }
  for (int64_t d : batch_dims) g.batch *= d;
  g.rows = batch_dims;
  if (r >= 3 || n.attr_int("packed", 0) != 0) g.rows.push_back(g.hq);
  g.rows.push_back(g.lq);
  g.scale = n.attr_float("scale", 0.0f);
  if (g.scale == 0.0f) g.scale = 1.0f / std::sqrt(static_cast<float>(std::max<int64_t>(g.e, 1)));
  g.causal = n.attr_int("causal", 0) != 0;
  g.dropout = n.attr_float("dropout", 0.0f);
  if (mask) {
    if (mask->dtype() != DType::kBool && mask->dtype() != DType::kFloat32)
      ctx.fail("the mask must be bool or float32, not " + std::string(to_string(mask->dtype())));
    // Right-aligned broadcast against the scores [batch..., Hq, Lq, Lk].
    Shape full = g.rows;
    full.push_back(g.lk);
    if (mask->rank() > full.size())
      ctx.fail(str_cat("the mask ", mask->shape(), " has more dims than the scores ", full));
    std::vector<int64_t> st = contiguous_strides(mask->shape());
    std::vector<int64_t> strides(full.size(), 0);
    size_t off = full.size() - mask->rank();
    for (size_t i = 0; i < mask->rank(); ++i) {
      int64_t d = mask->dim(i);
      if (d != 1 && d != full[off + i])
        ctx.fail(str_cat("the mask ", mask->shape(), " does not broadcast to the scores ", full));
      strides[off + i] = d == 1 ? 0 : st[i];
    }
    size_t fr = full.size();
    g.m_k = strides[fr - 1];
    g.m_q = strides[fr - 2];
    g.m_h = fr >= 3 ? strides[fr - 3] : 0;
    // The batch dims: all broadcast, or all present (then one stride steps the flat batch index).
    size_t nb = fr >= 3 ? fr - 3 : 0;
    bool any = false, all = true;
    for (size_t i = 0; i < nb; ++i) {
      if (strides[i] != 0)
        any = true;
      else if (full[i] != 1)
        all = false;
    }
    if (any && !all) ctx.fail("the mask must broadcast over all batch dims or none");
    g.m_b = any ? strides[nb - 1] : 0;
    g.mask = mask->raw_data();
    g.mask_bool = mask->dtype() == DType::kBool;
    g.find_mask_ends(ctx.pool());
  }
  g.transpose_mask(ctx.pool());
  return g;
}

class AttentionKernel : public OpKernel {
 public:
  explicit AttentionKernel(const Node&) : seed_(fresh_seed()) {}

  void compute(KernelContext& ctx) override {
    bool packed = ctx.node().attr_int("packed", 0) != 0;
    const Tensor& q = ctx.input(0);
    const Tensor& k = packed ? q : ctx.input(1);
    const Tensor& v = packed ? q : ctx.input(2);
    const Tensor* mask = ctx.has_input(3) ? &ctx.input(3) : nullptr;
    Geometry g = geometry(ctx, q, k, v, mask, ctx.has_input(4) ? &ctx.input(4) : nullptr);
    g.key = g.dropout > 0 ? mix(seed_ ^ mix(calls_++)) : 0;
    Shape ys = q.shape();
    ys.back() = g.ev;
    if (packed) {  // [..., L, 3 D] -> [..., L, H, E]
      ys.back() = g.hq;
      ys.push_back(g.ev);
    }
    Tensor& y = ctx.allocate_output(0, F32, ys);
    Tensor& lse = ctx.allocate_output(1, F32, g.rows);
    if (ctx.output_requested(2))
      ctx.set_output(2, Tensor::scalar_int64(static_cast<int64_t>(g.key)));
    float* kept = nullptr;  // the probabilities kept for the backward (training), or null
    if (ctx.output_requested(3)) {
      Tensor& pt = ctx.allocate_output(3, F32, {g.kept_scores()});
      if (pt.numel() > 0) kept = pt.data<float>();
    }
    const float* pq = q.data<float>();
    const float* pk = k.data<float>();
    const float* pv = v.data<float>();
    float* py = y.data<float>();
    float* pl = lse.data<float>();
    int64_t qblocks = (g.lq + kBlockQ - 1) / kBlockQ;
    float drop_scale = g.dropout < 1.0f ? 1.0f / (1.0f - g.dropout) : 0.0f;
    int64_t tasks = g.batch * g.hq * qblocks;
    const bool touch_batch = g.qkv_floats(packed) * 4 <= kTouchBytes;
    parallel_for(ctx, tasks, kBlockQ * g.lk * (g.e + g.ev), [&](int64_t t0, int64_t t1) {
      // A tile's scores, transposed (one column of kTileQ rows per key), and the block's queries,
      // transposed ([e, kBlockQ]).
      std::vector<float> st(static_cast<size_t>(g.lk * kTileQ)),
          qt(static_cast<size_t>(g.e * kBlockQ));
      std::vector<float> mask_scratch(g.mask && g.mask_cols.empty() ? st.size() : 0);
      // With a bias and dropout: the head's values, biased (contiguous rows).
      std::vector<float> vb(g.bias && g.dropout > 0 ? static_cast<size_t>(g.lk * g.ev) : 0);
      for (int64_t t = t0; t < t1; ++t) {
        int64_t b = t / (g.hq * qblocks), h = t / qblocks % g.hq, qb_index = t % qblocks;
        int64_t q0 = qb_index * kBlockQ, nq = std::min(kBlockQ, g.lq - q0);
        int64_t hk = h / g.group();
        if (touch_batch && (t == t0 || (h == 0 && qb_index == 0)))  // batch b's first task
          g.touch_qkv(b, pq, pk, pv, packed);
        const float* krows = pk + g.ok.at(b, hk);
        const float* vrows = pv + g.ov.at(b, hk);
        int64_t ldk = g.ok.row, ldv = g.ov.row;
        float* yp = py + g.oy.at(b, h);
        float* lp = pl + (b * g.hq + h) * g.lq;
        int64_t kend = g.visible_end(b, h, q0, nq);
        transpose_matrix(pq + g.oq.at(b, h) + q0 * g.oq.row, nq, g.e, g.oq.row, qt.data(), kBlockQ);
        // The bias (see kv_bias_free): the queries' on their transposed copy, the keys' nowhere,
        // the values' on each output row (with dropout, on a copy of the values).
        if (g.bias) {
          add_bias_transposed(qt.data(), kBlockQ, g.e, nq, g.bias_of(g.oq, h));
          if (g.dropout > 0) {
            add_bias_rows(vrows, ldv, kend, g.ev, g.bias_of(g.ov, hk), vb.data());
            vrows = vb.data();
            ldv = g.ev;
          }
        }
        const float* y_bias = g.bias && g.dropout == 0 ? g.bias_of(g.ov, hk) : nullptr;
        for (int64_t r0 = 0; r0 < nq; r0 += kTileQ) {
          int64_t nr = std::min(kTileQ, nq - r0), cols = g.visible_end(b, h, q0 + r0, nr);
          float* yrows = yp + (q0 + r0) * g.oy.row;
          if (cols <= 0) {  // these rows see nothing: zeros, as torch gives
            zero_rows(yrows, nr, g.ev, g.oy.row);
            std::fill(lp + q0 + r0, lp + q0 + r0 + nr, kNegInf);
            continue;
          }
          // S^T = K Q^T for the tile's rows (and the block's next rows, as padding: hidden).
          vec_small_gemm(cols, kTileQ, g.e, g.scale, krows, ldk, 1, qt.data() + r0, kBlockQ, false,
                         st.data(), kTileQ);
          int64_t ld_mask = 0;
          const float* mcols = g.tile_mask(b, h, q0 + r0, nr, cols, mask_scratch.data(), ld_mask);
          vec_attention_softmax_t(st.data(), cols, nr, mcols, ld_mask, g.causal ? q0 + r0 : -1,
                                  lp + q0 + r0);
          if (kept)  // before dropout: the backward regenerates its mask
            stream_copy(kept + g.kept_tile(b, h, q0 + r0), st.data(), cols * kTileQ);
          if (g.dropout > 0)
            for (int64_t c = 0; c < cols; ++c)
              for (int64_t r = 0; r < nr; ++r) {
                float& x = st[static_cast<size_t>(c * kTileQ + r)];
                x = keep(g.key, g.element(b, h, q0 + r0 + r, c), g.dropout) ? x * drop_scale : 0.0f;
              }
          // Y = P V (+ the values' bias: P's rows sum to 1), P read through its transpose.
          if (y_bias)
            for (int64_t r = 0; r < nr; ++r) std::copy(y_bias, y_bias + g.ev, yrows + r * g.oy.row);
          vec_small_gemm(nr, g.ev, cols, 1.0f, st.data(), 1, kTileQ, vrows, ldv, y_bias != nullptr,
                         yrows, g.oy.row);
          if (y_bias)  // a row that sees nothing (a mask's) stays zero, as without the bias
            for (int64_t r = 0; r < nr; ++r)
              if (lp[q0 + r0 + r] == kNegInf) zero_rows(yrows + r * g.oy.row, 1, g.ev, g.oy.row);
        }
      }
      if (kept) stream_fence();  // the streamed stores are visible before the task ends
    });
  }

 private:
  uint64_t seed_ = 0;
  uint64_t calls_ = 0;
};

// AttentionGrad(dY, Q, K, V, Y, LSE, mask?, seed?, -, P?) -> (dQ, dK, dV, dMask?); packed: (dY, X,
// -, -, Y, ..., qkv bias?, P?) -> (dX, -, -, dMask?), the bias at input 8. P (input 9): the
// probabilities the forward kept (its output 3); absent or empty, they are recomputed. One task per
// (batch, key/value head): it owns dK and dV of that head and dQ of the query heads reading it, so
// no two tasks write one element and every sum runs in a fixed order.
void attention_grad(KernelContext& ctx) {
  bool packed = ctx.node().attr_int("packed", 0) != 0;
  const Tensor& dy = ctx.input(0);
  const Tensor& q = ctx.input(1);
  const Tensor& k = packed ? q : ctx.input(2);
  const Tensor& v = packed ? q : ctx.input(3);
  const Tensor& y = ctx.input(4);
  const Tensor& lse = ctx.input(5);
  const Tensor* mask = ctx.has_input(6) ? &ctx.input(6) : nullptr;
  Geometry g = geometry(ctx, q, k, v, mask, ctx.has_input(8) ? &ctx.input(8) : nullptr);
  g.key = ctx.has_input(7) ? static_cast<uint64_t>(ctx.input(7).to_int64_vector()[0]) : 0;
  const float* kept = nullptr;
  if (ctx.has_input(9) && ctx.input(9).numel() > 0) {
    const Tensor& p = ctx.input(9);
    if (p.numel() != g.kept_scores())
      ctx.fail(str_cat("P (input 9) must hold the ", g.kept_scores(),
                       " probabilities Attention kept for these shapes, got ", p.describe()));
    kept = p.data<float>();
  }
  Tensor& dq = ctx.allocate_output(0, F32, q.shape());
  Tensor& dk = packed ? dq : ctx.allocate_output(1, F32, k.shape());
  Tensor& dv = packed ? dq : ctx.allocate_output(2, F32, v.shape());
  // dMask (only when a float mask wants a gradient): the score gradients, [..., Hq, Lq, Lk].
  float* pdm = nullptr;
  if (ctx.output_requested(3)) {
    Shape ms = g.rows;
    ms.push_back(g.lk);
    Tensor& dm = ctx.allocate_output(3, F32, ms);
    std::memset(dm.raw_data(), 0, dm.nbytes());
    pdm = dm.data<float>();
  }
  const float *pq = q.data<float>(), *pk = k.data<float>(), *pv = v.data<float>();
  const float *pdy = dy.data<float>(), *py = y.data<float>(), *pl = lse.data<float>();
  float *pdq = dq.data<float>(), *pdk = dk.data<float>(), *pdv = dv.data<float>();
  float drop_scale = g.dropout < 1.0f ? 1.0f / (1.0f - g.dropout) : 0.0f;
  const bool touch_batch = (g.qkv_floats(packed) + 2 * g.oy.batch) * 4 <= kTouchBytes;
  const int64_t ldq = g.oq.row, ldk = g.ok.row, ldv = g.ov.row, ldy = g.oy.row;
  constexpr size_t kR = kTileQ;
  parallel_for(
      ctx, g.batch * g.hk, g.group() * g.lq * g.lk * (g.e + g.ev) * 4, [&](int64_t t0, int64_t t1) {
        // One tile's P^T and dP^T (then dS^T), a column of kTileQ rows per key; dY and Y of the
        // tile transposed; the query head's Q transposed ([e, lq_pad]), where P is recomputed.
        std::vector<float> pt(static_cast<size_t>(g.lk) * kR), dpt(pt.size()), pdrop;
        std::vector<float> dyt(static_cast<size_t>(g.ev) * kR), yt(dyt.size());
        std::vector<float> qt(kept ? 0 : static_cast<size_t>(g.e * g.lq_pad)), mask_scratch;
        if (g.mask && g.mask_cols.empty()) mask_scratch.resize(pt.size());
        if (g.dropout > 0) pdrop.resize(pt.size());
        alignas(64) float d[kR], lse16[kR];
        int64_t zeroed_batch = -1;  // the batch whose gradient block this chunk zeroed
        // With a bias: each query head's queries, biased, and with dropout the head's values.
        std::vector<float> vb(g.bias && g.dropout > 0 ? static_cast<size_t>(g.lk * g.ev) : 0);
        std::vector<float> qb(g.bias ? static_cast<size_t>(g.lq * g.e) : 0);
        for (int64_t t = t0; t < t1; ++t) {
          int64_t b = t / g.hk, hk = t % g.hk;
          if (touch_batch && (t == t0 || hk == 0)) {  // batch b's first task: its stash, cold
            g.touch_qkv(b, pq, pk, pv, packed);
            touch(py + g.oy.at(b, 0), g.oy.batch);
            touch(pdy + g.oy.at(b, 0), g.oy.batch);
          }
          const float* krows = pk + g.ok.at(b, hk);
          const float* vrows = pv + g.ov.at(b, hk);
          int64_t ldv_in = ldv;  // the stride of the values read
          // The bias (see kv_bias_free): the keys' nowhere; the values' in D (below), or with
          // dropout on a copy of the values; the queries' on a copy of each query head's rows.
          const float* v_bias = g.bias && g.dropout == 0 ? g.bias_of(g.ov, hk) : nullptr;
          if (g.bias && g.dropout > 0) {
            add_bias_rows(vrows, ldv, g.lk, g.ev, g.bias_of(g.ov, hk), vb.data());
            vrows = vb.data();
            ldv_in = g.ev;
          }
          float* dkp = pdk + g.ok.at(b, hk);
          float* dvp = pdv + g.ov.at(b, hk);
          // This task's slices of dK and dV are summed into from zero. A chunk holding all of
          // batch b's tasks zeroes the batch's block of the gradients in order at its first task
          // (stores to the strided rows of a cold block would each wait on their lines, as reads
          // do: see touch); otherwise each task zeroes its own slices.
          if (touch_batch && hk == 0 && t + g.hk <= t1) {
            std::memset(pdq + g.oq.at(b, 0), 0, static_cast<size_t>(g.oq.batch) * sizeof(float));
            if (!packed) {
              std::memset(pdk + g.ok.at(b, 0), 0, static_cast<size_t>(g.ok.batch) * sizeof(float));
              std::memset(pdv + g.ov.at(b, 0), 0, static_cast<size_t>(g.ov.batch) * sizeof(float));
            }
            zeroed_batch = b;
          }
          if (zeroed_batch != b) {
            zero_rows(dkp, g.lk, g.e, ldk);
            zero_rows(dvp, g.lk, g.ev, ldv);
          }
          for (int64_t h = hk * g.group(); h < (hk + 1) * g.group(); ++h) {
            const float* qrows = pq + g.oq.at(b, h);
            int64_t ldq_in = ldq;
            if (g.bias) {
              add_bias_rows(qrows, ldq, g.lq, g.e, g.bias_of(g.oq, h), qb.data());
              qrows = qb.data();
              ldq_in = g.e;
            }
            if (!kept) transpose_matrix(qrows, g.lq, g.e, ldq_in, qt.data(), g.lq_pad);
            const float* dyp = pdy + g.oy.at(b, h);
            const float* yp = py + g.oy.at(b, h);
            const float* lp = pl + (b * g.hq + h) * g.lq;
            float* dqp = pdq + g.oq.at(b, h);
            int64_t rows = (b * g.hq + h) * g.lq;  // the head's first row in LSE and dMask
            for (int64_t q0 = 0; q0 < g.lq; q0 += kTileQ) {
              int64_t nr = std::min(kTileQ, g.lq - q0), cols = g.visible_end(b, h, q0, nr);
              if (cols <= 0) {  // rows that see nothing have no gradient
                zero_rows(dqp + q0 * ldq, nr, g.e, ldq);
                continue;
              }
              // P^T: as the forward kept it, or exp(S^T - LSE), 0 where hidden.
              const float* p = kept ? kept + g.kept_tile(b, h, q0) : pt.data();
              if (!kept) {
                vec_small_gemm(cols, kTileQ, g.e, g.scale, krows, ldk, 1, qt.data() + q0, g.lq_pad,
                               false, pt.data(), kTileQ);
                std::fill(lse16, lse16 + kR, 0.0f);
                std::copy(lp + q0, lp + q0 + nr, lse16);
                int64_t ld_mask = 0;
                const float* mcols = g.tile_mask(b, h, q0, nr, cols, mask_scratch.data(), ld_mask);
                vec_attention_exp_t(pt.data(), cols, nr, mcols, ld_mask, g.causal ? q0 : -1, lse16);
              }
              // dY and Y of the tile, transposed (padding rows zero), and D = rowsum(dY * Y), Y
              // without the values' bias where dP leaves it out.
              if (nr < kTileQ) {
                std::fill(dyt.begin(), dyt.end(), 0.0f);
                std::fill(yt.begin(), yt.end(), 0.0f);
              }
              transpose_matrix(dyp + q0 * ldy, nr, g.ev, ldy, dyt.data(), kTileQ);
              transpose_matrix(yp + q0 * ldy, nr, g.ev, ldy, yt.data(), kTileQ);
              for (size_t r = 0; r < kR; r += 8) {
                vec::f8 acc{};
                for (size_t j = 0; j < static_cast<size_t>(g.ev); ++j) {
                  vec::f8 yj = vec::load(yt.data() + j * kR + r);
                  if (v_bias) yj -= v_bias[j];
                  acc += vec::load(dyt.data() + j * kR + r) * yj;
                }
                vec::store(d + r, acc);
              }
              // dP^T = V dY^T.
              vec_small_gemm(cols, kTileQ, g.ev, 1.0f, vrows, ldv_in, 1, dyt.data(), kTileQ, false,
                             dpt.data(), kTileQ);
              const float* p_used = p;  // the probabilities dV takes
              if (g.dropout > 0) {
                // dV takes the dropped probabilities; dP reaches P through the same mask.
                for (int64_t c = 0; c < cols; ++c)
                  for (int64_t r = 0; r < kTileQ; ++r) {
                    size_t i = static_cast<size_t>(c * kTileQ + r);
                    bool keeps = r < nr && keep(g.key, g.element(b, h, q0 + r, c), g.dropout);
                    pdrop[i] = keeps ? p[i] * drop_scale : 0.0f;
                    dpt[i] *= keeps ? drop_scale : 0.0f;
                  }
                p_used = pdrop.data();
              }
              // dV += P^T dY.
              vec_small_gemm(cols, g.ev, nr, 1.0f, p_used, kTileQ, 1, dyp + q0 * ldy, ldy, true,
                             dvp, ldv);
              vec_attention_grad_t(p, dpt.data(), cols, d);  // dS^T = P^T * (dP^T - D)
              if (pdm)
                for (int64_t r = 0; r < nr; ++r)
                  for (int64_t c = 0; c < cols; ++c)
                    pdm[(rows + q0 + r) * g.lk + c] = dpt[static_cast<size_t>(c * kTileQ + r)];
              // dK += scale dS^T Q; dQ = scale dS K (dS read through its transpose).
              vec_small_gemm(cols, g.e, nr, g.scale, dpt.data(), kTileQ, 1, qrows + q0 * ldq_in,
                             ldq_in, true, dkp, ldk);
              vec_small_gemm(nr, g.e, cols, g.scale, dpt.data(), 1, kTileQ, krows, ldk, false,
                             dqp + q0 * ldq, ldq);
            }
          }
        }
      });
}

const bool registered = [] {
  register_stateful_kernel(GT, "Attention", {F32},
                           [](const Node& n) { return std::make_unique<AttentionKernel>(n); });
  register_kernel(GT, "AttentionGrad", {F32}, attention_grad);
  return true;
}();

}  // namespace
}  // namespace graphtrain::cpu

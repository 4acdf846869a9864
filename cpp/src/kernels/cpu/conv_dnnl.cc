// Conv and ConvGrad through oneDNN's direct convolution (conv_dnnl.h). Each pool thread runs its
// part of the batch with a oneDNN primitive made for that batch size on one OpenMP thread; the
// primitives and their reorders (NCHW to oneDNN's blocked layouts and back) are made once per
// shape and kept for the process.
#include "kernels/cpu/conv_dnnl.h"

#include "graphtrain/options.h"
#include "graphtrain/thread_pool.h"

#ifdef GRAPHTRAIN_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/cpu/dnnl_common.h"
#endif

namespace graphtrain::cpu {

#ifdef GRAPHTRAIN_HAVE_DNNL
namespace {

// IM2COL, or a small convolution: AUTO leaves convolutions of at most this many weights (a few
// channels: a 3x3 conv from 8 to 16 channels has 1152) to im2col + GEMM. On those oneDNN's direct
// kernels gain at most ~0.15 ms a layer (bench/results/conv.md), while a model whose convolutions
// are all that small never touches oneDNN: ~7 MiB less peak memory (its JIT kernels, scratchpads
// and the library code they run), more than such a model's activations.
constexpr int64_t kIm2colMaxWeights = 2048;

bool im2col_forced(const ConvShape& s) {
  std::string algorithm = Options::global().get_string("conv_algorithm");
  if (algorithm == "AUTO") return s.m * (s.c / s.group) * s.kh * s.kw <= kIm2colMaxWeights;
  return algorithm == "IM2COL";  // ONEDNN: wherever it has a kernel
}

using dnnl::memory;
using Tag = memory::format_tag;
constexpr auto F32 = memory::data_type::f32;

enum Kind : int64_t { kForward, kForwardBias, kBackwardData, kBackwardWeights };

const dnnl::engine& engine() {
  static const dnnl::engine e(dnnl_cpu_engine(), true);  // the process's, not owned here
  return e;
}

// One tensor as the primitive reads or writes it: its layout and, where that is not the user's
// NCHW / OIHW, the reorders between them.
struct Operand {
  memory::desc user, inner;
  dnnl::reorder to_inner, to_user;
  bool same() const { return user == inner; }
};

// A primitive for one shape, kind and batch size; `ok` false where oneDNN has no direct kernel.
struct Prim {
  bool ok = false;
  dnnl::primitive prim;
  Operand x, w, y;  // the input (or its gradient), the weights (or theirs), the output (or its)
  memory::desc scratch;
};

memory::dims x_dims(const ConvShape& s, int64_t n) {
  return {n, s.c, s.h, s.w};
}
memory::dims y_dims(const ConvShape& s, int64_t n) {
  return {n, s.m, s.oh, s.ow};
}
memory::dims w_dims(const ConvShape& s) {
  if (s.group == 1) return {s.m, s.c, s.kh, s.kw};
  return {s.group, s.m / s.group, s.c / s.group, s.kh, s.kw};
}

Operand operand(const memory::dims& dims, Tag user_tag, const memory::desc& inner) {
  Operand o;
  o.user = memory::desc(dims, F32, user_tag);
  o.inner = inner;
  if (!o.same()) {
    o.to_inner = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), o.user, engine(), inner));
    o.to_user = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), inner, engine(), o.user));
  }
  return o;
}

Prim make_prim(const ConvShape& s, int64_t n, Kind kind) {
  OneOmpThread one;  // the kernel is chosen and blocked for one thread
  Prim p;
  auto any = [](const memory::dims& d) { return memory::desc(d, F32, Tag::any); };
  memory::dims strides{s.sh, s.sw}, dilates{s.dh - 1, s.dw - 1}, pad_l{s.ph0, s.pw0},
      pad_r{s.ph1, s.pw1};
  memory::desc bias = kind == kForwardBias ? memory::desc({s.m}, F32, Tag::a) : memory::desc();
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  try {
    dnnl::convolution_forward::primitive_desc fwd(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                        dnnl::algorithm::convolution_direct, any(x_dims(s, n)),
                                        any(w_dims(s)), bias, any(y_dims(s, n)), strides, dilates,
                                        pad_l, pad_r),
        attr, engine());
    memory::desc x, w, y;
    std::string impl;
    if (kind == kForward || kind == kForwardBias) {
      p.prim = dnnl::convolution_forward(fwd);
      x = fwd.src_desc(), w = fwd.weights_desc(), y = fwd.dst_desc();
      p.scratch = fwd.scratchpad_desc();
      impl = fwd.impl_info_str();
    } else if (kind == kBackwardData) {
      dnnl::convolution_backward_data::primitive_desc pd(
          dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct,
                                                any(x_dims(s, n)), any(w_dims(s)),
                                                any(y_dims(s, n)), strides, dilates, pad_l, pad_r),
          attr, engine(), fwd);
      p.prim = dnnl::convolution_backward_data(pd);
      x = pd.diff_src_desc(), w = pd.weights_desc(), y = pd.diff_dst_desc();
      p.scratch = pd.scratchpad_desc();
      impl = pd.impl_info_str();
    } else {
      dnnl::convolution_backward_weights::primitive_desc pd(
          dnnl::convolution_backward_weights::desc(
              dnnl::algorithm::convolution_direct, any(x_dims(s, n)), any(w_dims(s)),
              any(y_dims(s, n)), strides, dilates, pad_l, pad_r),
          attr, engine(), fwd);
      p.prim = dnnl::convolution_backward_weights(pd);
      x = pd.src_desc(), w = pd.diff_weights_desc(), y = pd.diff_dst_desc();
      p.scratch = pd.scratchpad_desc();
      impl = pd.impl_info_str();
    }
    // Only its JIT direct kernels: its gemm and reference ones are no better than im2col.
    if (impl.rfind("jit", 0) != 0 || impl.find("gemm") != std::string::npos) return p;
    p.x = operand(x_dims(s, n), Tag::nchw, x);
    p.w = operand(w_dims(s), s.group == 1 ? Tag::oihw : Tag::goihw, w);
    p.y = operand(y_dims(s, n), Tag::nchw, y);
    p.ok = true;
  } catch (const dnnl::error&) {
    p.ok = false;  // no implementation for this shape: im2col runs it
  }
  return p;
}

// The primitive for (shape, batch size, kind), made on first use and kept.
const Prim& prim(const ConvShape& s, int64_t n, Kind kind) {
  using Key = std::array<int64_t, 19>;
  static std::mutex mutex;
  static std::map<Key, std::unique_ptr<Prim>> cache;
  Key key{n,    s.c,  s.h,   s.w,   s.m,   s.group, s.kh, s.kw, s.sh, s.sw,
          s.dh, s.dw, s.ph0, s.pw0, s.ph1, s.pw1,   s.oh, s.ow, kind};
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<Prim>& p = cache[key];
  if (!p) p = std::make_unique<Prim>(make_prim(s, n, kind));
  return *p;
}

// The batch split over the pool: part t of `parts` holds images [first(t), first(t + 1)).
struct Split {
  int64_t parts, base, extra;
  Split(int64_t n, int threads)
      : parts(std::max<int64_t>(1, std::min<int64_t>(n, threads))),
        base(n / parts),
        extra(n % parts) {}
  int64_t first(int64_t t) const { return t * base + std::min(t, extra); }
  int64_t size(int64_t t) const { return base + (t < extra ? 1 : 0); }
};

// The primitives for both part sizes of a split, or false where oneDNN declines either.
bool prims_for(const ConvShape& s, const Split& split, Kind kind) {
  if (!prim(s, split.base, kind).ok) return false;  // base >= 1: never more parts than images
  return split.extra == 0 || prim(s, split.base + 1, kind).ok;
}

// Runs one part's primitive on user (NCHW / OIHW) buffers; inputs are reordered in, outputs out.
class Run {
 public:
  explicit Run(const Prim& p) : p_(p), stream_(engine()) {}

  // An operand that the primitive reads.
  memory in(const Operand& o, const float* data) {
    memory user(o.user, engine(), const_cast<float*>(data));
    if (o.same()) return user;
    memory inner = buffer(o.inner);
    o.to_inner.execute(stream_, user, inner);
    return inner;
  }
  // An operand that the primitive writes: reordered out after it ran.
  memory out(const Operand& o, float* data) {
    memory user(o.user, engine(), data);
    if (o.same()) return user;
    memory inner = buffer(o.inner);
    outputs_.push_back({&o, inner, user});
    return inner;
  }
  void execute(std::unordered_map<int, memory> args) {
    args.insert({DNNL_ARG_SCRATCHPAD, buffer(p_.scratch)});
    p_.prim.execute(stream_, args);
    for (auto& o : outputs_) o.operand->to_user.execute(stream_, o.inner, o.user);
    stream_.wait();
  }

 private:
  memory buffer(const memory::desc& d) {
    return memory(d, engine(), dnnl_workspace(next_buffer_++, std::max<size_t>(d.get_size(), 1)));
  }
  struct Pending {
    const Operand* operand;
    memory inner, user;
  };
  const Prim& p_;
  dnnl::stream stream_;
  std::vector<Pending> outputs_;
  size_t next_buffer_ = 0;  // at most three operands and the scratchpad
};

}  // namespace

bool dnnl_conv_forward(ThreadPool& pool, const ConvShape& s, const float* x, const float* w,
                       const float* b, float* y) {
  if (im2col_forced(s) || s.n == 0) return false;
  Kind kind = b ? kForwardBias : kForward;
  Split split(s.n, pool.num_threads());
  if (!prims_for(s, split, kind)) return false;
  pool.parallel_for(split.parts, 1, [&](int64_t t0, int64_t t1) {
    OneOmpThread one;
    for (int64_t t = t0; t < t1; ++t) {
      int64_t b0 = split.first(t), nb = split.size(t);
      const Prim& p = prim(s, nb, kind);
      Run run(p);
      std::unordered_map<int, memory> args{
          {DNNL_ARG_SRC, run.in(p.x, x + b0 * s.c * s.h * s.w)},
          {DNNL_ARG_WEIGHTS, run.in(p.w, w)},
          {DNNL_ARG_DST, run.out(p.y, y + b0 * s.m * s.oh * s.ow)}};
      if (b)
        args.insert({DNNL_ARG_BIAS, memory({{s.m}, F32, Tag::a}, engine(), const_cast<float*>(b))});
      run.execute(std::move(args));
    }
  });
  return true;
}

bool dnnl_conv_backward(ThreadPool& pool, const ConvShape& s, const float* dy, const float* x,
                        const float* w, float* dx, float* dw) {
  if (im2col_forced(s) || s.n == 0) return false;
  Split split(s.n, pool.num_threads());
  if ((dx && !prims_for(s, split, kBackwardData)) || (dw && !prims_for(s, split, kBackwardWeights)))
    return false;
  int64_t w_size = s.m * (s.c / s.group) * s.kh * s.kw;
  // Each part's weight gradient (the first part's straight into dw), summed in part order.
  std::vector<std::vector<float>> dw_parts(static_cast<size_t>(split.parts));
  pool.parallel_for(split.parts, 1, [&](int64_t t0, int64_t t1) {
    OneOmpThread one;
    for (int64_t t = t0; t < t1; ++t) {
      int64_t b0 = split.first(t), nb = split.size(t);
      const float* dyt = dy + b0 * s.m * s.oh * s.ow;
      if (dx) {
        const Prim& p = prim(s, nb, kBackwardData);
        Run run(p);
        run.execute({{DNNL_ARG_DIFF_DST, run.in(p.y, dyt)},
                     {DNNL_ARG_WEIGHTS, run.in(p.w, w)},
                     {DNNL_ARG_DIFF_SRC, run.out(p.x, dx + b0 * s.c * s.h * s.w)}});
      }
      if (dw) {
        const Prim& p = prim(s, nb, kBackwardWeights);
        float* dst = dw;
        if (t > 0) {
          dw_parts[static_cast<size_t>(t)].resize(static_cast<size_t>(w_size));
          dst = dw_parts[static_cast<size_t>(t)].data();
        }
        Run run(p);
        run.execute({{DNNL_ARG_DIFF_DST, run.in(p.y, dyt)},
                     {DNNL_ARG_SRC, run.in(p.x, x + b0 * s.c * s.h * s.w)},
                     {DNNL_ARG_DIFF_WEIGHTS, run.out(p.w, dst)}});
      }
    }
  });
  if (dw)
    for (size_t t = 1; t < dw_parts.size(); ++t)
      for (int64_t i = 0; i < w_size; ++i) dw[i] += dw_parts[t][static_cast<size_t>(i)];
  return true;
}

#else  // no oneDNN: im2col + GEMM runs every convolution

bool dnnl_conv_forward(ThreadPool&, const ConvShape&, const float*, const float*, const float*,
                       float*) {
  return false;
}
bool dnnl_conv_backward(ThreadPool&, const ConvShape&, const float*, const float*, const float*,
                        float*, float*) {
  return false;
}

#endif

}  // namespace graphtrain::cpu

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>

#include "core/denormals.h"
#include "graphtrain/error.h"
#include "graphtrain/session.h"
#include "graphtrain/thread_pool.h"
#include "test_graphs.h"

namespace graphtrain {
namespace {

TEST(Session, RunsAndRebindsSymbolicDims) {
  Session s(testing::small_mlp());
  for (int64_t batch : {1, 3, 5}) {
    std::vector<float> xs(static_cast<size_t>(batch * 8));
    for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::sin(static_cast<float>(i));
    auto out = s.run({Tensor::from_vector(DType::kFloat32, {batch, 8}, xs)});
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].shape(), (Shape{batch, 2, 2}));
    // Each row is a softmax: sums to one.
    for (int64_t r = 0; r < batch; ++r) {
      float sum = 0;
      for (int k = 0; k < 4; ++k) sum += out[0].data<float>()[r * 4 + k];
      EXPECT_NEAR(sum, 1.0f, 1e-6f);
    }
  }
}

TEST(Session, InputErrorsNameTheInput) {
  Session s(testing::small_mlp());
  try {
    s.run({Tensor::zeros(DType::kFloat32, {2, 7})});
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("input 'x' dim 1 must be 8"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(s.run({Tensor::zeros(DType::kInt64, {2, 8})}), InputError);
  EXPECT_THROW(s.run(std::vector<Tensor>{}), InputError);
}

// FusedMatMul (transA/transB) and Gemm with a bias row, on one and two pool threads, against a
// double-precision reference: sizes below and above the split between OpenBLAS and oneDNN
// (m * n * k of 2^20), row blocks that leave a remainder, enough rows (600) that a transposed
// B is copied to [K, N] first (K 99: the copy's ragged edges), and fewer (130) that oneDNN's
// matmul primitive reads it in place (Gemm's alpha and beta: its output scale and sum).
TEST(Session, MatMulAndGemmMatchAReferenceOnEitherGemmLibrary) {
  for (int64_t m : {7, 130, 600}) {
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      int64_t k = m == 600 ? 99 : 96, n = m == 7 ? 33 : 200;
      for (int t = 0; t < 4; ++t) {
        bool ta = t & 1, tb = t & 2;
        Graph g;
        Shape sa = ta ? Shape{k, m} : Shape{m, k}, sb = tb ? Shape{n, k} : Shape{k, n};
        Value* a = g.add_input("a", {DType::kFloat32, SymShape{SymDim(sa[0]), SymDim(sa[1])}});
        Value* b = g.add_input("b", {DType::kFloat32, SymShape{SymDim(sb[0]), SymDim(sb[1])}});
        Value* c = g.add_input("c", {DType::kFloat32, SymShape{SymDim(n)}});
        std::map<std::string, Attribute> trans{{"transA", Attribute::of(int64_t{ta})},
                                               {"transB", Attribute::of(int64_t{tb})}};
        g.add_output(g.add_op("FusedMatMul", {a, b}, trans, kGraphtrainDomain));
        trans["alpha"] = Attribute::of(0.75f);
        trans["beta"] = Attribute::of(0.5f);
        g.add_output(g.add_op("Gemm", {a, b, c}, trans));
        Session s(std::move(g), SessionOptions{"cpu", &pool});
        auto fill = [](const Shape& shape, float phase) {
          std::vector<float> v(static_cast<size_t>(shape[0] * shape[1]));
          for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37f * i + phase);
          return Tensor::from_vector(DType::kFloat32, shape, v);
        };
        Tensor ta_t = fill(sa, 0.1f), tb_t = fill(sb, 0.7f), tc = fill({1, n}, 1.3f);
        auto out = s.run(
            {ta_t, tb_t,
             Tensor::from_vector(DType::kFloat32, {n},
                                 std::vector<float>(tc.data<float>(), tc.data<float>() + n))});
        const float *pa = ta_t.data<float>(), *pb = tb_t.data<float>();
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double ref = 0;
            for (int64_t q = 0; q < k; ++q)
              ref += static_cast<double>(ta ? pa[q * m + i] : pa[i * k + q]) *
                     (tb ? pb[j * k + q] : pb[q * n + j]);
            float mm = out[0].data<float>()[i * n + j], gemm = out[1].data<float>()[i * n + j];
            ASSERT_NEAR(mm, ref, 1e-4) << "m " << m << " threads " << threads << " t " << t;
            ASSERT_NEAR(gemm, 0.75 * ref + 0.5 * tc.data<float>()[j], 1e-4);
          }
      }
    }
  }
}

TEST(ThreadPool, CoversTheRangeOnceAndPropagatesErrors) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> hits(10007);
  pool.parallel_for(10007, 10, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) hits[static_cast<size_t>(i)]++;
  });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  EXPECT_THROW(pool.parallel_for(100, 1,
                                 [](int64_t lo, int64_t) {
                                   if (lo > 50) throw Error("boom");
                                 }),
               Error);
  // Nested loops run serially inside a task instead of deadlocking or oversubscribing.
  std::atomic<int64_t> total{0};
  pool.parallel_for(8, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i)
      pool.parallel_for(100, 1, [&](int64_t a, int64_t b) { total += b - a; });
  });
  EXPECT_EQ(total.load(), 800);
}

TEST(ThreadPool, GlobalPoolRunsJobsInAChildOfForkAndExits) {
  // GraphModule captures in a forked child; DataLoader workers are forked children too. Only the
  // forking thread lives on there: the global pool must not wait for its workers.
  ThreadPool& pool = ThreadPool::global();
  std::atomic<int64_t> sum{0};
  pool.parallel_for(1 << 16, 1, [&](int64_t lo, int64_t hi) { sum += hi - lo; });
  ASSERT_EQ(sum.load(), 1 << 16);  // the workers are up and spinning when we fork
  std::fflush(nullptr);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(30);  // a hang fails the test instead of stalling it
    std::atomic<int64_t> child_sum{0};
    for (int j = 0; j < 100; ++j)
      pool.parallel_for(1000, 1, [&](int64_t lo, int64_t hi) { child_sum += hi - lo; });
    int code = child_sum.load() == 100000 ? 0 : 1;
#if defined(__SANITIZE_ADDRESS__)
    // LeakSanitizer's check at exit can itself hang in a forked child of a threaded process: a
    // thread of the parent may have held the sanitizer allocator's lock at the fork (GCC 12's
    // runtime takes no such lock around fork). The destructors are exercised by the plain build.
    _exit(code);
#else
    std::exit(code);  // static destructors run: the pool's too
#endif
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  sum = 0;
  pool.parallel_for(1 << 16, 1, [&](int64_t lo, int64_t hi) { sum += hi - lo; });
  EXPECT_EQ(sum.load(), 1 << 16);  // the parent's pool is untouched
}

// A denormal result (2^-140) of normal operands, computed where the compiler cannot fold it.
float denormal_product() {
  volatile float a = 0x1p-70f, b = 0x1p-70f;
  return a * b;
}

TEST(ThreadPool, WorkersTakeTheSubmittersDenormalMode) {
  ASSERT_NE(denormal_product(), 0.0f);  // the thread's own mode keeps denormals
  ThreadPool pool(3);
  std::vector<float> got(3, -1.0f);
  std::vector<std::thread::id> ran(3);
  auto fill = [&](int64_t lo,
                  int64_t hi) {  // three chunks, slow enough for each thread to take one
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (int64_t i = lo; i < hi; ++i) {
      got[static_cast<size_t>(i)] = denormal_product();
      ran[static_cast<size_t>(i)] = std::this_thread::get_id();
    }
  };
  {
    FlushDenormals flush(true);
    EXPECT_EQ(denormal_product(), 0.0f);
    pool.parallel_for(3, 1, fill);
  }
  // Looked at after the scope: inside it, this thread reads a denormal as zero.
  for (float v : got) EXPECT_EQ(v, 0.0f);  // every chunk, whichever thread ran it
  ASSERT_NE(ran[0], ran[1]);               // workers ran chunks
  EXPECT_NE(denormal_product(), 0.0f);     // restored when the scope closes
  pool.parallel_for(3, 1, fill);
  for (float v : got) EXPECT_NE(v, 0.0f);  // and the workers follow again
  {
    FlushDenormals keep(false);
    EXPECT_NE(denormal_product(), 0.0f);
  }
}

TEST(ThreadPool, ManyShortJobsFromSeveralThreadsWhileBusyAndIdle) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  auto submit = [&](int jobs) {
    for (int j = 0; j < jobs; ++j)
      pool.parallel_for(64, 1, [&](int64_t lo, int64_t hi) { sum += hi - lo; });
  };
  {
    ThreadPool::Busy busy(pool);  // workers spin between jobs
    std::thread other([&] { submit(500); });
    submit(500);
    other.join();
  }
  submit(50);  // outside a run: workers sleep between jobs and are woken
  EXPECT_EQ(sum.load(), 64 * 1050);
}

}  // namespace
}  // namespace graphtrain

namespace graphtrain {
namespace {

TEST(Tensor, FreedLargeBlocksAreReusedAndCounted) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "the block cache is off under AddressSanitizer";
#else
  // What earlier tests in this process left cached does not count.
  release_cached_memory();
  void* first;
  {
    Tensor big = Tensor::empty(DType::kFloat32, {1 << 18});  // 1 MiB
    first = big.raw_data();
  }
  MemoryStats after_free = memory_stats();
  EXPECT_GE(after_free.cached_bytes, int64_t{1} << 20);
  Tensor again = Tensor::empty(DType::kFloat32, {(1 << 18) - 1000});  // a bit smaller: same block
  EXPECT_EQ(again.raw_data(), first);
  EXPECT_EQ(memory_stats().cached_bytes, after_free.cached_bytes - (int64_t{1} << 20));
  Tensor small = Tensor::empty(DType::kFloat32, {16});  // small blocks are malloc's
  EXPECT_NE(small.raw_data(), first);
#endif
}

// Of two cached blocks of one size, the one freed last serves the next request: it is the one
// likeliest still in the caches.
TEST(Tensor, TheBlockFreedLastIsReusedFirst) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "the block cache is off under AddressSanitizer";
#else
  release_cached_memory();
  void *older, *newer;
  {
    Tensor a = Tensor::empty(DType::kFloat32, {1 << 16});
    Tensor b = Tensor::empty(DType::kFloat32, {1 << 16});
    older = a.raw_data();
    newer = b.raw_data();
    a = Tensor();  // freed first
  }                // b freed last
  {
    Tensor first = Tensor::empty(DType::kFloat32, {1 << 16});
    Tensor second = Tensor::empty(DType::kFloat32, {1 << 16});
    EXPECT_EQ(first.raw_data(), newer);
    EXPECT_EQ(second.raw_data(), older);
  }
  release_cached_memory();  // its bound follows the peak of live tensors: leave it empty
#endif
}

// A training step's stashed values and its gradients are freed at different times and have
// different sizes: the cache keeps both sets though together they exceed the peak, so the next
// step allocates neither again (and malloc's heap does not fragment under megabyte churn).
TEST(Tensor, TheCacheKeepsBlocksOfTwoSizesThatWereNeverLiveTogether) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "the block cache is off under AddressSanitizer";
#else
  release_cached_memory();
  reset_peak_memory();
  constexpr int64_t kMiB = int64_t{1} << 20;
  void* stash_block;
  void* grad_block;
  { stash_block = Tensor::empty(DType::kFloat32, {3 * kMiB / 4}).raw_data(); }  // 3 MiB, freed
  int64_t before = memory_stats().cached_bytes;
  { grad_block = Tensor::empty(DType::kFloat32, {kMiB / 2}).raw_data(); }  // 2 MiB: a new block
  EXPECT_NE(grad_block, stash_block);
  EXPECT_EQ(memory_stats().cached_bytes, before + 2 * kMiB) << "the 2 MiB block was dropped";
  Tensor stash = Tensor::empty(DType::kFloat32, {3 * kMiB / 4});
  Tensor grad = Tensor::empty(DType::kFloat32, {kMiB / 2});
  EXPECT_EQ(stash.raw_data(), stash_block);
  EXPECT_EQ(grad.raw_data(), grad_block);
  stash = grad = Tensor();
  release_cached_memory();
#endif
}

// A run handed its inputs (run(std::vector<Tensor>&&), GraphModule's stash fed to the backward)
// frees each after its last reader, and its later allocations take the freed block; a run given
// them by reference leaves them to the caller.
TEST(Session, ARunOwningItsInputsFreesThemAfterTheirLastReader) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "the block cache is off under AddressSanitizer";
#else
  for (bool owned : {false, true}) {
    Graph g;  // a fresh session: its first run allocates each tensor (no plan yet)
    Value* x = g.add_input("x", {DType::kFloat32, SymShape{SymDim(1 << 16)}});
    g.add_output(g.add_op("Transpose", {g.add_op("Neg", {x})}));
    Session s(std::move(g));
    release_cached_memory();
    Tensor input = Tensor::zeros(DType::kFloat32, {1 << 16});
    const void* block = input.raw_data();
    std::vector<Tensor> inputs{std::move(input)};
    std::vector<Tensor> out = owned ? s.run(std::move(inputs)) : s.run(inputs);
    // Neg's output dies at the Transpose, x already at the Neg: the output takes x's block
    // only where the run freed it.
    EXPECT_EQ(out[0].raw_data() == block, owned) << (owned ? "owned" : "by reference");
    EXPECT_EQ(inputs.empty() || !inputs[0].defined(), owned);
  }
  release_cached_memory();
#endif
}

// When a plan's arena is made, the blocks the recording run freed are released: they would sit
// beside the arena unused.
TEST(Tensor, ReleasingCachedMemoryEmptiesTheCache) {
  { Tensor big = Tensor::empty(DType::kFloat32, {1 << 18}); }
#if !defined(__SANITIZE_ADDRESS__)
  EXPECT_GE(memory_stats().cached_bytes, int64_t{1} << 20);
#endif
  release_cached_memory();
  EXPECT_EQ(memory_stats().cached_bytes, 0);
}

TEST(Arena, PlacesTensorsAtOffsetsAndStaysAlive) {
  Tensor a, b;
  {
    auto arena = Arena::create(1024);
    a = arena->place(0, DType::kFloat32, {4, 4});
    b = arena->place(128, DType::kInt64, {8});
    EXPECT_THROW(arena->place(1000, DType::kFloat32, {16}), Error);
    EXPECT_THROW(arena->place(3, DType::kFloat32, {1}), Error);
  }  // the tensors keep the block alive
  for (int i = 0; i < 16; ++i) a.data<float>()[i] = 1.5f;
  for (int i = 0; i < 8; ++i) b.data<int64_t>()[i] = -1;
  EXPECT_EQ(a.data<float>()[15], 1.5f);  // no overlap
  EXPECT_EQ(static_cast<char*>(b.raw_data()) - static_cast<char*>(a.raw_data()), 128);
}

}  // namespace
}  // namespace graphtrain

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "graphtrain/log.h"
#include "graphtrain/output_capture.h"

namespace graphtrain {
namespace {

int open_fd_count() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n;
}

void native_write(int fd, const char* text) {
  ssize_t n = ::write(fd, text, std::strlen(text));
  (void)n;
}

class CaptureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_level_ = Logger::global().level();
    Logger::global().set_level(LogLevel::kWarning);
  }
  void TearDown() override { Logger::global().set_level(saved_level_); }
  LogLevel saved_level_{};
};

TEST_F(CaptureTest, NativeOutputOnBothStreamsIsCapturedAndFiltered) {
  OutputCapture cap("unit");
  EXPECT_TRUE(cap.redirecting());
  native_write(1, "useful line from stdout\n");
  native_write(2, "[graphtrain-noise] chatter\n");
  std::printf("buffered printf line\n");  // stdio buffers must be flushed, not lost
  CapturedOutput out = cap.finish();
  ASSERT_EQ(out.kept.size(), 2u);
  EXPECT_EQ(out.kept[0], "useful line from stdout");
  EXPECT_EQ(out.kept[1], "buffered printf line");
  EXPECT_EQ(out.suppressed, 1u);
}

TEST_F(CaptureTest, VerboseKeepsEverything) {
  Logger::global().set_level(LogLevel::kVerbose);
  OutputCapture cap("unit");
  native_write(1, "[graphtrain-noise] chatter\n");
  CapturedOutput out = cap.finish();
  ASSERT_EQ(out.kept.size(), 1u);
  EXPECT_EQ(out.suppressed, 0u);
}

TEST_F(CaptureTest, HundredCapturesLeaveNoDescriptorOpen) {
  int before = open_fd_count();
  for (int i = 0; i < 100; ++i) {
    OutputCapture cap("loop");
    native_write(1, "[graphtrain-noise] x\n");
    cap.finish();
  }
  EXPECT_EQ(open_fd_count(), before);
}

TEST_F(CaptureTest, StreamsAreRestored) {
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  int saved = ::dup(1);
  ::dup2(pipefd[1], 1);
  {
    OutputCapture cap("unit");
    native_write(1, "inside\n");
    cap.finish();
  }
  native_write(1, "after\n");
  ::dup2(saved, 1);
  ::close(saved);
  ::close(pipefd[1]);
  char buf[64] = {};
  ssize_t n = ::read(pipefd[0], buf, sizeof(buf) - 1);
  ::close(pipefd[0]);
  EXPECT_EQ(std::string(buf, n > 0 ? n : 0), "after\n");
}

TEST_F(CaptureTest, ClosedStdoutStaysClosedAndNothingLeaks) {
  int saved = ::dup(1);
  ::close(1);
  int before = open_fd_count();
  {
    OutputCapture cap("no stdout");
    native_write(1, "goes to the capture\n");
    CapturedOutput out = cap.finish();
    ASSERT_EQ(out.kept.size(), 1u);
  }
  EXPECT_EQ(::fcntl(1, F_GETFD), -1);  // still closed
  EXPECT_EQ(open_fd_count(), before);
  ::dup2(saved, 1);
  ::close(saved);
}

TEST_F(CaptureTest, TwoThreadsAndNestingAreSafe) {
  int before = open_fd_count();
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([] {
      for (int i = 0; i < 50; ++i) {
        OutputCapture outer("thread");
        OutputCapture inner("nested");
        // Nested in a redirecting capture of the same thread: joins it. (When the other thread
        // held the descriptors, `outer` did not redirect and `inner` may, once they are free.)
        if (outer.redirecting()) {
          EXPECT_FALSE(inner.redirecting());
        }
        native_write(1, "[graphtrain-noise] t\n");
        inner.finish();
        outer.finish();
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(open_fd_count(), before);
}

TEST_F(CaptureTest, EmitsOneRecordWithPhaseAndSuppressedCount) {
  std::vector<std::string> seen;
  Logger::global().set_rank(0);
  Logger::global().set_sink([&](const LogRecord& r) { seen.emplace_back(r.message); });
  {
    OutputCapture cap("graph building");
    native_write(2, "[graphtrain-noise] a\n[graphtrain-noise] b\nkeep me\n");
  }  // the destructor finishes and emits
  Logger::global().set_sink(nullptr);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_NE(seen[0].find("graph building"), std::string::npos) << seen[0];
  EXPECT_NE(seen[0].find("2 known-useless line(s) suppressed"), std::string::npos) << seen[0];
  EXPECT_NE(seen[0].find("\n  keep me"), std::string::npos) << seen[0];
}

}  // namespace
}  // namespace graphtrain

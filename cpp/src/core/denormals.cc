#include "core/denormals.h"

#include "graphtrain/options.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace graphtrain {
namespace {
#if defined(__x86_64__) || defined(__i386__)
constexpr unsigned kFlush = 0x8040;  // FTZ (bit 15) | DAZ (bit 6)
#else
constexpr unsigned kFlush = 0;
#endif
}  // namespace

unsigned float_mode() {
#if defined(__x86_64__) || defined(__i386__)
  return _mm_getcsr() & ~0x3Fu;  // the control bits, not the sticky exception flags
#else
  return 0;
#endif
}

void set_float_mode(unsigned mode) {
#if defined(__x86_64__) || defined(__i386__)
  _mm_setcsr(mode);
#else
  (void)mode;
#endif
}

FlushDenormals::FlushDenormals(bool on) : saved_(float_mode()) {
  if (on && kFlush && (saved_ & kFlush) != kFlush) {
    set_float_mode(saved_ | kFlush);
    changed_ = true;
  }
}

FlushDenormals::FlushDenormals() : FlushDenormals(Options::global().get_bool("flush_denormals")) {}

FlushDenormals::~FlushDenormals() {
  if (changed_) set_float_mode(saved_);
}

}  // namespace graphtrain

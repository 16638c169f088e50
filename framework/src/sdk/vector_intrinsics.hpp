// <immintrin.h> for the vector paths picked at run time. GCC 12 warns inside its
// own AVX-512 headers (their _mm512_undefined_* placeholders), so the include
// is made with those warnings off; they stay on for the code that uses it.
#pragma once

#pragma GCC diagnostic push
#ifndef __clang__  // clang has no such warning
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

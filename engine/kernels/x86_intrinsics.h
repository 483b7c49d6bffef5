#pragma once
// <immintrin.h> for the instruction-set files (*_avx2.cpp, *_avx512.cpp), with GCC 12's false warnings from
// inside its own AVX-512 header silenced there alone: the _mm512_undefined_* helpers that casts, shifts and
// reductions inline declare `__Y = __Y`, which -Wmaybe-uninitialized / -Wuninitialized report as used
// uninitialized (GCC bug 105593, fixed in GCC 13). The pragmas cover the header's own lines, where those
// warnings point, and nothing of ours: an uninitialized value in a kernel still warns.
#if defined(__GNUC__) && !defined(__clang__)
#ifdef _IMMINTRIN_H_INCLUDED
#error "x86_intrinsics.h must be the first to include <immintrin.h>: its pragmas cover that inclusion only"
#endif
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#elif defined(__x86_64__)
#include <immintrin.h>
#endif

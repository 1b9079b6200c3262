// FLEXJIT_API marks the public API: the library is compiled with hidden visibility, so a shared
// libflexjit.so exports what carries this macro and nothing else (no flexjit::jit::*, no LLVM).
#pragma once

#if defined(_WIN32)
#if defined(FLEXJIT_STATIC)
#define FLEXJIT_API
#elif defined(FLEXJIT_BUILDING)
#define FLEXJIT_API __declspec(dllexport)
#else
#define FLEXJIT_API __declspec(dllimport)
#endif
#else
#define FLEXJIT_API __attribute__((visibility("default")))
#endif

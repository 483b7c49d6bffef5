#pragma once
// What a test may relax in a build with AddressSanitizer (make test-sanitize, KVCHAT_SANITIZE=ON): its
// checks stay, its limits follow the sanitized program's real costs.
namespace kvchat::test {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitizedBuild = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kSanitizedBuild = true;
#else
inline constexpr bool kSanitizedBuild = false;
#endif
#else
inline constexpr bool kSanitizedBuild = false;
#endif

// CPU budgets of whole kvchat-cli runs: an instrumented program does its own work 2-3x slower, and
// starting one (shadow memory, LibTorch's static registrations through the intercepted allocator) and
// its exit-time leak scan add about a second of CPU.
inline constexpr double kSanitizedCpuFactor = kSanitizedBuild ? 4.0 : 1.0;

}  // namespace kvchat::test

/* lsan.h — TS_LSAN is defined when the build runs under AddressSanitizer (gcc or clang), whose
 * LeakSanitizer then checks for leaks; <sanitizer/lsan_interface.h> is included with it.
 * lsan_leave_allocated(p): the heap block p is left allocated on purpose, for as long as the
 * process lives (the kernel may still read or write it), and is no leak for LeakSanitizer. */
#ifndef TS_CORE_LSAN_H
#define TS_CORE_LSAN_H

#if defined(__SANITIZE_ADDRESS__)
#define TS_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TS_LSAN 1
#endif
#endif
#ifdef TS_LSAN
#include <sanitizer/lsan_interface.h>
#define lsan_leave_allocated(p) __lsan_ignore_object(p)
#else
#define lsan_leave_allocated(p) ((void)(p))
#endif

#endif

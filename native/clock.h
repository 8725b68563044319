/* The one clock of native/: every deadline, tick and poll reads CLOCK_MONOTONIC
 * through pc_mono_s (the epoll server's ticks, the tcp client's reply poll,
 * the verbs backend's completion waits). */
#ifndef PC_CLOCK_H
#define PC_CLOCK_H

#include <time.h>

#ifndef CLOCK_MONOTONIC
#error "clock.h needs clock_gettime: define _GNU_SOURCE (or _POSIX_C_SOURCE >= 199309L) before the first #include"
#endif

/* Seconds on CLOCK_MONOTONIC (an arbitrary origin: only differences mean anything). */
static inline double pc_mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif

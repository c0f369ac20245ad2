// CZeroMQ: libzmq for the ZeroMQ transport (trait `ZeroMQ`), plus the Linux calls the
// transport needs that Swift cannot import from Glibc.
//
// Every helper carries the `pkz_` prefix. Only PortKitZeroMQ's System folder imports this module.
#ifndef CZEROMQ_H
#define CZEROMQ_H

#include <zmq.h>
#include <sys/eventfd.h>
#include <pthread.h>
#include <time.h>

/// glibc 2.30's, declared only for _GNU_SOURCE, which Glibc's Swift module is not built with.
extern int pthread_mutex_clocklock(pthread_mutex_t *mutex, clockid_t clock, const struct timespec *until);

/// A non-blocking, close-on-exec eventfd: how another thread interrupts a send that waits for
/// room (`eventfd(2)`, which Glibc's Swift module does not export).
static inline int pkz_eventfd(void) { return eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK); }

/// Takes `mutex`, waiting for it until `until` on CLOCK_MONOTONIC: 0, or ETIMEDOUT.
static inline int pkz_mutex_lock_until(pthread_mutex_t *mutex, const struct timespec *until) {
    return pthread_mutex_clocklock(mutex, CLOCK_MONOTONIC, until);
}

#endif

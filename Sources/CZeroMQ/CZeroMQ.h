// CZeroMQ: libzmq for the ZeroMQ transport (trait `ZeroMQ`), plus the one Linux call the
// transport needs that Swift cannot import from Glibc.
//
// Every helper carries the `pkz_` prefix. Only PortKitZeroMQ's System folder imports this module.
#ifndef CZEROMQ_H
#define CZEROMQ_H

#if !__has_include(<zmq.h>)
#error "the ZeroMQ trait needs libzmq's headers: apt-get install libzmq3-dev"
#endif
#include <zmq.h>
#include <sys/eventfd.h>

/// A non-blocking, close-on-exec eventfd: how another thread interrupts a send that waits for
/// room (`eventfd(2)`, which Glibc's Swift module does not export).
static inline int pkz_eventfd(void) { return eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK); }

#endif

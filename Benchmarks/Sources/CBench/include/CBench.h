// The raw baselines of PortKit's benchmark suite, written directly on system calls so that they
// are as fast as the kernel allows, plus CPU pinning and a small gate for driving threads.
//
// Every baseline keeps both sides in its own thread or process, each sleeping in epoll_wait
// until its socket is readable, as a run loop does. Messages are fixed-size byte blocks; in a
// stream the first byte of the last message of a batch is 1 (the receiver acknowledges it with
// one byte), of every other message 0.

#ifndef CBENCH_H
#define CBENCH_H

#include <stddef.h>
#include <stdint.h>

// MARK: - Placement and time

/// Pins the calling thread to `cpu` (or lets it run anywhere when `cpu` < 0). 0 on success.
int cb_pin_self(int cpu);
/// The CPU the calling thread runs on now.
int cb_current_cpu(void);
/// The number of CPUs this process may run on.
int cb_cpu_count(void);
/// CLOCK_MONOTONIC in nanoseconds.
uint64_t cb_now_ns(void);
/// Bytes in use by malloc (glibc's mallinfo2: uordblks + hblkhd).
size_t cb_malloc_in_use(void);
/// Raises RLIMIT_NOFILE's soft limit to its hard limit; returns the new soft limit.
long cb_raise_fd_limit(void);

// MARK: - A gate: one thread posts work, another runs it and reports completion

typedef struct cb_gate cb_gate;
cb_gate *cb_gate_new(void);
void cb_gate_free(cb_gate *gate);
/// Posts `n` (> 0) as work, or -1 to ask the worker to quit.
void cb_gate_post(cb_gate *gate, long n);
/// Waits for work; returns what was posted.
long cb_gate_take(cb_gate *gate);
/// Reports the posted work done.
void cb_gate_done(cb_gate *gate);
/// Waits until the worker reports the work done.
void cb_gate_wait_done(cb_gate *gate);

// MARK: - Socket helpers shared with the helper processes

/// Writes all of `len` bytes (blocking socket). 0 on success, -1 on error.
int cb_write_all(int fd, const void *buf, size_t len);
/// Reads exactly `len` bytes, sleeping in epoll_wait on `epfd` whenever the socket (non-blocking)
/// has nothing. 0 on success, -1 on EOF or error.
int cb_read_exact_epoll(int epfd, int fd, void *buf, size_t len);
/// An epoll instance watching `fd` for input.
int cb_epoll_for(int fd);
/// cb_epoll_for for a round trip's reads: EPOLLRDHUP too when PKBENCH_C_SHAPED is set.
int cb_epoll_for_reading(int fd);

// MARK: - Round trip (ping-pong)

typedef struct cb_pingpong cb_pingpong;
/// Two threads over a socketpair: the client thread on `client_cpu`, the echo thread on
/// `server_cpu` (-1: anywhere). NULL on failure.
cb_pingpong *cb_sp_rt_new(int client_cpu, int server_cpu, size_t size);
/// Two processes over a named Unix socket: listens at `path`, spawns `helper` (posix_spawn, no
/// fork) with arguments `c-echo PATH SERVER_CPU SIZE`, accepts its connection; the client thread
/// runs on `client_cpu`. NULL on failure.
cb_pingpong *cb_un_rt_new(const char *helper, const char *path, int client_cpu, int server_cpu, size_t size);
/// Runs `n` round trips on the client thread; returns the nanoseconds they took there (from the
/// first write to the last reply), or -1 if the peer failed.
int64_t cb_rt_run(cb_pingpong *pp, long n);
void cb_rt_free(cb_pingpong *pp);

// MARK: - One-way stream

typedef struct cb_stream cb_stream;
/// Two threads over a socketpair: one `write` per message (no coalescing); the receiver reads
/// up to 64 KiB at a time.
cb_stream *cb_sp_stream_new(int sender_cpu, int receiver_cpu, size_t size);
/// Two processes over a named Unix socket: spawns `helper c-sink PATH RECEIVER_CPU SIZE`.
cb_stream *cb_un_stream_new(const char *helper, const char *path, int sender_cpu, int receiver_cpu, size_t size);
/// Sends `n` messages and waits for the receiver's acknowledgement of the last; returns the
/// nanoseconds from the first write to the acknowledgement, or -1 on failure.
int64_t cb_stream_run(cb_stream *st, long n);
void cb_stream_free(cb_stream *st);

// MARK: - The helper process's halves

/// A blocking connection to the Unix socket at `path`, or -1.
int cb_connect_unix(const char *path);

/// `c-echo`: connects to `path`, pins itself, echoes `size`-byte messages until EOF. Exit status.
int cb_un_echo_serve(const char *path, int cpu, size_t size);
/// `c-sink`: connects to `path`, pins itself, reads messages, acknowledges each flagged one.
int cb_un_sink_serve(const char *path, int cpu, size_t size);

// MARK: - Thread spawn until its first byte arrives

typedef struct cb_spawn cb_spawn;
/// Makes the socketpair (not timed).
cb_spawn *cb_spawn_prepare(void);
/// Timed part: creates a thread that pins itself to `cpu` (if >= 0) and writes one byte, and
/// reads that byte. 0 on success.
int cb_spawn_go(cb_spawn *sp, int cpu);
/// Joins the thread and closes the socketpair (not timed).
void cb_spawn_finish(cb_spawn *sp);

// MARK: - Spawning helpers

/// posix_spawn `path` with a NULL-terminated `argv`; returns the pid or -1.
int cb_spawn_process(const char *path, char *const argv[]);
/// Waits for `pid` (SIGKILL after `timeout_ms`); returns the exit status as waitpid gives it.
int cb_reap(int pid, int timeout_ms);

#endif

// CPortKit: the few Linux facilities Swift cannot import from Glibc.
//
// Every symbol carries the `pk_` prefix. `_GNU_SOURCE` comes from the target's cSettings,
// never from this header (defining it here breaks the Glibc module with an fd_set conflict).
#ifndef CPORTKIT_H
#define CPORTKIT_H

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

// MARK: - Thread identity

/// The kernel thread id of the calling thread, cached per thread (gettid(2) is a system call).
pid_t pk_gettid(void);

// MARK: - Futex (PKMutex)

/// Sleeps while the 32-bit word at `word` holds `expected` (FUTEX_WAIT_PRIVATE, no timeout).
/// Returns at once if it does not; may return early (a signal, a spurious wake-up).
void pk_futex_wait(uint32_t *word, uint32_t expected);
/// Wakes one thread sleeping on `word` (FUTEX_WAKE_PRIVATE).
void pk_futex_wake_one(uint32_t *word);

/// A busy-wait hint to the CPU (x86 `pause`, Arm `yield`).
static inline void pk_spin_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
    __asm__ __volatile__("yield");
#endif
}

/// Bytes written to a socket and not yet read by its peer (ioctl SIOCOUTQ), or -1.
int pk_unsent_bytes(int fd);

// MARK: - Scheduling

/// Makes the calling thread a throughput thread (SCHED_BATCH): its wake-ups never preempt the
/// thread running on its CPU, which runs on until it sleeps or its time slice ends. Returns 0,
/// or the errno of sched_setscheduler(2).
int pk_prefer_throughput(void);
/// Whether the calling thread is a throughput thread (its policy is SCHED_BATCH).
int pk_is_throughput_thread(void);

// MARK: - Clock

/// CLOCK_MONOTONIC in nanoseconds: the clock of every PortKit deadline and timer.
static inline uint64_t pk_monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

// MARK: - epoll, eventfd, timerfd

static inline int pk_epoll_create1(int flags) { return epoll_create1(flags); }

static inline int pk_epoll_ctl(int epfd, int op, int fd, uint32_t events, uint64_t data) {
    struct epoll_event ev;
    ev.events = events;
    ev.data.u64 = data;
    return epoll_ctl(epfd, op, fd, &ev);
}

/// epoll_wait(2) into parallel arrays, so Swift never has to read the packed struct. Made with
/// syscall(2), as are the other calls on a message's way (see "Calls on a message's way").
int pk_epoll_wait(int epfd, uint32_t *events, uint64_t *data, int max, int timeout_ms);

static const uint32_t PK_EPOLLIN = EPOLLIN;
static const uint32_t PK_EPOLLOUT = EPOLLOUT;
static const uint32_t PK_EPOLLERR = EPOLLERR;
static const uint32_t PK_EPOLLHUP = EPOLLHUP;
static const uint32_t PK_EPOLLRDHUP = EPOLLRDHUP;
static const uint32_t PK_EPOLLET = EPOLLET;
static const int PK_EPOLL_CLOEXEC = EPOLL_CLOEXEC;

static inline int pk_eventfd(unsigned int initval, int flags) { return eventfd(initval, flags); }
static const int PK_EFD_CLOEXEC = EFD_CLOEXEC;
static const int PK_EFD_NONBLOCK = EFD_NONBLOCK;
static const int PK_EFD_SEMAPHORE = EFD_SEMAPHORE;

static inline int pk_timerfd_create(int flags) { return timerfd_create(CLOCK_MONOTONIC, flags); }
static const int PK_TFD_CLOEXEC = TFD_CLOEXEC;
static const int PK_TFD_NONBLOCK = TFD_NONBLOCK;

/// Arms a CLOCK_MONOTONIC timerfd at an absolute deadline in nanoseconds; 0 disarms it.
static inline int pk_timerfd_set_abs(int fd, uint64_t deadline_ns) {
    struct itimerspec spec = {0};
    spec.it_value.tv_sec = (time_t)(deadline_ns / 1000000000ull);
    spec.it_value.tv_nsec = (long)(deadline_ns % 1000000000ull);
    return timerfd_settime(fd, TFD_TIMER_ABSTIME, &spec, NULL);
}

// MARK: - Sockets

static const int PK_SOCK_STREAM = SOCK_STREAM;
static const int PK_SOCK_CLOEXEC = SOCK_CLOEXEC;
static const int PK_SOCK_NONBLOCK = SOCK_NONBLOCK;
static const int PK_MSG_NOSIGNAL = MSG_NOSIGNAL;
static const int PK_MSG_CMSG_CLOEXEC = MSG_CMSG_CLOEXEC;
static const int PK_MSG_CTRUNC = MSG_CTRUNC;
static const int PK_MSG_DONTWAIT = MSG_DONTWAIT;

int pk_accept4(int fd, int flags);

/// The peer's credentials as the kernel reports them (SO_PEERCRED).
int pk_peer_credentials(int fd, pid_t *pid, uid_t *uid, gid_t *gid);

/// bind(2) / connect(2) to a Unix socket path; -1 with ENAMETOOLONG if it does not fit.
int pk_bind_unix(int fd, const char *path);
int pk_connect_unix(int fd, const char *path);
/// sizeof(sockaddr_un.sun_path): a socket path must be shorter than this.
size_t pk_sun_path_capacity(void);

/// lstat(2) (or stat(2) when `follow`) / fstat(2), reporting mode, owner and inode.
int pk_lstat_info(const char *path, int follow, unsigned int *mode, unsigned int *uid, uint64_t *ino);
int pk_fstat_info(int fd, unsigned int *mode, unsigned int *uid, uint64_t *ino);

/// Drains an inotify descriptor; 1 if an event named `name` (or an overflow) was seen, 0 if
/// not, -1 with errno (EAGAIN) if nothing was pending.
int pk_inotify_saw_name(int fd, const char *name);

static const uint32_t PK_IN_CREATE = IN_CREATE;
static const uint32_t PK_IN_MOVED_TO = IN_MOVED_TO;
static const int PK_IN_CLOEXEC = IN_CLOEXEC;
static const int PK_IN_NONBLOCK = IN_NONBLOCK;
static const int PK_LOCK_EX = LOCK_EX;
static const int PK_LOCK_NB = LOCK_NB;
static const int PK_O_NOFOLLOW = O_NOFOLLOW;
static const int PK_O_CLOEXEC = O_CLOEXEC;
static const unsigned int PK_S_IFMT = S_IFMT;
static const unsigned int PK_S_IFSOCK = S_IFSOCK;
static const unsigned int PK_S_IFDIR = S_IFDIR;
static const unsigned int PK_S_IFREG = S_IFREG;
static const unsigned int PK_S_IFLNK = S_IFLNK;

/// posix_spawn(3) with descriptors `from[i]` placed at `to[i]` in the child; `envp` NULL keeps
/// this process's environment. Returns 0 or an errno value.
int pk_spawn(pid_t *pid, const char *path, char *const argv[], char *const envp[],
             const int *from, const int *to, int count);
/// pidfd_open(2).
int pk_pidfd_open(pid_t pid);

/// The inode of the socket connected to the Unix socket whose inode is `inode`, through
/// sock_diag(7) (`UDIAG_SHOW_PEER`): 1 with `*peer` set, 0 if it has no peer, -1 if the kernel
/// would not say (no `NETLINK_SOCK_DIAG`, say), errno set.
int pk_unix_peer_inode(unsigned long long inode, unsigned long long *peer);
/// pipe2(2) with O_CLOEXEC: both ends close-on-exec from the start (a child spawned by another
/// thread meanwhile inherits neither).
int pk_pipe_cloexec(int fds[2]);
/// Reaps the child `pidfd` refers to if it has ended, without blocking (waitid(2) with
/// P_PIDFD and WNOHANG): 1 with its exit code (signal 0) or the signal that killed it (code
/// -1), 0 if it runs, -1 with errno.
int pk_pidfd_reap(int pidfd, int *code, int *signal);
/// pidfd_send_signal(2): the process `pidfd` refers to, never another that took its pid.
int pk_pidfd_send_signal(int pidfd, int signal);

/// Names the calling thread (at most 15 bytes are kept).
void pk_set_thread_name(const char *name);
/// Joins `thread` (a `pthread_t`) if it ends before `deadline_ns` on CLOCK_MONOTONIC
/// (pthread_timedjoin_np(3), the deadline carried over to the wall clock): 0 when joined,
/// ETIMEDOUT when the deadline passed first.
int pk_thread_join_until(unsigned long thread, uint64_t deadline_ns);

/// The control buffer size for `count` descriptors (CMSG_SPACE).
static inline size_t pk_cmsg_space_fds(unsigned int count) {
    return count == 0 ? 0 : CMSG_SPACE(sizeof(int) * count);
}

// MARK: - Calls on a message's way

/// write(2), sendto(2), sendmsg(2) and recvmsg(2), made with syscall(2) rather than through
/// glibc's wrappers: those are thread cancellation points, and each call pays for it with two
/// atomic read-modify-writes (`__pthread_enable_asynccancel` and its pair), eight locked
/// instructions a thread round trip (docs/performance.md). PortKit never cancels a
/// thread. Under ThreadSanitizer they are glibc's: it learns the order between threads from the
/// calls it intercepts (a send, and the receive that returns its bytes). -1 and errno on failure,
/// as the wrappers.
ssize_t pk_sys_write(int fd, const void *buf, size_t len);
ssize_t pk_sys_send(int fd, const void *buf, size_t len, int flags);
ssize_t pk_sys_sendmsg(int fd, const struct msghdr *msg, int flags);
ssize_t pk_sys_recvmsg(int fd, struct msghdr *msg, int flags);

/// sendmsg(2) of `iovcnt` buffers with `fdcount` descriptors attached (SCM_RIGHTS), MSG_NOSIGNAL.
/// `control` must hold pk_cmsg_space_fds(fdcount) bytes.
static inline ssize_t pk_sendmsg_fds(int fd, const struct iovec *iov, int iovcnt,
                                     const int *fds, unsigned int fdcount, void *control) {
    struct msghdr msg = {0};
    msg.msg_iov = (struct iovec *)iov;
    msg.msg_iovlen = (size_t)iovcnt;
    if (fdcount > 0) {
        size_t space = CMSG_SPACE(sizeof(int) * fdcount);
        msg.msg_control = control;
        msg.msg_controllen = space;
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * fdcount);
        int *out = (int *)CMSG_DATA(c);
        for (unsigned int i = 0; i < fdcount; i++) out[i] = fds[i];
    }
    return pk_sys_sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/// send(2) of one buffer, MSG_NOSIGNAL: a write without descriptors. The kernel's sendto path
/// takes the buffer as it is, where sendmsg(2) first copies a message header and an iovec in.
static inline ssize_t pk_send_bytes(int fd, const void *buf, size_t len) {
    return pk_sys_send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/// Whether `fd` is a connected Unix-domain stream socket, the only kind a port's descriptor
/// may be. A peer can pass any descriptor: a file, a pipe, an `O_PATH` descriptor (on which
/// epoll_ctl, send and recvmsg fail with EBADF), a listening or never connected socket (which
/// has no peer: getpeername fails with ENOTCONN).
static inline int pk_is_unix_stream(int fd) {
    int value = 0;
    socklen_t len = sizeof(value);
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &value, &len) != 0 || value != AF_UNIX) return 0;
    len = sizeof(value);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &value, &len) != 0 || value != SOCK_STREAM) return 0;
    struct sockaddr_un peer;
    len = sizeof(peer);
    return getpeername(fd, (struct sockaddr *)&peer, &len) == 0;
}

/// The descriptors of `msg`'s SCM_RIGHTS control messages, for pk_recvmsg_fds. Not inlined
/// there: most reads carry none, and this loop would sit among their code.
__attribute__((noinline, cold))
static inline void pk_take_fds(struct msghdr *msg, int *fds, unsigned int maxfds,
                               unsigned int *fdcount, int *truncated) {
    for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c != NULL; c = CMSG_NXTHDR(msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        int *in = (int *)CMSG_DATA(c);
        for (size_t i = 0; i < count; i++) {
            if (*fdcount < maxfds && pk_is_unix_stream(in[i])) fds[(*fdcount)++] = in[i];
            else { close(in[i]); *truncated = 1; }
        }
    }
}

/// recvmsg(2) into one buffer, with MSG_CMSG_CLOEXEC. Descriptors that arrived are written to
/// `fds` (at most `maxfds`; any beyond that, and any that is not a connected Unix-domain stream
/// socket, are closed, by pk_take_fds) and counted in `*fdcount`. `*truncated` is set when the kernel
/// reported MSG_CTRUNC (descriptors were lost), more than `maxfds` arrived, or one was not a
/// connected Unix-domain stream socket; every descriptor written to `fds` is still reported, so the
/// caller can close them.
static inline ssize_t pk_recvmsg_fds(int fd, void *buf, size_t len, int *fds, unsigned int maxfds,
                                     unsigned int *fdcount, int *truncated, void *control,
                                     size_t controllen) {
    struct iovec iov = { buf, len };
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = controllen;
    *fdcount = 0;
    *truncated = 0;
    ssize_t n = pk_sys_recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0) return n;
    if (msg.msg_flags & MSG_CTRUNC) *truncated = 1;
    if (msg.msg_controllen > 0) pk_take_fds(&msg, fds, maxfds, fdcount, truncated);
    return n;
}

#endif

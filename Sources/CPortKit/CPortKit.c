// The parts of the shim that need _GNU_SOURCE (set in the target's cSettings): gettid(2),
// accept4(2), struct ucred and SCHED_BATCH.
#include "CPortKit.h"
#include <linux/sockios.h>
#include <sched.h>
#include <sys/ioctl.h>

pid_t pk_gettid(void) {
    // initial-exec: a direct %fs access instead of a __tls_get_addr call on every loop-only check.
    static _Thread_local pid_t cached __attribute__((tls_model("initial-exec"))) = 0;
    if (cached == 0) cached = gettid();
    return cached;
}

int pk_accept4(int fd, int flags) { return accept4(fd, NULL, NULL, flags); }

int pk_peer_credentials(int fd, pid_t *pid, uid_t *uid, gid_t *gid) {
    struct ucred cred;
    socklen_t len = sizeof(cred);
    int rc = getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len);
    if (rc == 0) { *pid = cred.pid; *uid = cred.uid; *gid = cred.gid; }
    return rc;
}

#include <pthread.h>
#include <string.h>

void pk_set_thread_name(const char *name) {
    char buffer[16];
    strncpy(buffer, name, 15);
    buffer[15] = 0;
    pthread_setname_np(pthread_self(), buffer);
}

int pk_thread_join_until(unsigned long thread, uint64_t deadline_ns) {
    // pthread_timedjoin_np measures CLOCK_REALTIME: the monotonic deadline becomes "now on the
    // wall clock plus what is left". (pthread_clockjoin_np takes the monotonic clock, but
    // ThreadSanitizer does not intercept it: its registry would never learn the thread was
    // joined, and a later thread given the same pthread_t fails its CHECK.) Far deadlines
    // are clamped to a year.
    const uint64_t year = 365ull * 24 * 3600 * 1000000000ull;
    struct timespec mono, wall;
    clock_gettime(CLOCK_MONOTONIC, &mono);
    clock_gettime(CLOCK_REALTIME, &wall);
    uint64_t now_ns = (uint64_t)mono.tv_sec * 1000000000ull + (uint64_t)mono.tv_nsec;
    uint64_t left = deadline_ns > now_ns ? deadline_ns - now_ns : 0;
    if (left > year) left = year;
    uint64_t at_ns = (uint64_t)wall.tv_sec * 1000000000ull + (uint64_t)wall.tv_nsec + left;
    struct timespec at = { .tv_sec = (time_t)(at_ns / 1000000000ull), .tv_nsec = (long)(at_ns % 1000000000ull) };
    return pthread_timedjoin_np((pthread_t)thread, NULL, &at);
}

#include <sys/un.h>

/// Fills a sockaddr_un for `path`; returns -1 if the path does not fit in sun_path.
static int pk_fill_sockaddr(struct sockaddr_un *addr, const char *path) {
    size_t len = strlen(path);
    if (len >= sizeof(addr->sun_path)) { errno = ENAMETOOLONG; return -1; }
    memset(addr, 0, sizeof(*addr));
    addr->sun_family = AF_UNIX;
    memcpy(addr->sun_path, path, len + 1);
    return 0;
}

int pk_bind_unix(int fd, const char *path) {
    struct sockaddr_un addr;
    if (pk_fill_sockaddr(&addr, path) < 0) return -1;
    return bind(fd, (struct sockaddr *)&addr, sizeof(addr));
}

int pk_connect_unix(int fd, const char *path) {
    struct sockaddr_un addr;
    if (pk_fill_sockaddr(&addr, path) < 0) return -1;
    return connect(fd, (struct sockaddr *)&addr, sizeof(addr));
}

size_t pk_sun_path_capacity(void) {
    struct sockaddr_un addr;
    return sizeof(addr.sun_path);
}

int pk_lstat_info(const char *path, int follow, unsigned int *mode, unsigned int *uid, uint64_t *ino) {
    struct stat st;
    int rc = follow ? stat(path, &st) : lstat(path, &st);
    if (rc == 0) { *mode = st.st_mode; *uid = st.st_uid; *ino = (uint64_t)st.st_ino; }
    return rc;
}

int pk_fstat_info(int fd, unsigned int *mode, unsigned int *uid, uint64_t *ino) {
    struct stat st;
    int rc = fstat(fd, &st);
    if (rc == 0) { *mode = st.st_mode; *uid = st.st_uid; *ino = (uint64_t)st.st_ino; }
    return rc;
}

/// Reads inotify events and reports whether one names `name` (IN_CREATE / IN_MOVED_TO).
/// Returns -1 with errno on failure (EAGAIN when nothing is pending).
int pk_inotify_saw_name(int fd, const char *name) {
    char buffer[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    int saw = 0;
    for (;;) {
        ssize_t n = read(fd, buffer, sizeof(buffer));
        if (n < 0) return saw ? 1 : -1;
        for (char *p = buffer; p < buffer + n; ) {
            struct inotify_event *ev = (struct inotify_event *)p;
            if (ev->len > 0 && strcmp(ev->name, name) == 0) saw = 1;
            if (ev->mask & IN_Q_OVERFLOW) saw = 1;
            p += sizeof(struct inotify_event) + ev->len;
        }
    }
}

#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>

extern char **environ;

/// posix_spawn(3) of `path` with `argv` and `envp` (NULL: this process's environment); each
/// `from[i]` descriptor becomes `to[i]` in the child (dup2 clears close-on-exec there). The
/// child starts as from a shell: no signal blocked, none ignored. Otherwise it would inherit
/// the calling thread's mask (a thread of Swift concurrency's pool, or libdispatch's, blocks
/// nearly every signal: a worker started from a task could be stopped by SIGKILL alone) and
/// the signals this process ignores.
int pk_spawn(pid_t *pid, const char *path, char *const argv[], char *const envp[],
             const int *from, const int *to, int count) {
    // Each source is first copied above every target (close-on-exec, in this process), so
    // that placing one descriptor never overwrites a source still to be placed (a source that
    // is itself a target number, say 3, after stdin was closed), and no dup2 is from a number
    // to itself (which would leave close-on-exec set).
    int above = 2;
    for (int i = 0; i < count; i++) if (to[i] > above) above = to[i];
    int copies[count > 0 ? count : 1];
    int made = 0, rc = 0;
    for (; made < count; made++) {
        copies[made] = fcntl(from[made], F_DUPFD_CLOEXEC, above + 1);
        if (copies[made] < 0) { rc = errno; break; }
    }
    posix_spawnattr_t attributes;
    int haveAttributes = 0;
    if (rc == 0) {
        sigset_t none, ignored;
        sigemptyset(&none);
        sigemptyset(&ignored);
        for (int sig = 1; sig < NSIG; sig++) {
            struct sigaction current;
            if (sigaction(sig, NULL, &current) == 0 && current.sa_handler == SIG_IGN) sigaddset(&ignored, sig);
        }
        rc = posix_spawnattr_init(&attributes);
        if (rc == 0) {
            haveAttributes = 1;
            rc = posix_spawnattr_setsigmask(&attributes, &none);
        }
        if (rc == 0) rc = posix_spawnattr_setsigdefault(&attributes, &ignored);
        if (rc == 0) rc = posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    }
    posix_spawn_file_actions_t actions;
    if (rc == 0) rc = posix_spawn_file_actions_init(&actions);
    if (rc == 0) {
        for (int i = 0; i < count && rc == 0; i++) rc = posix_spawn_file_actions_adddup2(&actions, copies[i], to[i]);
        if (rc == 0) rc = posix_spawn(pid, path, &actions, &attributes, argv, envp ? envp : environ);
        posix_spawn_file_actions_destroy(&actions);
    }
    if (haveAttributes) posix_spawnattr_destroy(&attributes);
    for (int i = 0; i < made; i++) close(copies[i]);
    return rc;
}

int pk_pidfd_open(pid_t pid) { return (int)syscall(SYS_pidfd_open, pid, 0); }

int pk_pipe_cloexec(int fds[2]) { return pipe2(fds, O_CLOEXEC); }

#include <linux/futex.h>

void pk_futex_wait(uint32_t *word, uint32_t expected) {
    syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

void pk_futex_wake_one(uint32_t *word) {
    syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

int pk_pidfd_reap(int pidfd, int *code, int *signal) {
    siginfo_t info;
    memset(&info, 0, sizeof info);
    if (waitid((idtype_t)P_PIDFD, (id_t)pidfd, &info, WEXITED | WNOHANG) != 0) return -1;
    if (info.si_pid == 0) return 0;
    if (info.si_code == CLD_EXITED) { *code = info.si_status; *signal = 0; }
    else { *code = -1; *signal = info.si_status; }
    return 1;
}

int pk_pidfd_send_signal(int pidfd, int signal) {
    return (int)syscall(SYS_pidfd_send_signal, pidfd, signal, NULL, 0);
}

int pk_unsent_bytes(int fd) {
    int count = 0;
    if (ioctl(fd, SIOCOUTQ, &count) != 0) return -1;
    return count;
}

int pk_prefer_throughput(void) {
    struct sched_param param = { .sched_priority = 0 };
    return sched_setscheduler(0, SCHED_BATCH, &param) == 0 ? 0 : errno;
}

int pk_is_throughput_thread(void) { return sched_getscheduler(0) == SCHED_BATCH; }

#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>

int pk_unix_peer_inode(unsigned long long inode, unsigned long long *peer) {
    int nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (nl < 0) return -1;
    struct {
        struct nlmsghdr header;
        struct unix_diag_req request;
    } query;
    memset(&query, 0, sizeof(query));
    query.header.nlmsg_len = sizeof(query);
    query.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    query.header.nlmsg_flags = NLM_F_REQUEST;
    query.request.sdiag_family = AF_UNIX;
    query.request.udiag_states = ~0U;
    query.request.udiag_ino = (__u32)inode;
    query.request.udiag_show = UDIAG_SHOW_PEER;
    query.request.udiag_cookie[0] = ~0U;  // INET_DIAG_NOCOOKIE: look the socket up by inode alone
    query.request.udiag_cookie[1] = ~0U;
    struct sockaddr_nl kernel;
    memset(&kernel, 0, sizeof(kernel));
    kernel.nl_family = AF_NETLINK;
    int result = -1;
    if (sendto(nl, &query, sizeof(query), 0, (struct sockaddr *)&kernel, sizeof(kernel)) == (ssize_t)sizeof(query)) {
        long buffer[512];
        ssize_t n;
        do { n = recv(nl, buffer, sizeof(buffer), 0); } while (n < 0 && errno == EINTR);
        struct nlmsghdr *header = (struct nlmsghdr *)buffer;
        if (n > 0 && NLMSG_OK(header, (size_t)n)) {
            if (header->nlmsg_type == NLMSG_ERROR) {
                struct nlmsgerr *error = (struct nlmsgerr *)NLMSG_DATA(header);
                errno = error->error < 0 ? -error->error : EIO;
            } else if (header->nlmsg_type == SOCK_DIAG_BY_FAMILY
                       && header->nlmsg_len >= NLMSG_LENGTH(sizeof(struct unix_diag_msg))) {
                struct unix_diag_msg *message = (struct unix_diag_msg *)NLMSG_DATA(header);
                struct rtattr *attribute = (struct rtattr *)(message + 1);
                int left = (int)(header->nlmsg_len - NLMSG_LENGTH(sizeof(*message)));
                result = 0;
                for (; RTA_OK(attribute, left); attribute = RTA_NEXT(attribute, left)) {
                    if (attribute->rta_type == UNIX_DIAG_PEER && RTA_PAYLOAD(attribute) >= sizeof(__u32)) {
                        *peer = *(__u32 *)RTA_DATA(attribute);
                        result = 1;
                    }
                }
            } else {
                errno = EPROTO;
            }
        }
    }
    int saved = errno;
    close(nl);
    errno = saved;
    return result;
}

// MARK: - Calls on a message's way (see the header)

#if defined(__has_feature)
#  if __has_feature(thread_sanitizer)
#    define PK_LIBC_WRAPPERS 1
#  endif
#endif

#ifdef PK_LIBC_WRAPPERS
ssize_t pk_sys_write(int fd, const void *buf, size_t len) { return write(fd, buf, len); }
ssize_t pk_sys_send(int fd, const void *buf, size_t len, int flags) { return send(fd, buf, len, flags); }
ssize_t pk_sys_sendmsg(int fd, const struct msghdr *msg, int flags) { return sendmsg(fd, msg, flags); }
ssize_t pk_sys_recvmsg(int fd, struct msghdr *msg, int flags) { return recvmsg(fd, msg, flags); }
static int pk_sys_epoll_wait(int epfd, struct epoll_event *events, int max, int timeout_ms) {
    return epoll_wait(epfd, events, max, timeout_ms);
}
#else
ssize_t pk_sys_write(int fd, const void *buf, size_t len) { return syscall(SYS_write, fd, buf, len); }
ssize_t pk_sys_send(int fd, const void *buf, size_t len, int flags) {
    return syscall(SYS_sendto, fd, buf, len, flags, NULL, 0);
}
ssize_t pk_sys_sendmsg(int fd, const struct msghdr *msg, int flags) { return syscall(SYS_sendmsg, fd, msg, flags); }
ssize_t pk_sys_recvmsg(int fd, struct msghdr *msg, int flags) { return syscall(SYS_recvmsg, fd, msg, flags); }
// epoll_pwait with no signal mask is epoll_wait (which some architectures, arm64 among them, lack).
static int pk_sys_epoll_wait(int epfd, struct epoll_event *events, int max, int timeout_ms) {
    return (int)syscall(SYS_epoll_pwait, epfd, events, max, timeout_ms, NULL, (size_t)(_NSIG / 8));
}
#endif

int pk_epoll_wait(int epfd, uint32_t *events, uint64_t *data, int max, int timeout_ms) {
    struct epoll_event evs[64];
    if (max > 64) max = 64;
    int n = pk_sys_epoll_wait(epfd, evs, max, timeout_ms);
    for (int i = 0; i < n; i++) {
        events[i] = evs[i].events;
        data[i] = evs[i].data.u64;
    }
    return n;
}

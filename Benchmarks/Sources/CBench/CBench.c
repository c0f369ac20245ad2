// The raw baselines: see CBench.h.

#include "CBench.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

// MARK: - Placement and time

int cb_pin_self(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (cpu < 0) {
        long n = sysconf(_SC_NPROCESSORS_CONF);
        for (long i = 0; i < n && i < CPU_SETSIZE; i++) CPU_SET((int)i, &set);
    } else {
        CPU_SET(cpu, &set);
    }
    return sched_setaffinity(0, sizeof set, &set);
}

int cb_current_cpu(void) { return sched_getcpu(); }

int cb_cpu_count(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
    return CPU_COUNT(&set);
}

uint64_t cb_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

size_t cb_malloc_in_use(void) {
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

long cb_raise_fd_limit(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return -1;
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    getrlimit(RLIMIT_NOFILE, &rl);
    return (long)rl.rlim_cur;
}

// MARK: - Gate

struct cb_gate {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    long work;     // 0: none posted
    int done;
};

cb_gate *cb_gate_new(void) {
    cb_gate *g = calloc(1, sizeof *g);
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->cond, NULL);
    return g;
}

void cb_gate_free(cb_gate *g) {
    if (!g) return;
    pthread_mutex_destroy(&g->lock);
    pthread_cond_destroy(&g->cond);
    free(g);
}

void cb_gate_post(cb_gate *g, long n) {
    pthread_mutex_lock(&g->lock);
    g->work = n;
    g->done = 0;
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->lock);
}

long cb_gate_take(cb_gate *g) {
    pthread_mutex_lock(&g->lock);
    while (g->work == 0) pthread_cond_wait(&g->cond, &g->lock);
    long n = g->work;
    g->work = 0;
    pthread_mutex_unlock(&g->lock);
    return n;
}

void cb_gate_done(cb_gate *g) {
    pthread_mutex_lock(&g->lock);
    g->done = 1;
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->lock);
}

void cb_gate_wait_done(cb_gate *g) {
    pthread_mutex_lock(&g->lock);
    while (!g->done) pthread_cond_wait(&g->cond, &g->lock);
    g->done = 0;
    pthread_mutex_unlock(&g->lock);
}

// MARK: - Socket helpers

static void set_nonblocking(int fd) {
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

int cb_epoll_for(int fd) {
    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) return -1;
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
        close(ep);
        return -1;
    }
    return ep;
}

// Writes on a non-blocking socket, waiting for room with a second epoll instance only if full.
static int write_all_nb(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int ep = epoll_create1(EPOLL_CLOEXEC);
            struct epoll_event ev = {.events = EPOLLOUT, .data.fd = fd};
            epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
            struct epoll_event out;
            epoll_wait(ep, &out, 1, -1);
            close(ep);
            continue;
        }
        return -1;
    }
    return 0;
}

int cb_write_all(int fd, const void *buf, size_t len) { return write_all_nb(fd, buf, len); }

// PKBENCH_C_SHAPED set (`pkbench rt c-processes-shaped`): the round trip's reads take the
// shape of PortKit's, to measure what that shape costs the kernel on its own: `recvmsg` with
// room for descriptors (MSG_CMSG_CLOEXEC) into a 64 KiB area, and EPOLLRDHUP watched.
static int shaped(void) {
    static int value = -1;  // read and written by the round trip's two threads: atomically
    int known = __atomic_load_n(&value, __ATOMIC_RELAXED);
    if (known < 0) {
        known = getenv("PKBENCH_C_SHAPED") != NULL;
        __atomic_store_n(&value, known, __ATOMIC_RELAXED);
    }
    return known;
}

int cb_epoll_for_reading(int fd) {
    int ep = cb_epoll_for(fd);
    if (ep >= 0 && shaped()) {
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.fd = fd};
        epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
    }
    return ep;
}

// One read of at most `len` bytes into `p`. Shaped, it reads what is there into the 64 KiB area
// and keeps the first `len` bytes: enough for a round trip, which has `len` bytes in flight,
// and not for a stream.
static ssize_t read_some(int fd, char *p, size_t len) {
    if (!shaped()) return read(fd, p, len);
    static __thread char area[64 << 10];
    static __thread char control[CMSG_SPACE(17 * sizeof(int))];
    struct iovec iov = {.iov_base = area, .iov_len = sizeof area};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control};
    ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n > 0) memcpy(p, area, (size_t)n < len ? (size_t)n : len);  // a round trip has len bytes in flight
    return n > 0 && (size_t)n > len ? (ssize_t)len : n;
}

int cb_read_exact_epoll(int epfd, int fd, void *buf, size_t len) {
    char *p = buf;
    while (len > 0) {
        struct epoll_event ev;
        int r = epoll_wait(epfd, &ev, 1, -1);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        for (;;) {
            ssize_t n = read_some(fd, p, len);
            if (n > 0) {
                p += n;
                len -= (size_t)n;
                if (len == 0) return 0;
                continue;
            }
            if (n == 0) return -1;
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            return -1;
        }
    }
    return 0;
}

// MARK: - Spawning helpers

int cb_spawn_process(const char *path, char *const argv[]) {
    pid_t pid;
    if (posix_spawn(&pid, path, NULL, NULL, argv, environ) != 0) return -1;
    return pid;
}

int cb_reap(int pid, int timeout_ms) {
    int status = 0;
    for (int waited = 0; waited <= timeout_ms; waited += 5) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) return status;
        if (r < 0) return -1;
        usleep(5000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return status;
}

// Listens at `path`, spawns `helper MODE PATH CPU SIZE`, accepts within 30 s.
static int listen_spawn_accept(const char *helper, const char *mode, const char *path, int cpu, size_t size, int *pid_out) {
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0) return -1;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path) { close(lfd); return -1; }
    strcpy(addr.sun_path, path);
    unlink(path);
    if (bind(lfd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(lfd, 4) != 0) {
        close(lfd);
        return -1;
    }
    char cpu_s[16], size_s[32];
    snprintf(cpu_s, sizeof cpu_s, "%d", cpu);
    snprintf(size_s, sizeof size_s, "%zu", size);
    char *argv[] = {(char *)helper, (char *)mode, (char *)path, cpu_s, size_s, NULL};
    int pid = cb_spawn_process(helper, argv);
    if (pid < 0) { close(lfd); unlink(path); return -1; }
    int ep = cb_epoll_for(lfd);
    struct epoll_event ev;
    int r = epoll_wait(ep, &ev, 1, 30000);
    close(ep);
    int fd = r == 1 ? accept4(lfd, NULL, NULL, SOCK_CLOEXEC) : -1;
    close(lfd);
    unlink(path);
    if (fd < 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    *pid_out = pid;
    return fd;
}

static int connect_to(const char *path) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    strncpy(addr.sun_path, path, sizeof addr.sun_path - 1);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int cb_connect_unix(const char *path) { return connect_to(path); }

// MARK: - Round trip

struct cb_pingpong {
    int fd;           // the client's end
    int peer_fd;      // the echo thread's end (threads), or -1
    int pid;          // the echo process (processes), or -1
    size_t size;
    int client_cpu, server_cpu;
    pthread_t client, server;
    int has_server;
    cb_gate *gate;
    int failed;
    int64_t elapsed;
};

static void *echo_thread(void *arg) {
    cb_pingpong *pp = arg;
    cb_pin_self(pp->server_cpu);
    int ep = cb_epoll_for_reading(pp->peer_fd);
    char *buf = malloc(pp->size);
    while (cb_read_exact_epoll(ep, pp->peer_fd, buf, pp->size) == 0) {
        if (write_all_nb(pp->peer_fd, buf, pp->size) != 0) break;
    }
    free(buf);
    close(ep);
    return NULL;
}

static void *rt_client_thread(void *arg) {
    cb_pingpong *pp = arg;
    cb_pin_self(pp->client_cpu);
    int ep = cb_epoll_for_reading(pp->fd);
    char *buf = calloc(1, pp->size);
    for (;;) {
        long n = cb_gate_take(pp->gate);
        if (n < 0) break;
        uint64_t start = cb_now_ns();
        for (long i = 0; i < n && !pp->failed; i++) {
            if (write_all_nb(pp->fd, buf, pp->size) != 0 || cb_read_exact_epoll(ep, pp->fd, buf, pp->size) != 0) pp->failed = 1;
        }
        pp->elapsed = (int64_t)(cb_now_ns() - start);
        cb_gate_done(pp->gate);
    }
    free(buf);
    close(ep);
    return NULL;
}

static cb_pingpong *pingpong_start(cb_pingpong *pp) {
    set_nonblocking(pp->fd);
    pp->gate = cb_gate_new();
    pthread_create(&pp->client, NULL, rt_client_thread, pp);
    return pp;
}

cb_pingpong *cb_sp_rt_new(int client_cpu, int server_cpu, size_t size) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return NULL;
    cb_pingpong *pp = calloc(1, sizeof *pp);
    pp->fd = sv[0];
    pp->peer_fd = sv[1];
    pp->pid = -1;
    pp->size = size;
    pp->client_cpu = client_cpu;
    pp->server_cpu = server_cpu;
    set_nonblocking(pp->peer_fd);
    pthread_create(&pp->server, NULL, echo_thread, pp);
    pp->has_server = 1;
    return pingpong_start(pp);
}

cb_pingpong *cb_un_rt_new(const char *helper, const char *path, int client_cpu, int server_cpu, size_t size) {
    int pid = -1;
    int fd = listen_spawn_accept(helper, "c-echo", path, server_cpu, size, &pid);
    if (fd < 0) return NULL;
    cb_pingpong *pp = calloc(1, sizeof *pp);
    pp->fd = fd;
    pp->peer_fd = -1;
    pp->pid = pid;
    pp->size = size;
    pp->client_cpu = client_cpu;
    pp->server_cpu = server_cpu;
    return pingpong_start(pp);
}

int64_t cb_rt_run(cb_pingpong *pp, long n) {
    cb_gate_post(pp->gate, n);
    cb_gate_wait_done(pp->gate);
    return pp->failed ? -1 : pp->elapsed;
}

void cb_rt_free(cb_pingpong *pp) {
    if (!pp) return;
    cb_gate_post(pp->gate, -1);
    pthread_join(pp->client, NULL);
    shutdown(pp->fd, SHUT_RDWR);
    if (pp->has_server) pthread_join(pp->server, NULL);
    close(pp->fd);
    if (pp->peer_fd >= 0) close(pp->peer_fd);
    if (pp->pid > 0) cb_reap(pp->pid, 5000);
    cb_gate_free(pp->gate);
    free(pp);
}

int cb_un_echo_serve(const char *path, int cpu, size_t size) {
    cb_pin_self(cpu);
    int fd = connect_to(path);
    if (fd < 0) return 2;
    set_nonblocking(fd);
    int ep = cb_epoll_for_reading(fd);
    char *buf = malloc(size);
    while (cb_read_exact_epoll(ep, fd, buf, size) == 0) {
        if (write_all_nb(fd, buf, size) != 0) break;
    }
    return 0;
}

// MARK: - Stream

struct cb_stream {
    int fd;          // the sender's end
    int peer_fd;     // the receiver thread's end, or -1
    int pid;
    size_t size;
    int sender_cpu, receiver_cpu;
    pthread_t sender, receiver;
    int has_receiver;
    cb_gate *gate;
    int failed;
    int64_t elapsed;
};

#define SINK_BUFFER (64 * 1024)

// Reads the stream, walking message boundaries; acknowledges each flagged message with a byte.
static int sink_loop(int fd, size_t size) {
    int ep = cb_epoll_for(fd);
    char *buf = malloc(SINK_BUFFER);
    size_t offset = 0;  // position within the current message
    for (;;) {
        struct epoll_event ev;
        int r = epoll_wait(ep, &ev, 1, -1);
        if (r < 0) {
            if (errno == EINTR) continue;
            break;
        }
        for (;;) {
            ssize_t n = read(fd, buf, SINK_BUFFER);
            if (n == 0) goto out;
            if (n < 0) {
                if (errno == EINTR) continue;
                if (errno == EAGAIN || errno == EWOULDBLOCK) break;
                goto out;
            }
            size_t i = 0;
            while (i < (size_t)n) {
                if (offset == 0 && buf[i] == 1) {
                    char ack = 1;
                    if (write_all_nb(fd, &ack, 1) != 0) goto out;
                }
                size_t take = size - offset;
                if (take > (size_t)n - i) take = (size_t)n - i;
                i += take;
                offset = (offset + take) % size;
            }
        }
    }
out:
    free(buf);
    close(ep);
    return 0;
}

static void *sink_thread(void *arg) {
    cb_stream *st = arg;
    cb_pin_self(st->receiver_cpu);
    sink_loop(st->peer_fd, st->size);
    return NULL;
}

static void *stream_sender_thread(void *arg) {
    cb_stream *st = arg;
    cb_pin_self(st->sender_cpu);
    int ep = cb_epoll_for(st->fd);
    char *msg = calloc(1, st->size);
    for (;;) {
        long n = cb_gate_take(st->gate);
        if (n < 0) break;
        uint64_t start = cb_now_ns();
        for (long i = 0; i < n && !st->failed; i++) {
            msg[0] = (i == n - 1) ? 1 : 0;
            if (write_all_nb(st->fd, msg, st->size) != 0) st->failed = 1;
        }
        char ack;
        if (!st->failed && cb_read_exact_epoll(ep, st->fd, &ack, 1) != 0) st->failed = 1;
        st->elapsed = (int64_t)(cb_now_ns() - start);
        cb_gate_done(st->gate);
    }
    free(msg);
    close(ep);
    return NULL;
}

static cb_stream *stream_start(cb_stream *st) {
    set_nonblocking(st->fd);
    st->gate = cb_gate_new();
    pthread_create(&st->sender, NULL, stream_sender_thread, st);
    return st;
}

cb_stream *cb_sp_stream_new(int sender_cpu, int receiver_cpu, size_t size) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return NULL;
    cb_stream *st = calloc(1, sizeof *st);
    st->fd = sv[0];
    st->peer_fd = sv[1];
    st->pid = -1;
    st->size = size;
    st->sender_cpu = sender_cpu;
    st->receiver_cpu = receiver_cpu;
    set_nonblocking(st->peer_fd);
    pthread_create(&st->receiver, NULL, sink_thread, st);
    st->has_receiver = 1;
    return stream_start(st);
}

cb_stream *cb_un_stream_new(const char *helper, const char *path, int sender_cpu, int receiver_cpu, size_t size) {
    int pid = -1;
    int fd = listen_spawn_accept(helper, "c-sink", path, receiver_cpu, size, &pid);
    if (fd < 0) return NULL;
    cb_stream *st = calloc(1, sizeof *st);
    st->fd = fd;
    st->peer_fd = -1;
    st->pid = pid;
    st->size = size;
    st->sender_cpu = sender_cpu;
    st->receiver_cpu = receiver_cpu;
    return stream_start(st);
}

int64_t cb_stream_run(cb_stream *st, long n) {
    cb_gate_post(st->gate, n);
    cb_gate_wait_done(st->gate);
    return st->failed ? -1 : st->elapsed;
}

void cb_stream_free(cb_stream *st) {
    if (!st) return;
    cb_gate_post(st->gate, -1);
    pthread_join(st->sender, NULL);
    shutdown(st->fd, SHUT_RDWR);
    if (st->has_receiver) pthread_join(st->receiver, NULL);
    close(st->fd);
    if (st->peer_fd >= 0) close(st->peer_fd);
    if (st->pid > 0) cb_reap(st->pid, 5000);
    cb_gate_free(st->gate);
    free(st);
}

int cb_un_sink_serve(const char *path, int cpu, size_t size) {
    cb_pin_self(cpu);
    int fd = connect_to(path);
    if (fd < 0) return 2;
    set_nonblocking(fd);
    sink_loop(fd, size);
    return 0;
}

// MARK: - Spawn

struct cb_spawn {
    int sv[2];
    int cpu;
    pthread_t thread;
    int started;
};

cb_spawn *cb_spawn_prepare(void) {
    cb_spawn *sp = calloc(1, sizeof *sp);
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp->sv) != 0) {
        free(sp);
        return NULL;
    }
    return sp;
}

static void *spawn_body(void *arg) {
    cb_spawn *sp = arg;
    if (sp->cpu >= 0) cb_pin_self(sp->cpu);
    char byte = 100;
    (void)!write(sp->sv[1], &byte, 1);
    return NULL;
}

int cb_spawn_go(cb_spawn *sp, int cpu) {
    sp->cpu = cpu;
    if (pthread_create(&sp->thread, NULL, spawn_body, sp) != 0) return -1;
    sp->started = 1;
    char byte;
    return read(sp->sv[0], &byte, 1) == 1 ? 0 : -1;
}

void cb_spawn_finish(cb_spawn *sp) {
    if (!sp) return;
    if (sp->started) pthread_join(sp->thread, NULL);
    close(sp->sv[0]);
    close(sp->sv[1]);
    free(sp);
}

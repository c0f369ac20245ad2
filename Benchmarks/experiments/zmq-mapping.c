// What a round trip between two processes costs over libzmq `tcp://` loopback (or `ipc://`)
// in each way of mapping ports onto sockets, raw libzmq, no PortKit:
//
//   pair      one PAIR connection (the benchmark's baseline)
//   pushpull  two PUSH -> PULL connections, one per direction (PortKit's mapping, protocol.md 10.1)
//   router    one DEALER -> ROUTER connection; the ROUTER answers by the routing id
//
// and each of them read as PortKit reads (`-fd`): sleep in epoll on ZMQ_FD, then receive without
// blocking until EAGAIN (protocol.md 10.8), instead of a blocking zmq_recv.
//
// Both processes and their libzmq I/O threads are pinned to CPU 0 (argument 3 changes it; -1 for
// one side per CPU: the parent on 0, the child on 1). The modes alternate, round after round,
// and the median of each mode's rounds is printed with its ratio to pair.
//
//   cc -O2 -o /tmp/zmq-mapping Benchmarks/experiments/zmq-mapping.c -lzmq
//   /tmp/zmq-mapping tcp 20000 0     # or: ipc 20000 0, tcp 20000 -1
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

enum { PAIR, PUSHPULL, ROUTER, MODES };
static const char *names[MODES] = {"pair", "pushpull", "router"};

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof set, &set);
}

static int use_fd;  // read as PortKit does

// Receives one frame from `sock` into buf: blocking, or PortKit's way (epoll on ZMQ_FD).
static int recv_one(void *sock, int ep, char *buf, size_t cap) {
    if (!use_fd) return zmq_recv(sock, buf, cap, 0);
    for (;;) {
        int n = zmq_recv(sock, buf, cap, ZMQ_DONTWAIT);
        if (n >= 0) return n;
        if (errno != EAGAIN) return -1;
        struct epoll_event ev;
        if (epoll_wait(ep, &ev, 1, -1) < 0 && errno != EINTR) return -1;
    }
}

static int watch(void *sock) {
    int fd;
    size_t len = sizeof fd;
    zmq_getsockopt(sock, ZMQ_FD, &fd, &len);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLET};
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    return ep;
}

static void linger0(void *sock) {
    int zero = 0;
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
}

static char endpoint_a[256], endpoint_b[256];  // a: the parent's bound endpoint, b: the child's

static void make_endpoints(const char *kind, int mode) {
    if (strcmp(kind, "tcp") == 0) {
        snprintf(endpoint_a, sizeof endpoint_a, "tcp://127.0.0.1:%d", 47100 + 2 * mode);
        snprintf(endpoint_b, sizeof endpoint_b, "tcp://127.0.0.1:%d", 47101 + 2 * mode);
    } else {
        snprintf(endpoint_a, sizeof endpoint_a, "ipc://@zmq-mapping-%d-a-%d", getpid(), mode);
        snprintf(endpoint_b, sizeof endpoint_b, "ipc://@zmq-mapping-%d-b-%d", getpid(), mode);
    }
}

// The echoing child: answers every frame until killed.
static void serve(int mode, int cpu) {
    pin(cpu);
    void *ctx = zmq_ctx_new();
    void *in, *out;
    char id[256], buf[256];
    size_t idlen = 0;
    if (mode == PAIR) {
        in = out = zmq_socket(ctx, ZMQ_PAIR);
        zmq_connect(in, endpoint_a);
    } else if (mode == PUSHPULL) {
        in = zmq_socket(ctx, ZMQ_PULL);
        zmq_bind(in, endpoint_b);
        out = zmq_socket(ctx, ZMQ_PUSH);
        zmq_connect(out, endpoint_a);
    } else {
        in = out = zmq_socket(ctx, ZMQ_ROUTER);
        zmq_bind(in, endpoint_b);
    }
    int ep = watch(in);
    for (;;) {
        if (mode == ROUTER) {
            int n = recv_one(in, ep, id, sizeof id);
            if (n < 0) break;
            idlen = (size_t)n;
        }
        int n = recv_one(in, ep, buf, sizeof buf);
        if (n < 0) break;
        if (mode == ROUTER && zmq_send(out, id, idlen, ZMQ_SNDMORE) < 0) break;
        if (zmq_send(out, buf, (size_t)n, 0) < 0) break;
    }
    _exit(0);
}

typedef struct {
    void *ctx, *in, *out;
    int ep, pid;
} client;

static client start(int mode, int cpu, int child_cpu) {
    client c = {0};
    pin(cpu);
    c.ctx = zmq_ctx_new();
    if (mode == PAIR) {
        c.in = c.out = zmq_socket(c.ctx, ZMQ_PAIR);
        zmq_bind(c.in, endpoint_a);
    } else if (mode == PUSHPULL) {
        c.in = zmq_socket(c.ctx, ZMQ_PULL);
        zmq_bind(c.in, endpoint_a);
        c.out = zmq_socket(c.ctx, ZMQ_PUSH);
        zmq_connect(c.out, endpoint_b);
    } else {
        c.in = c.out = zmq_socket(c.ctx, ZMQ_DEALER);
        zmq_connect(c.in, endpoint_b);
    }
    linger0(c.in);
    if (c.out != c.in) linger0(c.out);
    c.ep = watch(c.in);
    c.pid = fork();
    if (c.pid == 0) serve(mode, child_cpu);
    return c;
}

static double round_us(client *c, long n) {
    char buf[64] = {0};
    uint64_t t0 = now_ns();
    for (long i = 0; i < n; i++) {
        if (zmq_send(c->out, buf, sizeof buf, 0) < 0 || recv_one(c->in, c->ep, buf, sizeof buf) < 0) {
            perror("round trip");
            exit(1);
        }
    }
    return (double)(now_ns() - t0) / 1000.0 / (double)n;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const char *kind = argc > 1 ? argv[1] : "tcp";
    long n = argc > 2 ? atol(argv[2]) : 20000;
    int cpu = argc > 3 ? atoi(argv[3]) : 0;
    int parent_cpu = cpu < 0 ? 0 : cpu, child_cpu = cpu < 0 ? 1 : cpu;
    enum { ROUNDS = 7 };
    for (use_fd = 0; use_fd <= 1; use_fd++) {
        client clients[MODES];
        for (int m = 0; m < MODES; m++) {
            make_endpoints(kind, m + 3 * use_fd);
            clients[m] = start(m, parent_cpu, child_cpu);
            round_us(&clients[m], n / 10);  // connect and warm up
        }
        double t[MODES][ROUNDS];
        for (int r = 0; r < ROUNDS; r++)
            for (int m = 0; m < MODES; m++) t[m][r] = round_us(&clients[m], n);
        double pair = 0;
        for (int m = 0; m < MODES; m++) {
            qsort(t[m], ROUNDS, sizeof t[m][0], cmp);
            double median = t[m][ROUNDS / 2];
            if (m == PAIR) pair = median;
            printf("%s %-9s%s %8.2f us  %.2f x pair\n", kind, names[m], use_fd ? "-fd" : "   ", median,
                   median / pair);
            kill(clients[m].pid, SIGKILL);
            waitpid(clients[m].pid, NULL, 0);
        }
    }
    return 0;
}

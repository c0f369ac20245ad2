// What a same-CPU process round trip pays for the code and data it touches, in raw C: two
// processes, both pinned to CPU 0, pass 64 bytes back and forth over a Unix socketpair (epoll,
// read, write, as `pkbench rt c-processes`), and after each message each side runs K distinct
// 64-byte lines of code and reads D distinct data lines. The lines are a chain of direct jumps
// (`jumps`: one instruction a line, every branch predictable), or each a `ret` called in turn
// from one loop (`calls`: an indirect call a line, whose target the predictor must learn). It shows what bounds PortKit's process round trip on one CPU (docs/performance.md):
// after the switch to the other process the lines a message runs are fetched again.
//
//   cc -O2 -o /tmp/footprint Benchmarks/experiments/footprint.c
//   /tmp/footprint K D [jumps|calls [STRIDE [N]]]   e.g. /tmp/footprint 0 0; /tmp/footprint 260 0 calls
//
// STRIDE (default 64) spaces the code lines; 384 spreads them over six times the pages.
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <stdint.h>
#include <unistd.h>

typedef void (*line_fn)(void);
static unsigned char *code;
static volatile unsigned char *data;
static int K, D, STRIDE, CALLS;

static void touch(void) {
    if (CALLS) {
        for (int i = 0; i < K; i++) ((line_fn)(code + (size_t)i * STRIDE))();
    } else if (K > 0) {
        ((line_fn)code)();
    }
    unsigned sum = 0;
    for (int i = 0; i < D; i++) sum += data[(size_t)i * 64 * 3];  // every third line
    if (sum == 12345) puts("");
}

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static void wait_readable(int ep) {
    struct epoll_event event;
    while (epoll_wait(ep, &event, 1, -1) != 1) {}
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s K D [jumps|calls [STRIDE [N]]]\n", argv[0]);
        return 2;
    }
    K = atoi(argv[1]);
    D = atoi(argv[2]);
    CALLS = argc > 3 && strcmp(argv[3], "calls") == 0;
    STRIDE = argc > 4 ? atoi(argv[4]) : 64;
    int n = argc > 5 ? atoi(argv[5]) : 100000;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(0, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) perror("sched_setaffinity");
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) { perror("socketpair"); return 1; }
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); return 1; }
    int fd = pid == 0 ? sv[1] : sv[0];
    close(pid == 0 ? sv[0] : sv[1]);  // so that the echo side sees the end of the stream
    size_t code_size = (size_t)(K + 1) * STRIDE + 4096;
    code = mmap(0, code_size, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    size_t data_size = (size_t)(D + 1) * 64 * 3 + 4096;
    data = mmap(0, data_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (code == MAP_FAILED || data == MAP_FAILED) { perror("mmap"); return 1; }
    for (int i = 0; i < K; i++) {  // jumps: each line jumps to the next, the last returns
        unsigned char *line = code + (size_t)i * STRIDE;
        if (CALLS || i == K - 1) {
            line[0] = 0xC3;  // ret
        } else {
            int32_t to_next = STRIDE - 5;
            line[0] = 0xE9;  // jmp rel32
            memcpy(line + 1, &to_next, sizeof to_next);
        }
    }
    memset((void *)data, 1, data_size);
    int ep = epoll_create1(0);
    struct epoll_event want = {.events = EPOLLIN};
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &want);
    char message[64] = {0};
    if (pid == 0) {  // the echo side
        for (;;) {
            wait_readable(ep);
            if (read(fd, message, sizeof message) <= 0) _exit(0);
            touch();
            if (write(fd, message, sizeof message) != sizeof message) _exit(1);
        }
    }
    double start = 0;
    for (int i = -2000; i < n; i++) {  // 2,000 to warm up
        if (i == 0) start = now_ns();
        if (write(fd, message, sizeof message) != sizeof message) return 1;
        wait_readable(ep);
        if (read(fd, message, sizeof message) != sizeof message) return 1;
        touch();
    }
    double elapsed = now_ns() - start;
    close(fd);
    waitpid(pid, 0, 0);
    printf("K=%d D=%d %s stride=%d: %.2f us per round trip\n", K, D, CALLS ? "calls" : "jumps", STRIDE,
           elapsed / n / 1000);
    return 0;
}

// The raw libzmq baselines: see CZMQBench.h.

#include "CZMQBench.h"
#include "CBench.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

static int counter;

// libzmq starts its I/O thread when the first socket is made, and that thread inherits the
// affinity of the thread making it: make contexts and sockets pinned like the side that uses
// them, so that libzmq's own threads follow the placement as PortKit's and the C baselines' do.
typedef struct {
    cpu_set_t saved;
} pin_scope;

static void pin_begin(pin_scope *scope, int cpu) {
    sched_getaffinity(0, sizeof scope->saved, &scope->saved);
    cb_pin_self(cpu);
}

static void pin_end(pin_scope *scope) { sched_setaffinity(0, sizeof scope->saved, &scope->saved); }

// MARK: - Round trip

struct cz_rt {
    void *ctx;
    void *sock;        // the client's socket
    void *peer;        // the echo thread's socket (inproc), or NULL
    int pid;
    size_t size;
    int client_cpu, server_cpu;
    pthread_t client, server;
    int has_server;
    cb_gate *gate;
    int failed;
    int64_t elapsed;
    char bound[256];   // the ipc:// or tcp:// endpoint the client bound, or empty
};

static void echo_loop(void *sock, size_t size) {
    char *buf = malloc(size);
    for (;;) {
        int n = zmq_recv(sock, buf, size, 0);
        if (n < 0) break;
        if (zmq_send(sock, buf, (size_t)n, 0) < 0) break;
    }
    free(buf);
}

static void *cz_echo_thread(void *arg) {
    cz_rt *rt = arg;
    cb_pin_self(rt->server_cpu);
    echo_loop(rt->peer, rt->size);
    return NULL;
}

static void *cz_rt_client(void *arg) {
    cz_rt *rt = arg;
    cb_pin_self(rt->client_cpu);
    char *buf = calloc(1, rt->size);
    for (;;) {
        long n = cb_gate_take(rt->gate);
        if (n < 0) break;
        uint64_t start = cb_now_ns();
        for (long i = 0; i < n && !rt->failed; i++) {
            if (zmq_send(rt->sock, buf, rt->size, 0) < 0 || zmq_recv(rt->sock, buf, rt->size, 0) < 0) rt->failed = 1;
        }
        rt->elapsed = (int64_t)(cb_now_ns() - start);
        cb_gate_done(rt->gate);
    }
    free(buf);
    return NULL;
}

static void set_linger0(void *sock) {
    int zero = 0;
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
}

cz_rt *cz_inproc_rt_new(int client_cpu, int server_cpu, size_t size) {
    cz_rt *rt = calloc(1, sizeof *rt);
    pin_scope scope;
    pin_begin(&scope, client_cpu);
    rt->ctx = zmq_ctx_new();
    rt->sock = zmq_socket(rt->ctx, ZMQ_PAIR);
    rt->peer = zmq_socket(rt->ctx, ZMQ_PAIR);
    pin_end(&scope);
    set_linger0(rt->sock);
    set_linger0(rt->peer);
    char endpoint[64];
    snprintf(endpoint, sizeof endpoint, "inproc://pkbench-rt-%d", __sync_fetch_and_add(&counter, 1));
    if (zmq_bind(rt->sock, endpoint) != 0 || zmq_connect(rt->peer, endpoint) != 0) {
        zmq_close(rt->sock);
        zmq_close(rt->peer);
        zmq_ctx_term(rt->ctx);
        free(rt);
        return NULL;
    }
    rt->pid = -1;
    rt->size = size;
    rt->client_cpu = client_cpu;
    rt->server_cpu = server_cpu;
    rt->gate = cb_gate_new();
    pthread_create(&rt->server, NULL, cz_echo_thread, rt);
    rt->has_server = 1;
    pthread_create(&rt->client, NULL, cz_rt_client, rt);
    return rt;
}

static int bind_and_name(void *sock, const char *endpoint, char *actual, size_t cap) {
    actual[0] = 0;
    if (zmq_bind(sock, endpoint) != 0) return -1;
    snprintf(actual, cap, "%s", endpoint);  // what to remove, should the name not come back
    size_t len = cap;
    if (zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, actual, &len) != 0) return -1;
    return 0;
}

// libzmq 4.3.4 leaves the socket file of a bound ipc:// path behind when the socket closes (it
// removes only those of wildcard binds): remove it once the context is gone, so that no run
// leaves files in /tmp. (An abstract name, ipc://@..., has no file.)
static void remove_ipc_file(const char *endpoint) {
    if (strncmp(endpoint, "ipc:///", 7) == 0) unlink(endpoint + 6);
}

cz_rt *cz_proc_rt_new(const char *helper, const char *endpoint, int client_cpu, int server_cpu, size_t size) {
    cz_rt *rt = calloc(1, sizeof *rt);
    pin_scope scope;
    pin_begin(&scope, client_cpu);
    rt->ctx = zmq_ctx_new();
    rt->sock = zmq_socket(rt->ctx, ZMQ_PAIR);
    pin_end(&scope);
    set_linger0(rt->sock);
    char *actual = rt->bound;
    if (bind_and_name(rt->sock, endpoint, actual, sizeof rt->bound) != 0) {
        zmq_close(rt->sock);
        zmq_ctx_term(rt->ctx);
        remove_ipc_file(actual);
        free(rt);
        return NULL;
    }
    char cpu_s[16], size_s[32];
    snprintf(cpu_s, sizeof cpu_s, "%d", server_cpu);
    snprintf(size_s, sizeof size_s, "%zu", size);
    char *argv[] = {(char *)helper, "zmq-echo", actual, cpu_s, size_s, NULL};
    rt->pid = cb_spawn_process(helper, argv);
    rt->size = size;
    rt->client_cpu = client_cpu;
    rt->server_cpu = server_cpu;
    rt->gate = cb_gate_new();
    pthread_create(&rt->client, NULL, cz_rt_client, rt);
    return rt;
}

int64_t cz_rt_run(cz_rt *rt, long n) {
    cb_gate_post(rt->gate, n);
    cb_gate_wait_done(rt->gate);
    return rt->failed ? -1 : rt->elapsed;
}

void cz_rt_free(cz_rt *rt) {
    if (!rt) return;
    cb_gate_post(rt->gate, -1);
    pthread_join(rt->client, NULL);
    zmq_close(rt->sock);
    if (rt->pid > 0) {
        // The helper blocks in zmq_recv and cannot see the PAIR close: end it.
        kill(rt->pid, 9);
        cb_reap(rt->pid, 5000);
    }
    if (rt->has_server) {
        zmq_ctx_shutdown(rt->ctx);  // wakes the echo thread's zmq_recv with ETERM
        pthread_join(rt->server, NULL);
        zmq_close(rt->peer);
    }
    zmq_ctx_term(rt->ctx);
    remove_ipc_file(rt->bound);
    cb_gate_free(rt->gate);
    free(rt);
}

int cz_echo_serve(const char *endpoint, int cpu, size_t size) {
    cb_pin_self(cpu);
    void *ctx = zmq_ctx_new();
    void *sock = zmq_socket(ctx, ZMQ_PAIR);
    if (zmq_connect(sock, endpoint) != 0) return 2;
    echo_loop(sock, size);
    return 0;
}

// MARK: - Stream

struct cz_stream {
    void *ctx;
    void *out;       // the sender's socket (PAIR or PUSH)
    void *ack;       // where the acknowledgement arrives (PAIR: out itself; PUSH/PULL: a PULL)
    void *peer;      // the receiver thread's PAIR (inproc), or NULL
    int pid;
    size_t size;
    int sender_cpu, receiver_cpu;
    pthread_t sender, receiver;
    int has_receiver;
    cb_gate *gate;
    int failed;
    int64_t elapsed;
    char bound[256], bound_ack[256];   // the endpoints the sender bound, or empty
};

static void sink_loop(void *in, void *ack_out, size_t size) {
    char *buf = malloc(size);
    for (;;) {
        int n = zmq_recv(in, buf, size, 0);
        if (n < 0) break;
        if (n > 0 && buf[0] == 1) {
            char ack = 1;
            if (zmq_send(ack_out, &ack, 1, 0) < 0) break;
        }
    }
    free(buf);
}

static void *cz_sink_thread(void *arg) {
    cz_stream *st = arg;
    cb_pin_self(st->receiver_cpu);
    sink_loop(st->peer, st->peer, st->size);
    return NULL;
}

static void *cz_stream_sender(void *arg) {
    cz_stream *st = arg;
    cb_pin_self(st->sender_cpu);
    char *msg = calloc(1, st->size);
    for (;;) {
        long n = cb_gate_take(st->gate);
        if (n < 0) break;
        uint64_t start = cb_now_ns();
        for (long i = 0; i < n && !st->failed; i++) {
            msg[0] = (i == n - 1) ? 1 : 0;
            if (zmq_send(st->out, msg, st->size, 0) < 0) st->failed = 1;
        }
        char ack;
        if (!st->failed && zmq_recv(st->ack, &ack, 1, 0) < 0) st->failed = 1;
        st->elapsed = (int64_t)(cb_now_ns() - start);
        cb_gate_done(st->gate);
    }
    free(msg);
    return NULL;
}

cz_stream *cz_inproc_stream_new(int sender_cpu, int receiver_cpu, size_t size) {
    cz_stream *st = calloc(1, sizeof *st);
    pin_scope scope;
    pin_begin(&scope, sender_cpu);
    st->ctx = zmq_ctx_new();
    st->out = zmq_socket(st->ctx, ZMQ_PAIR);
    st->peer = zmq_socket(st->ctx, ZMQ_PAIR);
    pin_end(&scope);
    set_linger0(st->out);
    set_linger0(st->peer);
    st->ack = st->out;
    char endpoint[64];
    snprintf(endpoint, sizeof endpoint, "inproc://pkbench-stream-%d", __sync_fetch_and_add(&counter, 1));
    if (zmq_bind(st->out, endpoint) != 0 || zmq_connect(st->peer, endpoint) != 0) {
        zmq_close(st->out);
        zmq_close(st->peer);
        zmq_ctx_term(st->ctx);
        free(st);
        return NULL;
    }
    st->pid = -1;
    st->size = size;
    st->sender_cpu = sender_cpu;
    st->receiver_cpu = receiver_cpu;
    st->gate = cb_gate_new();
    pthread_create(&st->receiver, NULL, cz_sink_thread, st);
    st->has_receiver = 1;
    pthread_create(&st->sender, NULL, cz_stream_sender, st);
    return st;
}

cz_stream *cz_proc_stream_new(const char *helper, const char *endpoint, const char *ack_endpoint, int sender_cpu, int receiver_cpu, size_t size) {
    cz_stream *st = calloc(1, sizeof *st);
    pin_scope scope;
    pin_begin(&scope, sender_cpu);
    st->ctx = zmq_ctx_new();
    st->out = zmq_socket(st->ctx, ZMQ_PUSH);
    st->ack = zmq_socket(st->ctx, ZMQ_PULL);
    pin_end(&scope);
    set_linger0(st->out);
    set_linger0(st->ack);
    char *actual = st->bound, *actual_ack = st->bound_ack;
    if (bind_and_name(st->out, endpoint, actual, sizeof st->bound) != 0 ||
        bind_and_name(st->ack, ack_endpoint, actual_ack, sizeof st->bound_ack) != 0) {
        zmq_close(st->out);
        zmq_close(st->ack);
        zmq_ctx_term(st->ctx);
        remove_ipc_file(actual);
        remove_ipc_file(actual_ack);
        free(st);
        return NULL;
    }
    char cpu_s[16], size_s[32];
    snprintf(cpu_s, sizeof cpu_s, "%d", receiver_cpu);
    snprintf(size_s, sizeof size_s, "%zu", size);
    char *argv[] = {(char *)helper, "zmq-sink", actual, actual_ack, cpu_s, size_s, NULL};
    st->pid = cb_spawn_process(helper, argv);
    st->size = size;
    st->sender_cpu = sender_cpu;
    st->receiver_cpu = receiver_cpu;
    st->gate = cb_gate_new();
    pthread_create(&st->sender, NULL, cz_stream_sender, st);
    return st;
}

int64_t cz_stream_run(cz_stream *st, long n) {
    cb_gate_post(st->gate, n);
    cb_gate_wait_done(st->gate);
    return st->failed ? -1 : st->elapsed;
}

void cz_stream_free(cz_stream *st) {
    if (!st) return;
    cb_gate_post(st->gate, -1);
    pthread_join(st->sender, NULL);
    if (st->pid > 0) {
        // SIGTERM, so that a receiver under callgrind writes its counts (cb_reap kills it if
        // it has not ended within 30 s).
        kill(st->pid, SIGTERM);
        cb_reap(st->pid, 30000);
    }
    zmq_close(st->out);
    if (st->ack != st->out) zmq_close(st->ack);
    if (st->has_receiver) {
        zmq_ctx_shutdown(st->ctx);
        pthread_join(st->receiver, NULL);
        zmq_close(st->peer);
    }
    zmq_ctx_term(st->ctx);
    remove_ipc_file(st->bound);
    remove_ipc_file(st->bound_ack);
    cb_gate_free(st->gate);
    free(st);
}

int cz_sink_serve(const char *endpoint, const char *ack_endpoint, int cpu, size_t size) {
    cb_pin_self(cpu);
    void *ctx = zmq_ctx_new();
    void *in = zmq_socket(ctx, ZMQ_PULL);
    void *out = zmq_socket(ctx, ZMQ_PUSH);
    if (zmq_connect(in, endpoint) != 0 || zmq_connect(out, ack_endpoint) != 0) return 2;
    sink_loop(in, out, size);
    return 0;
}

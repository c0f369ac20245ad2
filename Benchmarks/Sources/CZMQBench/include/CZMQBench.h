// The raw libzmq baselines (this package's `ZeroMQ` trait): the same round trips and streams as
// CBench, through plain libzmq calls, each side blocking in zmq_recv as a libzmq program does.

#ifndef CZMQBENCH_H
#define CZMQBENCH_H

#include <stddef.h>
#include <stdint.h>

typedef struct cz_rt cz_rt;
/// PAIR over inproc:// between two threads.
cz_rt *cz_inproc_rt_new(int client_cpu, int server_cpu, size_t size);
/// PAIR between processes: binds `endpoint` ("ipc:///path" or "tcp://127.0.0.1:*"), spawns
/// `helper zmq-echo ENDPOINT SERVER_CPU SIZE`.
cz_rt *cz_proc_rt_new(const char *helper, const char *endpoint, int client_cpu, int server_cpu, size_t size);
/// `n` round trips; the nanoseconds they took on the client thread, or -1.
int64_t cz_rt_run(cz_rt *rt, long n);
void cz_rt_free(cz_rt *rt);

typedef struct cz_stream cz_stream;
/// PAIR over inproc:// between two threads, one zmq_send per message.
cz_stream *cz_inproc_stream_new(int sender_cpu, int receiver_cpu, size_t size);
/// PUSH/PULL between processes over `endpoint` (ipc://), the acknowledgement over `ack_endpoint`:
/// spawns `helper zmq-sink ENDPOINT ACK_ENDPOINT RECEIVER_CPU SIZE`.
cz_stream *cz_proc_stream_new(const char *helper, const char *endpoint, const char *ack_endpoint, int sender_cpu, int receiver_cpu, size_t size);
/// Sends `n` messages, waits for the acknowledgement of the last; nanoseconds, or -1.
int64_t cz_stream_run(cz_stream *st, long n);
void cz_stream_free(cz_stream *st);

/// The helper process's halves; each returns an exit status.
int cz_echo_serve(const char *endpoint, int cpu, size_t size);
int cz_sink_serve(const char *endpoint, const char *ack_endpoint, int cpu, size_t size);

#endif

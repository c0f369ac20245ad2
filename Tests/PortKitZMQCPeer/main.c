// A peer on plain libzmq, written only from protocol.md section 10 ("ZeroMQ mapping"), with no
// PortKit code: the proof that a program outside PortKit can talk to a PortKit port.
//
//   PortKitZMQCPeer request ENDPOINT TEXT   bind a PULL for the reply, send msgid 7 with TEXT
//                                           and a reply port (port id 42) to the PortKit port
//                                           at ENDPOINT, print "reply MSGID PORTID TEXT"
//   PortKitZMQCPeer serve                   bind a PULL on tcp://127.0.0.1:*, print
//                                           "ready ENDPOINT", take one message, answer it on
//                                           its reply port (msgid + 1, the text upper-cased),
//                                           print "served MSGID TEXT"
//
// Without the trait it is an empty program that says so.

#include <stdio.h>

#ifdef PORTKIT_ZEROMQ
#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#define HEADER_SIZE 24
#define FLAG_REPLY_PORT 1
#define TYPE_DATA 1
#define TYPE_PORT 2

static void put_u16(uint8_t *p, uint16_t v) { p[0] = v & 0xFF; p[1] = v >> 8; }
static void put_u32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (v >> (8 * i)) & 0xFF; }
static void put_u64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (v >> (8 * i)) & 0xFF; }
static uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get_u32(const uint8_t *p) { uint32_t v = 0; for (int i = 3; i >= 0; i--) v = v << 8 | p[i]; return v; }
static uint64_t get_u64(const uint8_t *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }

static int fail(const char *what) {
    fprintf(stderr, "PortKitZMQCPeer: %s: %s\n", what, zmq_strerror(zmq_errno()));
    return 2;
}

static int send_frame(void *socket, const void *bytes, size_t size, int more) {
    return zmq_send(socket, bytes, size, more ? ZMQ_SNDMORE : 0) < 0 ? -1 : 0;
}

/// Sends one port message: header, one data component, and (if reply_endpoint) a reply frame.
static int send_message(void *socket, uint32_t msgid, uint64_t to_port, const char *text,
                        const char *reply_endpoint, uint64_t reply_port) {
    uint8_t header[HEADER_SIZE] = {'P', 'K', 'Z', 'M'};
    put_u16(header + 4, 1);
    put_u16(header + 6, reply_endpoint ? FLAG_REPLY_PORT : 0);
    put_u32(header + 8, msgid);
    put_u16(header + 12, 1);
    put_u16(header + 14, 0);
    put_u64(header + 16, to_port);
    size_t length = strlen(text);
    uint8_t *data = malloc(1 + length);
    data[0] = TYPE_DATA;
    memcpy(data + 1, text, length);
    int rc = send_frame(socket, header, sizeof header, 1);
    if (rc == 0) rc = send_frame(socket, data, 1 + length, reply_endpoint != NULL);
    free(data);
    if (rc == 0 && reply_endpoint) {
        size_t size = 9 + strlen(reply_endpoint);
        uint8_t *frame = malloc(size);
        frame[0] = TYPE_PORT;
        put_u64(frame + 1, reply_port);
        memcpy(frame + 9, reply_endpoint, strlen(reply_endpoint));
        rc = send_frame(socket, frame, size, 0);
        free(frame);
    }
    return rc;
}

/// A received port message, checked against protocol.md 10.3 (only what this peer needs).
struct message {
    uint32_t msgid;
    uint64_t port_id;
    char text[4096];
    int has_reply;
    char reply_endpoint[256];
    uint64_t reply_port;
};

static int receive_message(void *socket, struct message *out, int timeout_ms) {
    zmq_pollitem_t item = {socket, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, timeout_ms) <= 0) { fprintf(stderr, "PortKitZMQCPeer: no message in time\n"); return -1; }
    memset(out, 0, sizeof *out);
    uint8_t buffer[8192];
    int frames = 0, count = 0, flags = 0, more = 1;
    while (more) {
        int size = zmq_recv(socket, buffer, sizeof buffer, 0);
        if (size < 0 || size > (int)sizeof buffer) { fprintf(stderr, "PortKitZMQCPeer: bad frame\n"); return -1; }
        int value = 0; size_t value_size = sizeof value;
        zmq_getsockopt(socket, ZMQ_RCVMORE, &value, &value_size);
        more = value;
        if (frames == 0) {
            if (size != HEADER_SIZE || memcmp(buffer, "PKZM", 4) != 0 || get_u16(buffer + 4) != 1) {
                fprintf(stderr, "PortKitZMQCPeer: not a PortKit header\n");
                return -1;
            }
            flags = get_u16(buffer + 6);
            out->msgid = get_u32(buffer + 8);
            count = get_u16(buffer + 12);
            out->port_id = get_u64(buffer + 16);
        } else if (frames <= count) {
            if (size >= 1 && buffer[0] == TYPE_DATA) {
                size_t used = strlen(out->text);
                size_t take = (size_t)size - 1 < sizeof out->text - 1 - used ? (size_t)size - 1 : sizeof out->text - 1 - used;
                memcpy(out->text + used, buffer + 1, take);
            }
        } else if ((flags & FLAG_REPLY_PORT) && size > 9 && size - 9 < 256 && buffer[0] == TYPE_PORT) {
            out->has_reply = 1;
            out->reply_port = get_u64(buffer + 1);
            memcpy(out->reply_endpoint, buffer + 9, (size_t)size - 9);
        }
        frames++;
    }
    if (frames != 1 + count + ((flags & FLAG_REPLY_PORT) ? 1 : 0)) {
        fprintf(stderr, "PortKitZMQCPeer: %d frames, the header announced %d\n", frames, 1 + count);
        return -1;
    }
    return 0;
}

static void *bound_pull(void *context, char *endpoint, size_t size) {
    void *socket = zmq_socket(context, ZMQ_PULL);
    if (!socket || zmq_bind(socket, "tcp://127.0.0.1:*") != 0) return NULL;
    zmq_getsockopt(socket, ZMQ_LAST_ENDPOINT, endpoint, &size);
    return socket;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    void *context = zmq_ctx_new();
    int zero = 0;
    if (argc == 4 && strcmp(argv[1], "request") == 0) {
        char me[256] = {0};
        void *replies = bound_pull(context, me, sizeof me);
        if (!replies) return fail("bind the reply socket");
        void *port = zmq_socket(context, ZMQ_PUSH);
        zmq_setsockopt(port, ZMQ_LINGER, &zero, sizeof zero);
        zmq_setsockopt(replies, ZMQ_LINGER, &zero, sizeof zero);
        if (zmq_connect(port, argv[2]) != 0) return fail("connect");
        if (send_message(port, 7, 0, argv[3], me, 42) != 0) return fail("send");
        struct message reply;
        if (receive_message(replies, &reply, 10000) != 0) return 3;
        printf("reply %u %llu %s\n", reply.msgid, (unsigned long long)reply.port_id, reply.text);
        zmq_close(port);
        zmq_close(replies);
        zmq_ctx_term(context);
        return 0;
    }
    if (argc == 2 && strcmp(argv[1], "serve") == 0) {
        char me[256] = {0};
        void *inbox = bound_pull(context, me, sizeof me);
        if (!inbox) return fail("bind");
        zmq_setsockopt(inbox, ZMQ_LINGER, &zero, sizeof zero);
        printf("ready %s\n", me);
        struct message request;
        if (receive_message(inbox, &request, 20000) != 0) return 3;
        if (!request.has_reply) { fprintf(stderr, "PortKitZMQCPeer: the request has no reply port\n"); return 3; }
        for (char *c = request.text; *c; c++) *c = (char)toupper((unsigned char)*c);
        void *out = zmq_socket(context, ZMQ_PUSH);
        int linger = 5000;
        zmq_setsockopt(out, ZMQ_LINGER, &linger, sizeof linger);
        if (zmq_connect(out, request.reply_endpoint) != 0) return fail("connect to the reply port");
        if (send_message(out, request.msgid + 1, request.reply_port, request.text, NULL, 0) != 0) return fail("send the reply");
        printf("served %u %s\n", request.msgid, request.text);
        zmq_close(out);  // lingers until the reply is out
        zmq_close(inbox);
        zmq_ctx_term(context);
        return 0;
    }
    fprintf(stderr, "usage: PortKitZMQCPeer request ENDPOINT TEXT | serve\n");
    return 1;
}
#else
int main(void) {
    fprintf(stderr, "PortKitZMQCPeer: built without the ZeroMQ trait\n");
    return 1;
}
#endif

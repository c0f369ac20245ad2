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
#define VERSION 2
#define DATA_PREFIX 5    /* type, u32 length */
#define PORT_PREFIX 11   /* type, u64 port id, u16 endpoint length */
#define FLAG_REPLY_PORT 1
#define FLAG_FOLLOWED 2  /* another message follows in the same frame (a batch) */
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

/// Sends one port message, one frame (protocol.md 10.2): the header, one data component, and
/// (if reply_endpoint) the reply port.
static int send_message(void *socket, uint32_t msgid, uint64_t to_port, const char *text,
                        const char *reply_endpoint, uint64_t reply_port) {
    size_t length = strlen(text);
    size_t reply_length = reply_endpoint ? strlen(reply_endpoint) : 0;
    size_t size = HEADER_SIZE + DATA_PREFIX + length + (reply_endpoint ? PORT_PREFIX + reply_length : 0);
    if (reply_length > 255) return -1;  /* the wire carries at most 255 bytes (protocol.md 10.2) */
    uint8_t *frame = calloc(1, size);
    if (!frame) return -1;
    memcpy(frame, "PKZM", 4);
    put_u16(frame + 4, VERSION);
    put_u16(frame + 6, reply_endpoint ? FLAG_REPLY_PORT : 0);
    put_u32(frame + 8, msgid);
    put_u16(frame + 12, 1);
    put_u16(frame + 14, 0);
    put_u64(frame + 16, to_port);
    uint8_t *p = frame + HEADER_SIZE;
    p[0] = TYPE_DATA;
    put_u32(p + 1, (uint32_t)length);
    memcpy(p + DATA_PREFIX, text, length);
    p += DATA_PREFIX + length;
    if (reply_endpoint) {
        p[0] = TYPE_PORT;
        put_u64(p + 1, reply_port);
        put_u16(p + 9, (uint16_t)reply_length);
        memcpy(p + PORT_PREFIX, reply_endpoint, reply_length);
    }
    int rc = zmq_send(socket, frame, size, 0) < 0 ? -1 : 0;
    free(frame);
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

static int bad(const char *why) {
    fprintf(stderr, "PortKitZMQCPeer: %s\n", why);
    return -1;
}

/// Reads the next message: the next one of the batch last received, or the first of a new frame.
static int receive_message(void *socket, struct message *out, int timeout_ms) {
    static uint8_t frame[65536];
    static size_t frame_size = 0, start = 0;  /* the frame held, and where its next message starts */
    memset(out, 0, sizeof *out);
    if (start >= frame_size) {
        zmq_pollitem_t item = {socket, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&item, 1, timeout_ms) <= 0) return bad("no message in time");
        int size = zmq_recv(socket, frame, sizeof frame, 0);
        if (size < 0 || size > (int)sizeof frame) return bad("bad frame");
        int more = 0; size_t more_size = sizeof more;
        zmq_getsockopt(socket, ZMQ_RCVMORE, &more, &more_size);
        if (more) return bad("a message of more than one frame");
        frame_size = (size_t)size;
        start = 0;
    }
    const uint8_t *buffer = frame + start;
    size_t size = frame_size - start;
    start = frame_size;  /* a broken message drops the rest of its frame */
    if (size < HEADER_SIZE || memcmp(buffer, "PKZM", 4) != 0 || get_u16(buffer + 4) != VERSION) return bad("not a PortKit header");
    int flags = get_u16(buffer + 6);
    if (flags & ~(FLAG_REPLY_PORT | FLAG_FOLLOWED)) return bad("unknown header flags");
    out->msgid = get_u32(buffer + 8);
    int count = get_u16(buffer + 12);
    out->port_id = get_u64(buffer + 16);
    size_t offset = HEADER_SIZE;
    for (int i = 0; i < count + ((flags & FLAG_REPLY_PORT) ? 1 : 0); i++) {
        int is_reply = i == count;
        if (offset >= size) return bad("the message ends early");
        if (buffer[offset] == TYPE_DATA && !is_reply) {
            if (size - offset < DATA_PREFIX) return bad("a cut data component");
            uint32_t length = get_u32(buffer + offset + 1);
            offset += DATA_PREFIX;
            if (length > size - offset) return bad("a data component longer than the message");
            size_t used = strlen(out->text);
            size_t take = length < sizeof out->text - 1 - used ? length : sizeof out->text - 1 - used;
            memcpy(out->text + used, buffer + offset, take);
            offset += length;
        } else if (buffer[offset] == TYPE_PORT) {
            if (size - offset < PORT_PREFIX) return bad("a cut port component");
            uint64_t id = get_u64(buffer + offset + 1);
            uint16_t length = get_u16(buffer + offset + 9);
            offset += PORT_PREFIX;
            if (length == 0 || length > 255 || length > size - offset) return bad("a bad endpoint length");
            if (is_reply) {
                out->has_reply = 1;
                out->reply_port = id;
                memcpy(out->reply_endpoint, buffer + offset, length);
            }
            offset += length;
        } else {
            return bad("an unknown component type");
        }
    }
    if (flags & FLAG_FOLLOWED) {
        if (offset == size) return bad("the frame ends where a FOLLOWED message announces another");
        start = frame_size - size + offset;  /* the next message of the batch */
    } else if (offset != size) {
        return bad("bytes after the last component");
    }
    return 0;
}

static void *bound_pull(void *context, char *endpoint, size_t size) {
    void *socket = zmq_socket(context, ZMQ_PULL);
    if (!socket) return NULL;
    if (zmq_bind(socket, "tcp://127.0.0.1:*") != 0 || zmq_getsockopt(socket, ZMQ_LAST_ENDPOINT, endpoint, &size) != 0) {
        zmq_close(socket);
        return NULL;
    }
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

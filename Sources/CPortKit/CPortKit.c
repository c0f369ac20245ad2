// The parts of the shim that need _GNU_SOURCE (set in the target's cSettings): gettid(2),
// accept4(2) and struct ucred.
#include "CPortKit.h"

pid_t pk_gettid(void) {
    static _Thread_local pid_t cached = 0;
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

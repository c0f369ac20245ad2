#include <stdio.h>
#ifdef PORTKIT_ZEROMQ
#include <zmq.h>
int main(void) { int a, b, c; zmq_version(&a, &b, &c); printf("%d.%d.%d\n", a, b, c); return 0; }
#else
int main(void) { fprintf(stderr, "built without the ZeroMQ trait\n"); return 1; }
#endif

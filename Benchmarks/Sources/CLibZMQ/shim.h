#if !__has_include(<zmq.h>)
#error "the libzmq baselines need libzmq's headers: apt-get install libzmq3-dev"
#endif
#include <zmq.h>

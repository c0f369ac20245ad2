#if ZeroMQ
import PortKitZeroMQ
print(pkzVersion())
#else
print("built without the ZeroMQ trait")
#endif
